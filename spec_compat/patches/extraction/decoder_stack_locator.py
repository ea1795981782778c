"""decoder-stack-locator: speculators' ``_setup_hidden_states_capture`` replaced by one that finds
the decoder stack under any wrapper (K2); the first of the four capture patches stacked on that
method (see :mod:`._worker`).
"""

from __future__ import annotations

import logging
import types
from collections.abc import Callable
from types import ModuleType
from typing import Any

from ...core.proof import Proof, SELFTEST
from ...core.registry import Changes, Patch, register
from .. import _guards as guard
from ..ranges import SPEC_03, SPEC_04
from ._worker import CUSTOM_WORKER

log = logging.getLogger("spec_compat")


@register
class DecoderStackLocator(Patch):
    """speculators 0.3.0 (custom_worker:102-107) requires SupportsEagle3 and takes
    ``model.model``; 0.4.x takes ``get_language_model().model``.  Kimi-K2.5 and
    DeepSeek-V3 declare no SupportsEagle3 before vLLM 0.18, and Kimi's stack is
    ``language_model.layers`` on vLLM 0.15 -> 'does not support' / AttributeError."""

    id = "decoder-stack-locator"
    proof = Proof("fails", SELFTEST, r"ValueError: Model KimiK25ForConditionalGeneration does not support hidden state extraction", also_off=("eagle3-kimi-k25-aux-states",), using="kimi-k25 short")
    summary = "capture set up on the decoder stack of any wrapper (get_language_model, then .model if it holds .layers)"
    upstream = "speculators 0.3.0 custom_worker:102 supports_eagle3 gate + model.model; 0.4.x get_language_model().model"
    fixes = ("K2",)
    target = f"{CUSTOM_WORKER}:HiddenStatesWorkerExtension"
    requires = ({"speculators": SPEC_03}, {"speculators": SPEC_04, "vllm": "<0.16"})
    side = "worker"

    def check(self, module: ModuleType) -> None:
        guard.has_attrs(guard.attr(module, "HiddenStatesWorkerExtension"), "HiddenStatesWorkerExtension",
                        "_setup_hidden_states_capture", "_store_captured_states")
        guard.has_params(guard.attr(module, "_patched_forward"), "custom_worker._patched_forward", "self", "input_ids")

    def install(self, module: ModuleType, changes: Changes) -> None:
        changes.setattr(module.HiddenStatesWorkerExtension, "_setup_hidden_states_capture",
                        locating_setup(module, self.id))


def locating_setup(module: types.ModuleType, patch_id: str) -> Callable[[Any, list[int]], None]:
    """``_setup_hidden_states_capture`` that finds the decoder stack under any wrapper and binds
    ``module._patched_forward`` (looked up at call time: a patched one is used) onto it."""
    from ...shims.decoder import find_decoder_stack

    def _setup_hidden_states_capture(self: Any, layer_ids: list[int]) -> None:
        self._layer_ids = frozenset(layer_ids)
        self._captured_states = None
        stack = find_decoder_stack(self.model_runner.model, patch_id)
        stack._extension = self
        stack.forward = types.MethodType(module._patched_forward, stack)
        log.info("spec_compat: capture set up on %s for layers %s", type(stack).__name__, sorted(layer_ids))

    return _setup_hidden_states_capture
