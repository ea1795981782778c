"""Reference rows for vLLM's ``extract_hidden_states`` layer-id convention, from a transformers
forward of the same weights (:func:`.reference.load_reference_model`).

id i < N: the input of decoder layer i (id 0 is the embedding output); id N: the output of the
last decoder layer before the final norm (transformers' ``hidden_states[N]`` is after the norm,
so it is not used).  Returned as one tensor [T, len(ids), H] in the order of ``layer_ids``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from .reference import _llama_4_scaling, decoder_layers


def reference_rows(model: Any, token_ids: Sequence[int], layer_ids: Sequence[int]) -> Any:
    import torch

    layers = decoder_layers(model)
    n = len(layers)
    bad = [i for i in layer_ids if not 0 <= i <= n]
    if bad:
        raise ValueError(f"layer ids {bad} outside 0..{n}")
    got: dict[int, Any] = {}
    handles = []
    for i in layer_ids:
        if i < n:
            def pre_hook(_mod: Any, args: tuple, kwargs: dict, i: int = i) -> None:
                hidden = args[0] if args else kwargs["hidden_states"]
                got[i] = hidden[0].detach().clone()

            handles.append(layers[i].register_forward_pre_hook(pre_hook, with_kwargs=True))
        else:
            def hook(_mod: Any, _args: Any, out: Any, i: int = i) -> None:
                got[i] = (out[0] if isinstance(out, tuple) else out)[0].detach().clone()

            handles.append(layers[n - 1].register_forward_hook(hook))
    try:
        with torch.no_grad(), _llama_4_scaling(model):
            model(torch.tensor([list(token_ids)], dtype=torch.long))
    finally:
        for h in handles:
            h.remove()
    return torch.stack([got[i] for i in layer_ids], dim=1)
