"""Independent reference: a transformers forward of the same weights.

Captures, for each requested layer i, the OUTPUT of decoder layer i (hidden
states including the residual, before the final norm) - the quantity
speculators 0.3.0 stores - through forward hooks.

Kimi-K2.5 checkpoints (``model_type: kimi_k25``; transformers has no such model) are
referenced by their text model alone: a transformers ``DeepseekV3ForCausalLM`` built from
``text_config`` and loaded with the ``language_model.*`` weights, prefix stripped (the vision
tower and projector are not used by text-only prompts).  transformers 5 keeps a MoE layer's
experts as fused tensors (``experts.gate_up_proj`` / ``experts.down_proj``), which only its
``from_pretrained`` converts from per-expert checkpoints: there the text weights and
``text_config`` are written to a scratch checkpoint and loaded through ``from_pretrained``.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

KIMI_TEXT_PREFIX = "language_model."


def load_reference_model(model_dir: str | Path, dtype: str = "float32") -> Any:
    import torch
    from transformers import AutoModelForCausalLM

    config = _read_config(model_dir)
    if config.get("model_type") == "kimi_k25":
        if _transformers_major() >= 5:
            return _load_kimi_text_model_tf5(model_dir, config, getattr(torch, dtype))
        return _load_kimi_text_model(model_dir, config, getattr(torch, dtype))
    model = AutoModelForCausalLM.from_pretrained(str(model_dir), torch_dtype=getattr(torch, dtype))
    model.eval()
    return model


def _read_config(model_dir: str) -> dict[str, Any]:
    path = Path(model_dir) / "config.json"
    return json.loads(path.read_text()) if path.is_file() else {}


def _safetensors_files(model_dir: str) -> list[Path]:
    root = Path(model_dir)
    index = root / "model.safetensors.index.json"
    if index.is_file():
        return [root / f for f in sorted(set(json.loads(index.read_text())["weight_map"].values()))]
    return sorted(root.glob("*.safetensors"))


def _load_kimi_text_model(model_dir: str, config: dict[str, Any], dtype: Any) -> Any:
    from safetensors.torch import load_file
    from transformers import DeepseekV3Config, DeepseekV3ForCausalLM

    text_config = DeepseekV3Config(**config["text_config"])
    text_config._attn_implementation = "eager"
    model = DeepseekV3ForCausalLM(text_config)
    state: dict[str, Any] = {}
    for path in _safetensors_files(model_dir):
        for name, tensor in load_file(str(path)).items():
            if name.startswith(KIMI_TEXT_PREFIX):
                state[name[len(KIMI_TEXT_PREFIX):]] = tensor
    missing, unexpected = model.load_state_dict(state, strict=False)
    if missing or unexpected:
        raise ValueError(f"{model_dir}: text weights do not match DeepseekV3ForCausalLM: "
                         f"missing {sorted(missing)[:5]}, unexpected {sorted(unexpected)[:5]}")
    model.to(dtype)
    model.eval()
    return model


def _transformers_major() -> int:
    from ..core.versions import installed_version, release_of

    return release_of(installed_version("transformers") or "0").major


def _load_kimi_text_model_tf5(model_dir: str | Path, config: dict[str, Any], dtype: Any) -> Any:
    """The text model as transformers 5 builds it: through ``from_pretrained`` of a scratch
    checkpoint; every tensor must be used."""
    import tempfile

    from safetensors.torch import load_file, save_file
    from transformers import DeepseekV3Config, DeepseekV3ForCausalLM

    state: dict[str, Any] = {}
    for path in sorted(Path(model_dir).glob("*.safetensors")):
        for name, tensor in load_file(str(path)).items():
            if name.startswith(KIMI_TEXT_PREFIX):
                state[name[len(KIMI_TEXT_PREFIX):]] = tensor.contiguous()
    with tempfile.TemporaryDirectory(prefix="kimi-text-") as tmp:
        DeepseekV3Config(**config["text_config"]).save_pretrained(tmp)
        save_file(state, str(Path(tmp) / "model.safetensors"))
        model, info = DeepseekV3ForCausalLM.from_pretrained(tmp, dtype=dtype, attn_implementation="eager",
                                                            output_loading_info=True)
    unused = {k: v for k, v in info.items() if v and k in ("missing_keys", "unexpected_keys", "mismatched_keys")}
    if unused:
        raise ValueError(f"{model_dir}: text weights do not load into transformers 5's DeepseekV3: {unused}")
    model.eval()
    return model


def decoder_layers(model: Any) -> Any:
    inner = model.get_decoder() if hasattr(model, "get_decoder") else model.model
    return inner.layers


@contextlib.contextmanager
def _llama_4_scaling(model: Any) -> Iterator[None]:
    """Apply ``text_config.llama_4_scaling`` in the reference, as vLLM's DeepSeek model does:
    every query row at position p is multiplied by 1 + beta * log(1 + floor(p / original_max)).
    transformers' DeepseekV3 ignores the field; for one full sequence without cache the
    positions are 0..len-1, so scaling the query inside the eager attention is exact."""
    cfg = getattr(model.config, "llama_4_scaling", None)
    if not cfg:
        yield
        return
    import torch
    from transformers.models.deepseek_v3 import modeling_deepseek_v3 as mod

    original = mod.eager_attention_forward

    def scaled(module: Any, query: Any, *args: Any, **kwargs: Any) -> Any:
        pos = torch.arange(query.shape[-2], dtype=torch.float32)
        factor = 1 + cfg["beta"] * torch.log(1 + torch.floor(pos / cfg["original_max_position_embeddings"]))
        return original(module, query * factor[:, None].to(query.dtype), *args, **kwargs)

    mod.eager_attention_forward = scaled
    try:
        yield
    finally:
        mod.eager_attention_forward = original


def layer_states(model: Any, token_ids: Sequence[int], taps: Sequence[tuple[int, str]]) -> list[Any]:
    """One forward of ``token_ids`` (no grad, ``llama_4_scaling`` applied); for each ``(i, where)``
    of ``taps`` the hidden states [T, H] of the sequence at decoder layer i, ``where`` "input" (what
    the layer is called with) or "output" (what it returns, residual included), in the order of ``taps``."""
    import torch

    layers = decoder_layers(model)
    got: dict[int, Any] = {}
    handles = []
    for j, (i, where) in enumerate(taps):
        if where == "input":
            def pre_hook(_mod: Any, args: tuple, kwargs: dict, j: int = j) -> None:
                hidden = args[0] if args else kwargs["hidden_states"]
                got[j] = hidden[0].detach().clone()

            handles.append(layers[i].register_forward_pre_hook(pre_hook, with_kwargs=True))
        elif where == "output":
            def hook(_mod: Any, _args: Any, out: Any, j: int = j) -> None:
                got[j] = (out[0] if isinstance(out, tuple) else out)[0].detach().clone()

            handles.append(layers[i].register_forward_hook(hook))
        else:
            raise ValueError(f"tap {where!r}: expected 'input' or 'output'")
    try:
        with torch.no_grad(), _llama_4_scaling(model):
            model(torch.tensor([list(token_ids)], dtype=torch.long))
    finally:
        for h in handles:
            h.remove()
    return [got[j] for j in range(len(taps))]


def reference_states(model: Any, token_ids: Sequence[int], layer_ids: Sequence[int]) -> list[Any]:
    """The output of decoder layer i for each i of ``layer_ids``."""
    return layer_states(model, token_ids, [(i, "output") for i in layer_ids])
