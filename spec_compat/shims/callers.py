"""Who is calling: the first frame outside transformers, wrapt, spec_compat and functools."""

from __future__ import annotations

import sys
from types import ModuleType

_TRAINING_MODULES = ("speculators.models.", "speculators.train.")
_PASSED_THROUGH = ("transformers", "wrapt", "spec_compat", "functools")


def caller_is_speculators(depth: int = 2) -> bool:
    """Whether the code calling AutoConfig is speculators' training side: a module of
    ``speculators.models`` / ``speculators.train``, or a script built on speculators
    (its stock ``scripts/train.py``, ``scripts/build_vocab_mapping.py``).  ``depth``: the
    frame to start from, counted from this function's own (2: its caller's caller)."""
    frame = sys._getframe(depth)
    while frame is not None:
        name = str(frame.f_globals.get("__name__", ""))
        if not (name.startswith(_PASSED_THROUGH)):
            break
        frame = frame.f_back
    if frame is None:
        return False
    name = str(frame.f_globals.get("__name__", ""))
    if name.startswith(_TRAINING_MODULES):
        return True
    if name.startswith("speculators"):
        return False  # e.g. data generation: it passes trust_remote_code itself
    for value in list(frame.f_globals.values()):
        mod = value.__name__ if isinstance(value, ModuleType) else getattr(value, "__module__", None)
        if isinstance(mod, str) and (mod == "speculators" or mod.startswith("speculators.")):
            return True
    return False
