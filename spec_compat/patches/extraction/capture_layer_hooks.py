"""capture-layer-hooks: capture through forward hooks on the chosen layers, the model's own forward
back in place (K3); wraps ``_setup_hidden_states_capture`` after decoder-stack-locator (see
:mod:`._worker`).
"""

from __future__ import annotations

from collections.abc import Callable
from types import ModuleType
from typing import Any

from ...core.proof import Proof, SELFTEST
from ...core.registry import Changes, Patch, register
from .. import _guards as guard
from ._worker import CUSTOM_WORKER


@register
class CaptureLayerHooks(Patch):
    """speculators replaces the base model's ``forward`` (custom_worker:17) and calls
    each layer by keyword: since vLLM 0.12 DeepSeek layers take ``llama_4_scaling``,
    computed in the model's own forward, and the replacement silently drops it.
    Forward hooks on the chosen layers keep the model's forward intact."""

    id = "capture-layer-hooks"
    after = ("decoder-stack-locator",)
    proof = Proof("wrong-values", SELFTEST, r"FAIL many-blocks: sequence \d+ layer \d+: max\|diff\|=\S+ > tolerance", using="kimi-k25+--llama-4-scaling many-blocks")
    summary = "capture through forward hooks on the chosen layers; the model's own forward stays in place"
    upstream = "vLLM 0.12 deepseek_v2.py layer(positions, hidden, residual, llama_4_scaling); custom_worker:44 drops it"
    fixes = ("K3",)
    target = f"{CUSTOM_WORKER}:HiddenStatesWorkerExtension"
    requires = {"speculators": ">=0.3,<0.5", "vllm": ">=0.12"}
    supersedes = ("worker-forward-embed-input-ids",)
    side = "worker"

    def check(self, module: ModuleType) -> None:
        guard.has_attrs(guard.attr(module, "HiddenStatesWorkerExtension"), "HiddenStatesWorkerExtension",
                        "_setup_hidden_states_capture", "_store_captured_states")

    def install(self, module: ModuleType, changes: Changes) -> None:
        ext = module.HiddenStatesWorkerExtension
        changes.setattr(ext, "_setup_hidden_states_capture", layer_hooks_setup(ext._setup_hidden_states_capture, self.id))


def layer_hooks_setup(inner: Callable[..., Any], patch_id: str) -> Callable[[Any, list[int]], Any]:
    """``inner`` (the setup that binds the capture forward), then the model's own forward back in
    place and forward hooks on the chosen layers (on the first tensor-parallel rank only)."""
    from ...shims.decoder import hook_layers

    def _setup_hidden_states_capture(self: Any, layer_ids: list[int]) -> Any:
        from vllm.distributed import get_tp_group

        out = inner(self, layer_ids)
        stacks = [m for m in self.model_runner.model.modules() if m.__dict__.get("_extension") is self]
        if len(stacks) != 1:
            raise RuntimeError(f"spec_compat[{patch_id}]: expected one capture target, found {len(stacks)}")
        stack = stacks[0]
        stack.__dict__.pop("forward", None)  # the model's own forward again
        for handle in getattr(self, "_spec_compat_hooks", ()):
            handle.remove()
        self._spec_compat_hooks = hook_layers(self, stack, layer_ids) if get_tp_group().rank_in_group == 0 else []
        return out

    return _setup_hidden_states_capture
