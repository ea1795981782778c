"""spec-compat: run stock ``speculators`` on newer vLLM releases.

``import spec_compat`` before speculators applies a version-keyed registry of
run-time patches (lazily, through post-import hooks); the ``vllm.general_plugins``
entry point applies the same registry inside vLLM's spawned processes.
``python -m spec_compat report`` tells what was done and why.

Importing this package never imports vllm, torch, transformers or speculators.
"""

from __future__ import annotations

import logging

from . import patches as _patches  # noqa: F401  (registers every patch)
from ._versions import installed_versions
from .registry import REGISTRY, NotNeeded, PatchError, Record, Status, TargetChanged
from .switches import SwitchError

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
    import os

    level = os.environ.get("SPEC_COMPAT_LOG")
    if level:
        logger = logging.getLogger("spec_compat")
        logger.setLevel(level.upper())
        if not any(not isinstance(h, logging.NullHandler) for h in logger.handlers):
            handler = logging.StreamHandler()
            handler.setFormatter(logging.Formatter("%(levelname)s %(name)s: %(message)s"))
            logger.addHandler(handler)


_configure_log_level()
REGISTRY.apply(records=False)
