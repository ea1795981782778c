"""driver-torch-threads: the driver's torch threads while speculators' generator runs.

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
from types import ModuleType
from typing import Any

from ...core import switches
from ...core.proof import Claim, Proof
from ...core.registry import Changes, NotNeeded, Patch, register
from ..ranges import SPEC_03
from ._generator_target import GENERATOR, check_generate_params

_lock = threading.Lock()
_depth = 0
_saved: int | None = None


@register
class DriverTorchThreads(Patch):
    """speculators 0.3.0 (generator:283) clones every captured row in the driver with torch's intra-op
    pool on the cores vLLM's CPU worker computes on (P2): on vLLM 0.16 (Llama fixture, 2 cores) those
    copies took ten times as long as alone (a cProfile of the driver, benchmarks/RESULTS.md);
    extraction ran at 0.84-0.89 of plain prefill per round, and faster with this patch in the same
    interleaved rounds (benchmarks/results/capture_overhead_llama_driver_threads.json: there
    ``capture-threads-kept`` is the run without it)."""

    id = "driver-torch-threads"
    reads = (switches.DRIVER_THREADS_VAR,)
    after = ("generator-input-checks",)
    proof = Proof("optimization", "tests/engine/test_handoff_engine.py::test_handoff_rows_equal_the_pickled_path", benchmark="benchmarks/results/capture_overhead_llama_driver_threads.json", claims=(
        Claim("without the patch / plain prefill, extraction tok/s (medians, 3 rounds x 10 cycles)",
              "summary.capture-threads-kept.median", "summary.plain.median", at_least=0.84, at_most=0.89),
        Claim("with / without the patch, extraction tok/s (medians, same interleaved cycles)",
              "summary.capture.median", "summary.capture-threads-kept.median", at_least=1.0)))
    summary = ("CPU platform: generate() runs with SPEC_COMPAT_DRIVER_THREADS (default 1) torch threads "
               "in the driver; the caller's count is restored after each call")
    upstream = ("speculators 0.3.0 generator:283 per-sequence clone() in the driver, split over torch's "
                "threads on the cores vLLM's CPU worker computes on")
    target = f"{GENERATOR}:VllmHiddenStatesGenerator"
    requires = {"speculators": SPEC_03, "vllm": ">=0.16,<0.17"}  # the cell that measured it (P2)

    def check(self, module: ModuleType) -> None:
        import torch

        check_generate_params(module)
        if torch.cuda.is_available():
            raise NotNeeded("CUDA platform: the driver's copies do not share the model's CPU cores")
        if switches.value(switches.DRIVER_THREADS_VAR) is None:
            raise NotNeeded(f"{switches.DRIVER_THREADS_VAR}=keep: the driver keeps torch's thread count")

    def install(self, module: ModuleType, changes: Changes) -> None:
        import torch

        n = switches.value(switches.DRIVER_THREADS_VAR)
        assert n is not None  # check() made 'keep' not-needed
        cls = module.VllmHiddenStatesGenerator
        inner = cls.generate

        def generate(self: Any, token_ids: Any) -> list[dict]:
            with torch_threads(torch, n):
                return inner(self, token_ids)

        changes.setattr(cls, "generate", generate)


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
