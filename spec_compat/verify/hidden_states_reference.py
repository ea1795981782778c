"""Reference rows for vLLM's ``extract_hidden_states`` layer-id convention, from a transformers
forward of the same weights (:func:`.reference.load_reference_model`).

id i < N: the input of decoder layer i (id 0 is the embedding output); id N: the output of the
last decoder layer before the final norm (transformers' ``hidden_states[N]`` is after the norm,
so it is not used).  Returned as one tensor [T, len(ids), H] in the order of ``layer_ids``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from .reference import decoder_layers, layer_states


def reference_rows(model: Any, token_ids: Sequence[int], layer_ids: Sequence[int]) -> Any:
    import torch

    n = len(decoder_layers(model))
    bad = [i for i in layer_ids if not 0 <= i <= n]
    if bad:
        raise ValueError(f"layer ids {bad} outside 0..{n}")
    taps = [(i, "input") if i < n else (n - 1, "output") for i in layer_ids]
    return torch.stack(layer_states(model, token_ids, taps), dim=1)
