"""Independent reference: a transformers forward of the same weights.

Captures, for each requested layer i, the OUTPUT of decoder layer i (hidden
states including the residual, before the final norm) - the quantity
speculators 0.3.0 stores - through forward hooks.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any


def load_reference_model(model_dir: str, dtype: str = "float32") -> Any:
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir, torch_dtype=getattr(torch, dtype))
    model.eval()
    return model


def decoder_layers(model: Any) -> Any:
    inner = model.get_decoder() if hasattr(model, "get_decoder") else model.model
    return inner.layers


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
        with torch.no_grad():
            model(torch.tensor([list(token_ids)], dtype=torch.long))
    finally:
        for h in handles:
            h.remove()
    return [got[i] for i in layer_ids]
