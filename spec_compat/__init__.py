"""spec-compat: run stock ``speculators`` on newer vLLM releases.

``import spec_compat`` before speculators applies a version-keyed registry of
run-time patches (lazily, through post-import hooks); the ``vllm.general_plugins``
entry point applies the same registry inside vLLM's spawned processes.
``python -m spec_compat report`` tells what was done and why.

Importing this package never imports vllm, torch, transformers or speculators.
"""

from __future__ import annotations

import logging

from .core.versions import installed_versions
from .core.registry import REGISTRY, NotNeeded, PatchError, Record, Status, TargetChanged
from .core.switches import SwitchError

__version__ = "0.1.0"
__all__ = [
    "apply", "revert", "records", "installed_versions", "REGISTRY",
    "Record", "Status", "NotNeeded", "PatchError", "SwitchError", "TargetChanged", "__version__",
]

logging.getLogger("spec_compat").addHandler(logging.NullHandler())


def apply() -> list[Record]:
    """Apply the registry (idempotent): patches whose target is imported are
    installed now, the rest when their target is imported."""
    return REGISTRY.apply()


def revert() -> None:
    """Restore every patched target to its original and drop pending hooks."""
    REGISTRY.revert()


def records() -> list[Record]:
    """The current status of every decided patch."""
    return REGISTRY.records()


def _configure_log_level() -> None:
    from .core import switches

    level = switches.log_level()
    if level is not None:
        logger = logging.getLogger("spec_compat")
        logger.setLevel(level)
        if not any(not isinstance(h, logging.NullHandler) for h in logger.handlers):
            handler = logging.StreamHandler()
            handler.setFormatter(logging.Formatter("%(levelname)s %(name)s: %(message)s"))
            logger.addHandler(handler)


def _load_patches() -> None:
    from . import patches  # noqa: F401  (registers every patch)


def _apply_at_import() -> None:
    """Validate the switches now; load the patch classes and apply them when the first
    target module is imported (at once if one already is)."""
    import sys

    from .core import switches
    from .core.manifest import PATCH_IDS, TARGET_MODULES

    switches.disabled_ids(PATCH_IDS)
    switches.strict()
    if any(name in sys.modules for name in TARGET_MODULES):
        _load_patches()
        REGISTRY.apply(records=False)
    else:
        REGISTRY.declare_lazily(_load_patches, TARGET_MODULES)


_configure_log_level()
_apply_at_import()
