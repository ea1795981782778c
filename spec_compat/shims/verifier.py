"""T2 / O6 / O7: what the training side needs to know about its verifier.

* :func:`text_config` - the config a draft is sized from.  Multimodal wrappers
  (Kimi-K2.5: ``KimiK25Config``) nest the language model in ``text_config``;
  DeepSeek-V2/V3 configs (transformers' ``DeepseekV3Config``) set ``head_dim`` to
  the *rope* head size (64 on Kimi-K2.5), which a Llama-style draft layer would
  read as its attention head size (64 heads x 64 instead of 7168 / 64 = 112).
* :func:`find_prefixed` - weight names of a wrapper checkpoint
  (``language_model.model.embed_tokens.weight``) for the names a text-only loader
  asks for (``model.embed_tokens.weight``).
* :func:`aux_layer_ids_for_vllm` - the ``eagle_aux_hidden_state_layer_ids`` that
  make vLLM feed a draft exactly the features speculators extracted.
* :func:`rms_norm` - the verifier's final norm, applied to training targets.
"""

from __future__ import annotations

import copy
import json
import logging
from collections.abc import Iterable
from pathlib import Path
from typing import Any

log = logging.getLogger("spec_compat")

# config fields that mark a DeepSeek-V2/V3-style attention (MLA)
_MLA_FIELDS = ("qk_rope_head_dim", "qk_nope_head_dim", "kv_lora_rank")

#: checkpoint prefixes of multimodal wrappers, most specific first
WRAPPER_PREFIXES = ("language_model.", "model.language_model.")


def text_config(config: Any) -> Any:
    """The language-model config of ``config`` as a draft should read it.

    Returns ``config`` itself when there is nothing to adapt; otherwise a copy:
    the nested ``text_config`` (if the top level has no ``hidden_size``), with
    ``head_dim`` = ``hidden_size // num_attention_heads`` when the config's own
    ``head_dim`` is the MLA rope size.
    """
    out = config
    inner = getattr(config, "text_config", None)
    if inner is not None and getattr(config, "hidden_size", None) is None:
        out = inner
    if all(getattr(out, f, None) is not None for f in _MLA_FIELDS):
        heads = getattr(out, "num_attention_heads", None)
        hidden = getattr(out, "hidden_size", None)
        head_dim = getattr(out, "head_dim", None)
        if heads and hidden and head_dim == getattr(out, "qk_rope_head_dim") and hidden // heads != head_dim:
            out = copy.deepcopy(out)
            out.head_dim = hidden // heads
            log.info("spec_compat: MLA verifier config: draft head_dim %d (hidden %d / %d heads) "
                     "instead of the rope head size %d", out.head_dim, hidden, heads, head_dim)
    return out


def checkpoint_names(model_path: str | Path, patch_id: str) -> list[str]:
    """Tensor names of a local safetensors checkpoint (index file or single file); an index that
    is not JSON with a ``weight_map`` object raises ValueError naming ``patch_id``."""
    root = Path(model_path)
    index = root / "model.safetensors.index.json"
    if index.is_file():
        try:
            weight_map = json.loads(index.read_text())["weight_map"]
        except (ValueError, KeyError, TypeError) as exc:  # not JSON, no weight_map, not an object
            raise ValueError(f"spec_compat[{patch_id}]: cannot read the checkpoint index {index}: "
                             f"{type(exc).__name__}: {exc}") from exc
        if not isinstance(weight_map, dict):
            raise ValueError(f"spec_compat[{patch_id}]: the weight_map of the checkpoint index {index} is a "
                             f"{type(weight_map).__name__}, not an object")
        return list(weight_map)
    single = root / "model.safetensors"
    if single.is_file():
        from safetensors import safe_open

        with safe_open(str(single), framework="pt", device="cpu") as f:
            return list(f.keys())
    return []


def find_prefixed(names: Iterable[str], available: Iterable[str]) -> dict[str, str]:
    """For each requested name missing from ``available``, the wrapper-prefixed name
    present there (``{requested: stored}``); names with no match are left out."""
    have = set(available)
    found = {}
    for name in names:
        if name in have:
            continue
        for prefix in WRAPPER_PREFIXES:
            if prefix + name in have:
                found[name] = prefix + name
                break
    return found


def data_config_for(paths: Iterable[str | Path], levels: int = 3) -> dict[str, Any] | None:
    """speculators' ``data_config.json`` (written by its data-generation script next to
    the ``.pt`` files) for training files ``paths``: the nearest one above them."""
    seen: set[Path] = set()
    for p in paths:
        d = Path(p).resolve().parent
        for _ in range(levels):
            if d in seen:
                break
            seen.add(d)
            cfg = d / "data_config.json"
            if cfg.is_file():
                try:
                    return json.loads(cfg.read_text())
                except (OSError, ValueError) as exc:
                    log.warning("spec_compat: cannot read %s: %s", cfg, exc)
                    return None
            if d.parent == d:
                break
            d = d.parent
    return None


def captured_layer_ids(data_config: dict[str, Any]) -> list[int] | None:
    ids = (data_config.get("hidden_states") or {}).get("layer_ids")
    if isinstance(ids, list) and ids and all(isinstance(i, int) and not isinstance(i, bool) for i in ids):
        return ids
    return None


def aux_layer_ids_for_vllm(captured: list[int], patch_id: str) -> list[int]:
    """speculators (0.3.0, 0.4.x) saves the OUTPUT of each listed layer; the last listed
    layer is the training target, the others are the draft's input features.  vLLM's
    EAGLE-3 path collects, for aux id ``i``, the hidden state entering layer ``i``
    (``hidden_states + residual`` before layer ``i`` runs) - the output of layer ``i - 1``.
    So the draft must name ``l + 1`` for each captured feature layer ``l``."""
    if len(captured) < 2:
        raise ValueError(f"spec_compat[{patch_id}]: need feature layers and a target layer, got {captured}")
    return [i + 1 for i in captured[:-1]]


def rms_norm(x: Any, weight: Any, eps: float) -> Any:
    """The Llama/DeepSeek RMSNorm: fp32 statistics, result in the input's dtype, times weight."""
    import torch

    dtype = x.dtype
    h = x.to(torch.float32)
    h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)
    return weight.to(device=x.device) * h.to(dtype)
