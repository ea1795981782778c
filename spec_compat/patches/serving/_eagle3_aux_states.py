"""Shared by ``eagle3-deepseek-aux-states`` and ``eagle3-kimi-k25-aux-states`` (failure S1 in
docs/failures.md): the ``SupportsEagle3`` capability (aux hidden states out of the decoder loop)
given to a model class whose decoder loop has none, and the collector of those states.

EAGLE-3 auxiliary hidden states for vLLM models that do not collect them (S1).

vLLM's convention (Llama's decoder loop): aux layer id ``i`` is the residual
stream entering decoder layer ``i``, i.e. ``hidden_states + residual`` as the
layer receives them.  :class:`AuxStateCollector` gets exactly that from forward
pre-hooks on the chosen layers, so the model's own forward is untouched; the
model's ``forward`` wrapper then returns ``(hidden_states, [aux...])`` as
vLLM's runner expects from a ``SupportsEagle3`` model.

Layer 0 is accepted here (its stream is the embedding output); ids outside
``[0, num_layers)`` are refused with a clear error instead of silently yielding
fewer states than the draft's ``fc`` expects.

The hooks run in Python on every forward: eager execution (``enforce_eager``)
is what this is tested with.
"""

from __future__ import annotations

import inspect
from collections.abc import Sequence
from typing import Any

from ...core.registry import Changes, TargetChanged
from .. import _guards as guard

VLLM_S1 = ">=0.15,<0.18"


def default_aux_layers(num_layers: int, patch_id: str) -> tuple[int, ...]:
    """vLLM's default ``(2, n // 2, n - 3)`` where it gives three distinct ids
    (``n >= 7``); below that, three distinct ids spread over ``1 .. n-1``.
    Layer 0 is never a default (vLLM's own decoder loops fail on it)."""
    if num_layers >= 7:
        return (2, num_layers // 2, num_layers - 3)
    if num_layers >= 4:
        return (1, num_layers // 2, num_layers - 1)
    raise ValueError(f"spec_compat[{patch_id}]: EAGLE-3 needs three distinct aux layers; the target has only "
                     f"{num_layers} decoder layers")


class AuxStateCollector:
    """Forward pre-hooks on ``stack.layers[i]`` for each requested id."""

    def __init__(self, stack: Any, layers: Sequence[int], patch_id: str) -> None:
        self.patch_id = patch_id
        self.layers = tuple(int(i) for i in layers)
        n = len(stack.layers)
        bad = [i for i in self.layers if not 0 <= i < n]
        if bad:
            raise ValueError(f"spec_compat[{patch_id}]: aux hidden state layer ids {bad} are outside the "
                             f"target's {n} decoder layers")
        if len(set(self.layers)) != len(self.layers):
            raise ValueError(f"spec_compat[{patch_id}]: aux hidden state layer ids {list(self.layers)} repeat "
                             "an id (each feature would be the same layer twice)")
        start = getattr(stack, "start_layer", 0)
        end = getattr(stack, "end_layer", n)
        self.local = tuple(i for i in self.layers if start <= i < end)
        self._states: dict[int, Any] = {}
        self._handles = [stack.layers[i].register_forward_pre_hook(self._hook(i), with_kwargs=True)
                         for i in self.local]

    def _hook(self, i: int) -> Any:
        def pre_hook(module: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
            bound = _bind(module, args, kwargs)
            hidden = bound.get("hidden_states")
            if hidden is None:
                raise RuntimeError(f"spec_compat[{self.patch_id}]: layer {i} was called without hidden_states")
            residual = bound.get("residual")
            self._states[i] = hidden.clone() if residual is None else hidden + residual

        return pre_hook

    def start(self) -> None:
        self._states.clear()

    def collect(self) -> list[Any]:
        missing = [i for i in self.local if i not in self._states]
        if missing:
            raise RuntimeError(f"spec_compat[{self.patch_id}]: decoder layers {missing} did not run in this forward")
        states = [self._states.pop(i) for i in self.local]
        return states

    def remove(self) -> None:
        for h in self._handles:
            h.remove()
        self._handles = []


_SIGS: dict[type, inspect.Signature] = {}


def _bind(module: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> dict[str, Any]:
    sig = _SIGS.get(type(module))
    if sig is None:
        sig = _SIGS[type(module)] = inspect.signature(type(module).forward)
    return dict(sig.bind(module, *args, **kwargs).arguments)


def _eagle3_methods(patch_id: str, find_stack: Any) -> dict[str, Any]:
    """``SupportsEagle3`` members for a model class whose decoder loop has no aux states."""

    def set_aux_hidden_state_layers(self: Any, layers: tuple[int, ...]) -> None:
        old = self.__dict__.pop("_spec_compat_aux", None)
        if old is not None:
            old.remove()
        self.__dict__["_spec_compat_aux"] = AuxStateCollector(find_stack(self, patch_id), layers, patch_id)

    def get_eagle3_aux_hidden_state_layers(self: Any) -> tuple[int, ...]:
        return default_aux_layers(len(find_stack(self, patch_id).layers), patch_id)

    # every member of vLLM's runtime-checkable SupportsEagle3 protocol (SupportsEagleBase's flags too:
    # isinstance() looks for each of them)
    return {"supports_eagle3": True,
            "has_own_lm_head": False,
            "has_own_embed_tokens": False,
            "set_aux_hidden_state_layers": set_aux_hidden_state_layers,
            "get_eagle3_aux_hidden_state_layers": get_eagle3_aux_hidden_state_layers}


def _install_eagle3(cls: Any, patch_id: str, changes: Changes) -> None:
    from ...shims.decoder import find_decoder_stack

    for name, value in _eagle3_methods(patch_id, find_decoder_stack).items():
        if name.startswith("has_own_") and hasattr(cls, name):
            continue  # the model's own answer stands
        changes.setattr(cls, name, value)  # new members: nothing to wrap
    # a wrapt wrapper keeps forward's signature, which vLLM reads (is_vllm_model: input_ids, positions)
    changes.wrap(cls, "forward", _forward_with_aux)


def _forward_with_aux(wrapped: Any, model: Any, args: tuple, kwargs: dict) -> Any:
    collector = model.__dict__.get("_spec_compat_aux")
    if collector is None:
        return wrapped(*args, **kwargs)
    collector.start()
    out = wrapped(*args, **kwargs)
    if not hasattr(out, "shape"):  # IntermediateTensors of a non-last pipeline rank, or already a tuple
        return out
    return out, collector.collect()


def _check_not_eagle3(cls: Any, where: str) -> None:
    if getattr(cls, "supports_eagle3", False) or hasattr(cls, "set_aux_hidden_state_layers"):
        raise TargetChanged(f"{where} already declares SupportsEagle3")
    guard.has_params(cls.forward, f"{where}.forward", "input_ids", "positions")
