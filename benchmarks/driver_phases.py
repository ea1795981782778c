"""P2: where one ``generate()`` call of speculators' generator spends its time, seen from the driver.

Wraps the generator's executor (``execute_model``, ``collective_rpc`` per method) and scheduler
(``schedule``, ``add_request``) with timers, runs warm-up calls, then timed calls; prints each
phase in ms per call next to the call itself. ``execute_model`` is the worker's step (model forward
with capture, as the driver waits for it); ``rpc:_get_captured_states`` includes the hand-off
(``materialize``); what is left of a call is speculators' own Python (request set-up, the
per-sequence clone). Run it in a cell's python, alone on the machine.

usage: python benchmarks/driver_phases.py MODEL_DIR [--seqs 16] [--len 512] [--calls 8] [--plain]
           [--driver-threads N] [--json OUT]

``--plain`` times plain vLLM prefill of the same ids instead (``LLM``, engine core in-process), with
its executor's ``execute_model`` / ``sample_tokens``, for a side-by-side reading of the worker step.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import random
import statistics
import sys
import time
from pathlib import Path
from typing import Any, Callable

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("model")
    ap.add_argument("--seqs", type=int, default=16)
    ap.add_argument("--len", dest="length", type=int, default=512)
    ap.add_argument("--calls", type=int, default=8)
    ap.add_argument("--json", type=Path)
    ap.add_argument("--driver-threads", type=int, default=None,
                    help="torch.set_num_threads(N) in this (the driver's) process before anything runs")
    ap.add_argument("--plain", action="store_true",
                    help="time plain vLLM prefill instead (LLM(...), max_tokens=1, engine core in this process "
                         "so its executor's execute_model can be timed)")
    a = ap.parse_args()
    if a.driver_threads:
        import torch

        torch.set_num_threads(a.driver_threads)
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "2")
    os.environ.setdefault("VLLM_HOST_IP", "127.0.0.1")
    os.environ.setdefault("VLLM_MLA_DISABLE", "1")

    cfg = json.loads((Path(a.model) / "config.json").read_text())
    vocab = cfg.get("vocab_size") or cfg.get("text_config", {}).get("vocab_size", 512)
    rng = random.Random(0)
    ids = [[rng.randrange(4, vocab) for _ in range(a.length)] for _ in range(a.seqs)]
    phases: dict[str, float] = collections.defaultdict(float)
    if a.plain:
        return plain_phases(a, ids, phases)

    import spec_compat  # noqa: F401  (before speculators)
    from speculators.data_generation.vllm_hidden_states_generator import VllmHiddenStatesGenerator

    gen = VllmHiddenStatesGenerator(a.model, max_model_len=a.length + 8)
    ex, sched = gen.executor, gen.scheduler
    ex.execute_model = timed(phases, "execute_model", ex.execute_model)
    ex.collective_rpc = timed(phases, "rpc", ex.collective_rpc)
    sched.schedule = timed(phases, "schedule", sched.schedule)
    sched.add_request = timed(phases, "add_request", sched.add_request)
    # execute_model's RPCs are inside execute_model: count them once
    return measure(a, lambda: gen.generate(ids), phases, nested=("rpc:execute_model", "rpc:sample_tokens"))


def timed(phases: dict[str, float], name: str, fn: Callable[..., Any]) -> Callable[..., Any]:
    """``fn`` adding its time to ``phases[name]`` (``rpc``: per method, ``rpc:<method>``)."""
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        key = f"rpc:{args[0]}" if name == "rpc" and args and isinstance(args[0], str) else name
        t = time.perf_counter()
        try:
            return fn(*args, **kwargs)
        finally:
            phases[key] += time.perf_counter() - t
    return wrapper


def measure(a: argparse.Namespace, call: Callable[[], Any], phases: dict[str, float], *,
            nested: tuple[str, ...] = (), variant: str | None = None) -> int:
    """Two warm-up calls, then ``a.calls`` timed ones; prints each phase per call and what is
    left of a call (``nested``: phases timed inside another one, not subtracted twice)."""
    for _ in range(2):
        call()
    phases.clear()
    calls = []
    for _ in range(a.calls):
        t = time.perf_counter()
        call()
        calls.append(time.perf_counter() - t)
    per_call = {k: 1000 * v / a.calls for k, v in sorted(phases.items())}
    mean = 1000 * statistics.mean(calls)
    outside = mean - sum(v for k, v in per_call.items() if k not in nested)
    print(f"{variant + ': ' if variant else ''}{a.seqs} x {a.length} tokens, {a.calls} calls: mean {mean:.1f} ms "
          f"per call (median {1000 * statistics.median(calls):.1f}, min {1000 * min(calls):.1f}, "
          f"max {1000 * max(calls):.1f})")
    for k, v in per_call.items():
        print(f"  {k:28s} {v:7.1f} ms/call  ({100 * v / mean:4.1f} %)")
    print(f"  {'rest of generate()':28s} {outside:7.1f} ms/call  ({100 * outside / mean:4.1f} %)")
    if a.json:
        out = {"model": Path(a.model).name, **({"variant": variant} if variant else {}), "seqs": a.seqs,
               "len": a.length, "call_ms": [1000 * c for c in calls], "phase_ms_per_call": per_call,
               "rest_ms_per_call": outside}
        a.json.write_text(json.dumps(out, indent=1))
    sys.stdout.flush()
    os._exit(0)  # engine teardown is not measured


def plain_phases(a: argparse.Namespace, ids: list[list[int]], phases: dict[str, float]) -> int:
    """The same call as capture_overhead.py's ``plain`` variant, engine core in this process."""
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    from vllm import LLM, SamplingParams

    llm = LLM(model=a.model, enforce_eager=True, max_model_len=a.length + 8, enable_prefix_caching=False,
              dtype="auto", trust_remote_code=True, block_size=16, max_num_seqs=32, max_num_batched_tokens=8192)
    params = SamplingParams(max_tokens=1, temperature=0.0)
    prompts = [{"prompt_token_ids": s} for s in ids]
    ex = llm.llm_engine.engine_core.engine_core.model_executor  # InprocClient -> EngineCore -> executor
    for name in ("execute_model", "sample_tokens"):
        if getattr(ex, name, None) is not None:
            setattr(ex, name, timed(phases, name, getattr(ex, name)))
    return measure(a, lambda: llm.generate(prompts, params, use_tqdm=False), phases, variant="plain")


if __name__ == "__main__":
    main()
