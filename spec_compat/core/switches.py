"""Every environment switch of spec-compat, parsed here and nowhere else.

=============================  ==============================================================
``SPEC_COMPAT_DISABLE``        comma-separated patch ids, or ``*`` for every patch
``SPEC_COMPAT_STRICT``         ``1``/``true``: a patch ending ``target-changed`` or ``failed`` raises
``SPEC_COMPAT_LOG``            log level of the ``spec_compat`` logger (e.g. ``DEBUG``)
``SPEC_COMPAT_NONFINITE``      ``raise`` (default) or ``warn``: a NaN/inf in captured states
``SPEC_COMPAT_DRIVER_THREADS`` torch threads of the driver during ``generate()`` (default 1; ``keep``)
``SPEC_COMPAT_SHM_POOL_MB``    MiB of hand-off segment pages the driver keeps for reuse (default 0)
``SPEC_COMPAT_DRIVER_WAIT``    ``spin`` (vLLM's wait, default) or ``sleep`` while the driver waits
``SPEC_COMPAT_AUX_IDS``        ``auto`` (default), ``input`` or ``output``: an EAGLE-3 head's aux ids
``SPEC_COMPAT_MOONCAKE_MASTER`` ``host:port`` of the Mooncake master a client reads samples from
``MOONCAKE_LOCAL_HOSTNAME``    Mooncake's own variable: the host name that client joins the store as
=============================  ==============================================================

A malformed value raises :class:`SwitchError` naming the variable and what it accepts, prefixed
with ``spec_compat[<id>]`` for the patches that declare the variable in ``Patch.reads`` (the
registry hands those declarations to :func:`claim`: this module names no patch).  The shims never
read the environment: the patches pass them the values parsed here.
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
AUX_IDS_VAR = "SPEC_COMPAT_AUX_IDS"
MOONCAKE_MASTER_VAR = "SPEC_COMPAT_MOONCAKE_MASTER"
#: not ours: the variable Mooncake's deployments set for a client's own address (read here too, so
#: that the shim joining the store reads no environment)
MOONCAKE_HOST_VAR = "MOONCAKE_LOCAL_HOSTNAME"
DEFAULT_MOONCAKE_HOST = "localhost"

NONFINITE_RAISE, NONFINITE_WARN = "raise", "warn"
#: ``SPEC_COMPAT_DRIVER_THREADS=keep``: the caller's torch setting is left as it is
KEEP = "keep"
DEFAULT_THREADS = 1
#: opt-in: in end-to-end runs the pool made no measurable difference (benchmarks/RESULTS.md, P2)
DEFAULT_POOL_MB = 0
#: ``SPEC_COMPAT_AUX_IDS``: decide by where the checkpoint names its ids, or force one reading
AUX_IDS_AUTO, AUX_IDS_INPUT, AUX_IDS_OUTPUT = "auto", "input", "output"

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


def parse_nonfinite(raw: str | None) -> str:
    """Unset or empty is ``raise``; ``raise`` / ``warn`` (any case)."""
    text = (raw or "").strip().lower()
    if not text:
        return NONFINITE_RAISE
    if text in (NONFINITE_RAISE, NONFINITE_WARN):
        return text
    raise SwitchError(f"{NONFINITE_VAR}={raw!r}: expected '{NONFINITE_RAISE}' (default: a NaN/inf in captured "
                      f"states is an error) or '{NONFINITE_WARN}' (log the counts, keep the states)")


def parse_driver_threads(raw: str | None) -> int | None:
    """A thread count >= 1, ``None`` for ``keep``; unset or empty is the default (1)."""
    text = (raw or "").strip().lower()
    if not text:
        return DEFAULT_THREADS
    if text == KEEP:
        return None
    if not re.fullmatch(r"[0-9]+", text) or int(text) < 1:
        raise SwitchError(f"{DRIVER_THREADS_VAR}={raw!r}: expected a whole number of threads >= 1 (default "
                          f"{DEFAULT_THREADS}) or '{KEEP}' (torch's setting left as it is)")
    return int(text)


def parse_pool_bytes(raw: str | None) -> int:
    """Unset or empty is the default (0: off), else a whole number of MiB >= 0, in bytes."""
    text = (raw or "").strip()
    if not text:
        return DEFAULT_POOL_MB << 20
    if not text.isdigit():
        raise SwitchError(f"{POOL_VAR}={raw!r} is not a whole number of MiB (0 turns segment recycling off; "
                          f"unset: {DEFAULT_POOL_MB})")
    return int(text) << 20


def parse_driver_wait(raw: str | None) -> str:
    """``spin`` (the default) or ``sleep``."""
    mode = (raw or "").strip().lower() or "spin"
    if mode not in ("spin", "sleep"):
        raise SwitchError(f"{DRIVER_WAIT_VAR}={raw!r}: expected 'spin' (vLLM's wait, the default) or 'sleep'")
    return mode


def parse_aux_ids(raw: str | None) -> str:
    """``auto`` (unset or empty too), ``input`` or ``output``: which layers an EAGLE-3 head's aux
    ids name (``spec_compat.shims.draft_heads`` describes the two conventions)."""
    text = (raw or "").strip().lower() or AUX_IDS_AUTO
    if text not in (AUX_IDS_AUTO, AUX_IDS_INPUT, AUX_IDS_OUTPUT):
        raise SwitchError(f"{AUX_IDS_VAR}={raw!r}: expected 'auto' (decide by where the checkpoint names its ids), "
                          "'input' (vLLM / speculators: id i = input of layer i) or 'output' (SGLang / TorchSpec: "
                          "id i = output of layer i)")
    return text


def parse_mooncake_master(raw: str | None) -> str | None:
    """``host:port``, or None when unset or empty (the client then uses hs-connectors' default,
    which the shim that joins the store knows)."""
    address = (raw or "").strip()
    if not address:
        return None
    host, sep, port = address.rpartition(":")
    if not sep or not host or not port.isdigit():
        raise SwitchError(f"{MOONCAKE_MASTER_VAR}={address!r} is not host:port (the Mooncake master's address)")
    return address


def parse_mooncake_host(raw: str | None) -> str:
    """Any host name; unset or empty is ``localhost``."""
    return (raw or "").strip() or DEFAULT_MOONCAKE_HOST


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
    Switch(AUX_IDS_VAR, parse_aux_ids, "which layers a served EAGLE-3 head's aux ids name"),
    Switch(MOONCAKE_MASTER_VAR, parse_mooncake_master, "the Mooncake master a client reads samples from"),
    Switch(MOONCAKE_HOST_VAR, parse_mooncake_host, "the host name a Mooncake client joins the store as"),
)}

#: variable -> ids of the patches that declare it in ``Patch.reads`` (filled by :func:`claim`)
_READERS: dict[str, list[str]] = {}


def claim(var: str, pid: str) -> None:
    """Note that patch ``pid`` reads ``var`` (its ``Patch.reads``): a malformed value is then
    reported as ``spec_compat[pid]: VAR=...``.  Raises ValueError for a variable not in
    :data:`SWITCHES` (a typo in a declaration fails at registration)."""
    if var not in SWITCHES:
        raise ValueError(f"patch {pid}: reads = ({var!r}, ...) names no value switch; known: "
                         + ", ".join(sorted(SWITCHES)))
    readers = _READERS.setdefault(var, [])
    if pid not in readers:
        readers.append(pid)


def readers(var: str) -> tuple[str, ...]:
    """The ids of the patches that declared ``var``, in registration order."""
    return tuple(_READERS.get(var, ()))


def value(var: str, environ: Mapping[str, str] | None = None) -> Any:
    """The parsed value of one of :data:`SWITCHES` (raises :class:`SwitchError` when malformed,
    naming the patches that declared the variable)."""
    try:
        return SWITCHES[var].parse(_env(environ).get(var))
    except SwitchError as exc:
        owners = readers(var)
        if not owners:
            raise
        raise SwitchError(f"spec_compat[{', '.join(owners)}]: {exc}") from None


def check_all(environ: Mapping[str, str] | None = None) -> None:
    """Parse every value switch and the log level (a malformed one raises here, early)."""
    log_level(environ)
    for var in SWITCHES:
        value(var, environ)
