"""The driver's torch threads while speculators' generator runs (patch ``driver-torch-threads``).

On a CPU platform vLLM's worker process runs the model's threads on the same cores on which
speculators' driver copies the captured rows (one ``clone()`` per sequence and layer).  Measured
on the Llama fixture (2 cores, vLLM 0.16): with torch's default pool in the driver those copies
took about ten times longer than the same copies timed alone, and with one thread the driver's
CPU per token halved (benchmarks/RESULTS.md, goal P2).  Why the pool is slower there was not
measured; only the effect of one thread was.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from typing import Any

_lock = threading.Lock()
_depth = 0
_saved: int | None = None



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
