"""hs-connectors' accelerator streams on a machine without an accelerator (any vLLM).

hs-connectors 0.9.0 ``device.py`` ``accelerator_module`` returns the module of
``torch.accelerator.current_accelerator()`` - the accelerator torch was built for, available or
not - and the Mooncake connector creates its copy stream from it in ``register_kv_caches``: on a
CPU machine with a CUDA build of torch that dies in ``torch.cuda.Stream()`` (no driver), with a
CPU build in "No accelerator is available".  Here, when no accelerator is available, the module is
``torch.cpu``: its ``Stream``/``Event``/``stream`` have the same API, and CPU work is done when
the call returns, so an event recorded after the forward marks rows already written.
"""

from __future__ import annotations

from types import ModuleType
from typing import Any

from ...core.proof import Proof
from ...core.registry import Changes, NotNeeded, Patch, register
from .. import _guards as guard

DEVICE = "hs_connectors.device"
PROOF = "tests/server/test_mooncake.py::test_mooncake_streams_fail_with_only_this_patch_disabled"


def _accelerator_module(wrapped: Any, _instance: Any, args: tuple, kwargs: dict) -> Any:
    import torch

    if not torch.accelerator.is_available():
        return torch.cpu
    return wrapped(*args, **kwargs)


@register
class HostStreams(Patch):
    """hs-connectors 0.9.0 ``device.py`` ``accelerator_module`` returns torch's compiled-in accelerator even
    where none is available; on a CPU machine the Mooncake connector dies in ``register_kv_caches``
    creating its copy stream (with torch's CUDA build: a CUDA driver error)."""

    id = "hs-connectors-host-streams"
    proof = Proof("fails", PROOF, r"in register_kv_caches\n\s+self\._copy_stream = self\._device\(\)\.Stream\(\)\n")
    summary = ("hs-connectors' accelerator_module is torch.cpu where no accelerator is available (its "
               "Mooncake connector's copy stream and ready event; CPU work is complete on return)")
    upstream = ("hs-connectors 0.9.0 device.py accelerator_module: torch.accelerator.current_accelerator() "
                "without an availability check -> Mooncake connector fails in register_kv_caches on a CPU")
    target = f"{DEVICE}:accelerator_module"
    requires = {"hs-connectors": ">=0.9,<0.10"}
    side = "worker"

    def check(self, module: ModuleType) -> None:
        fn = guard.attr(module, "accelerator_module")
        source = guard.source(fn, f"{DEVICE}.accelerator_module")
        if "current_accelerator" not in source:
            raise NotNeeded("accelerator_module no longer asks torch.accelerator.current_accelerator")
        if "is_available" in source:
            raise NotNeeded("accelerator_module checks availability itself")

    def install(self, module: ModuleType, changes: Changes) -> None:
        changes.wrap(module, "accelerator_module", _accelerator_module)
