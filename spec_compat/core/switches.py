"""Every environment switch of spec-compat, parsed here and nowhere else.

=============================  ==============================================================
``SPEC_COMPAT_DISABLE``        comma-separated patch ids, or ``*`` for every patch
``SPEC_COMPAT_STRICT``         ``1``/``true``: a patch ending ``target-changed`` or ``failed`` raises
``SPEC_COMPAT_LOG``            log level of the ``spec_compat`` logger (e.g. ``DEBUG``)
``SPEC_COMPAT_NONFINITE``      ``raise`` (default) or ``warn``: a NaN/inf in captured states
``SPEC_COMPAT_DRIVER_THREADS`` torch threads of the driver during ``generate()`` (default 1; ``keep``)
``SPEC_COMPAT_SHM_POOL_MB``    MiB of hand-off segment pages the driver keeps for reuse (default 0)
``SPEC_COMPAT_DRIVER_WAIT``    ``spin`` (vLLM's wait, default) or ``sleep`` while the driver waits
=============================  ==============================================================

A malformed value raises :class:`SwitchError` naming the variable and what it accepts.  The
shims never read the environment: the patches pass them the values parsed here.
"""

from __future__ import annotations

import logging
import os
import re
from collections.abc import Callable, Iterable, Mapping
from typing import Any

DISABLE_VAR = "SPEC_COMPAT_DISABLE"
STRICT_VAR = "SPEC_COMPAT_STRICT"
LOG_VAR = "SPEC_COMPAT_LOG"
NONFINITE_VAR = "SPEC_COMPAT_NONFINITE"
DRIVER_THREADS_VAR = "SPEC_COMPAT_DRIVER_THREADS"
POOL_VAR = "SPEC_COMPAT_SHM_POOL_MB"
DRIVER_WAIT_VAR = "SPEC_COMPAT_DRIVER_WAIT"

NONFINITE_RAISE, NONFINITE_WARN = "raise", "warn"
#: ``SPEC_COMPAT_DRIVER_THREADS=keep``: the caller's torch setting is left as it is
KEEP = "keep"
DEFAULT_THREADS = 1
#: opt-in: in end-to-end runs the pool made no measurable difference (benchmarks/RESULTS.md, P2)
DEFAULT_POOL_MB = 0

_ID = re.compile(r"^[a-z0-9]+(?:-[a-z0-9]+)*$")
_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"", "0", "false", "no", "off"}


class SwitchError(ValueError):
    """A malformed value in one of the SPEC_COMPAT_* variables."""


def _env(environ: Mapping[str, str] | None) -> Mapping[str, str]:
    return os.environ if environ is None else environ


def disabled_ids(known: Iterable[str], environ: Mapping[str, str] | None = None) -> frozenset[str]:
    """``SPEC_COMPAT_DISABLE`` checked against the ``known`` patch ids."""
    raw = _env(environ).get(DISABLE_VAR, "")
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


def named_in_disable(pid: str, environ: Mapping[str, str] | None = None) -> bool:
    """Whether ``SPEC_COMPAT_DISABLE`` names ``pid`` (or is ``*``), without validating the rest:
    for code that runs before the registry knows every id (vLLM's platform plugin)."""
    raw = _env(environ).get(DISABLE_VAR, "")
    return raw.strip() == "*" or pid in {x.strip() for x in raw.split(",")}


def strict(environ: Mapping[str, str] | None = None) -> bool:
    env = _env(environ)
    raw = env.get(STRICT_VAR, "").strip().lower()
    if raw in _TRUE:
        return True
    if raw in _FALSE:
        return False
    raise SwitchError(f"{STRICT_VAR}={env.get(STRICT_VAR)!r}: expected 1/0, true/false, yes/no or on/off")


def log_level(environ: Mapping[str, str] | None = None) -> int | None:
    """``SPEC_COMPAT_LOG`` as a ``logging`` level, or None when unset."""
    raw = _env(environ).get(LOG_VAR, "").strip()
    if not raw:
        return None
    level = logging.getLevelName(raw.upper())
    if not isinstance(level, int):
        raise SwitchError(f"{LOG_VAR}={raw!r}: expected a logging level (DEBUG, INFO, WARNING, ERROR)")
    return level


def parse_nonfinite(raw: str | None, patch_id: str = "generator-input-checks") -> str:
    """Unset or empty is ``raise``; ``raise`` / ``warn`` (any case)."""
    text = (raw or "").strip().lower()
    if not text:
        return NONFINITE_RAISE
    if text in (NONFINITE_RAISE, NONFINITE_WARN):
        return text
    raise SwitchError(f"spec_compat[{patch_id}]: {NONFINITE_VAR}={raw!r}: expected '{NONFINITE_RAISE}' (default: "
                      f"a NaN/inf in captured states is an error) or '{NONFINITE_WARN}' (log the counts, keep "
                      "the states)")


def parse_driver_threads(raw: str | None) -> int | None:
    """A thread count >= 1, ``None`` for ``keep``; unset or empty is the default (1)."""
    text = (raw or "").strip().lower()
    if not text:
        return DEFAULT_THREADS
    if text == KEEP:
        return None
    if not re.fullmatch(r"[0-9]+", text) or int(text) < 1:
        raise SwitchError(f"spec_compat[driver-torch-threads]: {DRIVER_THREADS_VAR}={raw!r}: expected a whole "
                          f"number of threads >= 1 (default {DEFAULT_THREADS}) or '{KEEP}' (torch's setting "
                          "left as it is)")
    return int(text)


def parse_pool_bytes(raw: str | None) -> int:
    """Unset or empty is the default (0: off), else a whole number of MiB >= 0, in bytes."""
    text = (raw or "").strip()
    if not text:
        return DEFAULT_POOL_MB << 20
    if not text.isdigit():
        raise SwitchError(f"spec_compat[capture-handoff-shm]: {POOL_VAR}={raw!r} is not a whole number of MiB "
                          f"(0 turns segment recycling off; unset: {DEFAULT_POOL_MB})")
    return int(text) << 20


def parse_driver_wait(raw: str | None, patch_id: str = "driver-wait-yields-cpu") -> str:
    """``spin`` (the default) or ``sleep``."""
    mode = (raw or "").strip().lower() or "spin"
    if mode not in ("spin", "sleep"):
        raise SwitchError(f"spec_compat[{patch_id}]: {DRIVER_WAIT_VAR}={raw!r}: "
                          "expected 'spin' (vLLM's wait, the default) or 'sleep'")
    return mode


class Switch:
    """One value switch: its variable, its parser, what it sets.  (A plain class: importing
    ``dataclasses`` would double the cost of ``import spec_compat``.)"""

    __slots__ = ("var", "parse", "doc")

    def __init__(self, var: str, parse: Callable[[str | None], Any], doc: str) -> None:
        self.var, self.parse, self.doc = var, parse, doc


#: the value switches, read through :func:`value`
SWITCHES: dict[str, Switch] = {s.var: s for s in (
    Switch(NONFINITE_VAR, parse_nonfinite, "what a NaN/inf in captured states does"),
    Switch(DRIVER_THREADS_VAR, parse_driver_threads, "torch threads of the driver while generate() runs"),
    Switch(POOL_VAR, parse_pool_bytes, "bytes of hand-off segment pages kept for reuse"),
    Switch(DRIVER_WAIT_VAR, parse_driver_wait, "how the driver waits for the workers"),
)}


def value(var: str, environ: Mapping[str, str] | None = None) -> Any:
    """The parsed value of one of :data:`SWITCHES` (raises :class:`SwitchError` when malformed)."""
    return SWITCHES[var].parse(_env(environ).get(var))


def check_all(environ: Mapping[str, str] | None = None) -> None:
    """Parse every value switch and the log level (a malformed one raises here, early)."""
    log_level(environ)
    for var in SWITCHES:
        value(var, environ)
