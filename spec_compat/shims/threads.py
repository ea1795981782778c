"""The driver's torch threads while speculators' generator runs (patch ``driver-torch-threads``).

On a CPU platform vLLM's worker process runs the model's threads on the same cores on which
speculators' driver copies the captured rows (one ``clone()`` per sequence and layer).  Measured
on the Llama fixture (2 cores, vLLM 0.16): with torch's default pool in the driver those copies
took about ten times longer than the same copies timed alone, and with one thread the driver's
CPU per token halved (benchmarks/RESULTS.md, P2).  Likely, not verified: each copy is split
over intra-op threads that have to wait for a core the worker holds.
"""

from __future__ import annotations

import contextlib
import re
import threading
from collections.abc import Iterator
from typing import Any

from ..core.switches import SwitchError

#: environment switch: torch threads of the driver while ``generate()`` runs
DRIVER_THREADS_VAR = "SPEC_COMPAT_DRIVER_THREADS"
#: ``SPEC_COMPAT_DRIVER_THREADS=keep``: the caller's setting is left as it is
KEEP = "keep"
DEFAULT_THREADS = 1

_lock = threading.Lock()
_depth = 0
_saved: int | None = None


def parse_driver_threads(raw: str | None) -> int | None:
    """The switch's value: a thread count >= 1, ``None`` for ``keep``; unset or empty is the
    default (1).  Anything else raises :class:`~spec_compat.core.switches.SwitchError`."""
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


@contextlib.contextmanager
def torch_threads(torch: Any, n: int) -> Iterator[None]:
    """Run the block with at most ``n`` torch intra-op threads in this process, then give the
    caller's count back (also on error).  Re-entrant and safe for concurrent callers: the count
    seen when the outermost block began is the one restored when the last block ends."""
    global _depth, _saved
    with _lock:
        if _depth == 0:
            _saved = int(torch.get_num_threads())
        _depth += 1
        if _saved is not None and _saved > n:
            torch.set_num_threads(n)
    try:
        yield
    finally:
        with _lock:
            _depth -= 1
            if _depth == 0:
                saved, _saved = _saved, None
                if saved is not None and int(torch.get_num_threads()) != saved:
                    torch.set_num_threads(saved)
