"""Finding and observing the decoder stack of any vLLM model (K2, K3).

* :func:`find_decoder_stack` - ``get_language_model()`` (multimodal wrappers such
  as KimiK25ForConditionalGeneration), then its ``.model`` only if that holds
  ``.layers``: Llama (``model.model``), Kimi on vLLM 0.15.x
  (``language_model.layers``) and on 0.16 (``language_model.model.layers``).
* :func:`hook_layers` - capture without replacing the model's ``forward``:
  forward hooks on the chosen layers read each layer's output ``(hidden,
  residual)`` and hand ``hidden + residual`` (speculators' quantity) to the
  extension once per forward.  The model's own forward keeps computing
  everything it computes (``llama_4_scaling``, extra layer kwargs, any future
  signature).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any


class DecoderStackNotFound(AttributeError):
    pass


def find_decoder_stack(model: Any, patch_id: str) -> Any:
    """The module holding ``.layers`` under ``model``; ``patch_id`` (the patch that asks) is
    named in the error when there is none."""
    lm = model.get_language_model() if callable(getattr(model, "get_language_model", None)) else model
    inner = getattr(lm, "model", None)
    if inner is not None and hasattr(inner, "layers"):
        return inner
    if hasattr(lm, "layers"):
        return lm
    raise DecoderStackNotFound(
        f"spec_compat[{patch_id}]: no decoder stack (a module with .layers) under "
        f"{type(model).__name__} -> {type(lm).__name__}"
    )


def layer_output_state(out: Any) -> Any:
    """``hidden + residual`` from a vLLM decoder layer's output."""
    if isinstance(out, tuple):
        hidden, residual = out[0], out[1] if len(out) > 1 else None
        return (hidden + residual) if residual is not None else hidden.clone()
    return out.clone()


def hook_layers(extension: Any, stack: Any, layer_ids: Iterable[int]) -> list[Any]:
    """Register capture hooks on ``stack.layers`` for ``layer_ids`` (this rank's share)."""
    start = getattr(stack, "start_layer", 0)
    end = getattr(stack, "end_layer", len(stack.layers))
    chosen = sorted({i for i in layer_ids if start <= i < end})
    if not chosen:
        return []
    first, last = chosen[0], chosen[-1]
    pending: list[Any] = []
    # a streaming store (patch capture-handoff-shm) takes each layer as it is computed:
    # no per-forward list of layer states (P5)
    open_writer = getattr(extension, "_spec_compat_layer_writer", None)
    writer: list[Any] = [None]

    def make_hook(i: int) -> Any:
        def hook(_module: Any, _args: Any, out: Any) -> None:
            if open_writer is not None:
                if i == first:
                    writer[0] = open_writer()  # None: no streaming store this forward
                if writer[0] is not None:
                    writer[0].add(layer_output_state(out))
                    if i == last:
                        w, writer[0] = writer[0], None
                        w.close()
                    return
            pending.append(layer_output_state(out))
            if i == last:
                states = list(pending)
                pending.clear()
                extension._store_captured_states(states)

        return hook

    return [stack.layers[i].register_forward_hook(make_hook(i)) for i in chosen]
