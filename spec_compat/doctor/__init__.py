"""``spec-compat doctor``: why a draft accepts few tokens, from the draft, the target and the training
data, before anyone retrains.  Each check prints ``ok`` / ``problem`` / ``skipped (why)``; a problem
names its cause, the fix (a patch id, a flag, a config key) and the evidence (numbers).

The checks are in :mod:`spec_compat.doctor.checks`; reading the data in :mod:`.data`; the rows'
comparison with a fresh forward in :mod:`.rows`.  Nothing here writes into the draft or the data;
the data is read as a sample (the first few samples, weight files by their headers).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

from .checks import CHECKS
from .findings import Finding, Skip, as_json, line
from .inputs import Inputs

log = logging.getLogger(__name__)

__all__ = ["CHECKS", "Finding", "Inputs", "Skip", "as_json", "line", "run_checks"]


def run_checks(inp: Inputs, only: list[str] | None = None,
               progress: Callable[[Finding], None] | None = None) -> list[Finding]:
    """Every check (or those named in ``only``), in order; a check that cannot run is ``skipped``."""
    out = []
    for name, check in CHECKS.items():
        if only and name not in only:
            continue
        t0 = time.perf_counter()
        try:
            f = check(inp)
        except Skip as exc:
            f = Finding("skipped", str(exc))
        except Exception as exc:  # noqa: BLE001 - an unreadable input is a line, not a traceback
            log.debug("doctor check %s failed", name, exc_info=True)
            f = Finding("skipped", f"could not run: {type(exc).__name__}: {exc}")
        f.check, f.seconds = name, round(time.perf_counter() - t0, 2)
        out.append(f)
        if progress:
            progress(f)
    return out
