"""Independent reference: a transformers forward of the same weights.

Captures, for each requested layer i, the OUTPUT of decoder layer i (hidden
states including the residual, before the final norm) - the quantity
speculators 0.3.0 stores - through forward hooks.

Kimi-K2.5 checkpoints (``model_type: kimi_k25``; transformers has no such model) are
referenced by their text model alone: a transformers ``DeepseekV3ForCausalLM`` built from
``text_config`` and loaded with the ``language_model.*`` weights, prefix stripped (the vision
tower and projector are not used by text-only prompts).
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

KIMI_TEXT_PREFIX = "language_model."


def load_reference_model(model_dir: str, dtype: str = "float32") -> Any:
    import torch
    from transformers import AutoModelForCausalLM

    config = _read_config(model_dir)
    if config.get("model_type") == "kimi_k25":
        return _load_kimi_text_model(model_dir, config, getattr(torch, dtype))
    model = AutoModelForCausalLM.from_pretrained(model_dir, torch_dtype=getattr(torch, dtype))
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


def reference_states(model: Any, token_ids: Sequence[int], layer_ids: Sequence[int]) -> list[Any]:
    import torch

    layers = decoder_layers(model)
    got: dict[int, Any] = {}
    handles = []
    for i in layer_ids:
        def hook(_mod: Any, _inp: Any, out: Any, i: int = i) -> None:
            got[i] = (out[0] if isinstance(out, tuple) else out)[0].detach().clone()

        handles.append(layers[i].register_forward_hook(hook))
    try:
        with torch.no_grad(), _llama_4_scaling(model):
            model(torch.tensor([list(token_ids)], dtype=torch.long))
    finally:
        for h in handles:
            h.remove()
    return [got[i] for i in layer_ids]
