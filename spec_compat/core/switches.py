"""Environment switches.

``SPEC_COMPAT_DISABLE``  comma-separated patch ids, or ``*`` for every patch.
``SPEC_COMPAT_STRICT``   ``1``/``true``: a patch that ends ``target-changed`` or
                         ``failed`` raises at apply time.  ``0``/``false``/unset: off.
``SPEC_COMPAT_LOG``      log level of the ``spec_compat`` logger (e.g. ``DEBUG``).
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable, Mapping

DISABLE_VAR = "SPEC_COMPAT_DISABLE"
STRICT_VAR = "SPEC_COMPAT_STRICT"

_ID = re.compile(r"^[a-z0-9]+(?:-[a-z0-9]+)*$")
_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"", "0", "false", "no", "off"}


class SwitchError(ValueError):
    """A malformed value in one of the SPEC_COMPAT_* variables."""


def disabled_ids(known: Iterable[str], environ: Mapping[str, str] | None = None) -> frozenset[str]:
    env = os.environ if environ is None else environ
    raw = env.get(DISABLE_VAR, "")
    known = set(known)
    if not raw.strip():
        return frozenset()
    if raw.strip() == "*":
        return frozenset(known)
    items = [x.strip() for x in raw.split(",")]
    bad = [x for x in items if not x or not _ID.match(x)]
    if bad:
        raise SwitchError(
            f"{DISABLE_VAR}={raw!r}: malformed entry {bad[0]!r}; expected a comma-separated list of "
            "patch ids (kebab-case) or '*'"
        )
    unknown = sorted(set(items) - known)
    if unknown:
        raise SwitchError(
            f"{DISABLE_VAR}={raw!r}: unknown patch id(s) {', '.join(unknown)}; known ids: "
            + ", ".join(sorted(known))
        )
    return frozenset(items)


def strict(environ: Mapping[str, str] | None = None) -> bool:
    env = os.environ if environ is None else environ
    raw = env.get(STRICT_VAR, "").strip().lower()
    if raw in _TRUE:
        return True
    if raw in _FALSE:
        return False
    raise SwitchError(f"{STRICT_VAR}={env.get(STRICT_VAR)!r}: expected 1/0, true/false, yes/no or on/off")
