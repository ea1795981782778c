"""P2 floor: the per-call work that hidden-state capture cannot avoid, measured alone.

Whatever the generator, captured rows must be formed (``hidden + residual`` per captured layer:
vLLM's layers hand the residual on unfused), leave the worker, and reach speculators' per-sequence
tensors (its ``generate`` clones each sequence's slice). This times those steps with the shipped
code (``SegmentedCapture`` -> ``materialize``) at a fixture's sizes, the driver's part both ways
(``mapped``: one-piece layers returned as views of the segment, the default; ``copied``:
``map_pages=False``), so their sum can be set against
a plain prefill call of the same tokens (``capture_overhead.py``) to bound P2 from above.

usage: python benchmarks/capture_floor.py [--tokens 8192] [--hidden 256] [--layers 4] [--seqs 16]
           [--steps 1] [--threads 2] [--dtype float32|bfloat16] [--repeats 15] [--json OUT]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

STAGES = ("add hidden+residual (worker)", "write to shm (worker)", "materialize (driver)",
          "speculators per-sequence clone (driver)")
#: materialize's two ways, timed side by side (alternating runs): layers as views of the mapped
#: segment (shipped default) or copied into fresh tensors (``map_pages=False``)
MODES = ("mapped", "copied")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tokens", type=int, default=8192)
    ap.add_argument("--hidden", type=int, default=256)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--seqs", type=int, default=16)
    ap.add_argument("--steps", type=int, default=1,
                    help="scheduler steps per call, the sequences split evenly in input order (Llama: 2)")
    ap.add_argument("--threads", type=int, default=2, help="torch threads (the CPU worker uses one per core)")
    ap.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"],
                    help="the engine's dtype (the Kimi fixture runs in float32, the Llama fixture in bfloat16)")
    ap.add_argument("--repeats", type=int, default=15)
    ap.add_argument("--json", type=Path)
    a = ap.parse_args()
    if a.tokens % a.seqs:
        ap.error("--tokens must be a multiple of --seqs")
    if a.steps < 1 or a.seqs % a.steps:
        ap.error("--seqs must be a multiple of --steps")

    import torch

    from spec_compat.verify.compare import compare_identical
    from spec_compat.shims.handoff import SegmentedCapture, materialize

    torch.set_num_threads(a.threads)
    torch.manual_seed(0)
    dtype = getattr(torch, a.dtype)
    hidden = [torch.randn(a.tokens, a.hidden).to(dtype) for _ in range(a.layers)]
    residual = [torch.randn(a.tokens, a.hidden).to(dtype) for _ in range(a.layers)]
    reqs = [(f"r{i}", a.tokens // a.seqs) for i in range(a.seqs)]

    def once(mode: str) -> list[float]:
        t0 = time.perf_counter()
        states = [h + r for h, r in zip(hidden, residual)]
        t1 = time.perf_counter()
        store = SegmentedCapture(mode="shm")
        per_step, row = a.seqs // a.steps, 0
        for k in range(a.steps):
            step = reqs[k * per_step:(k + 1) * per_step]
            rows = sum(n for _, n in step)
            store.begin_step(dict(step))
            writer = store.forward([r for r, _ in step])
            assert writer is not None
            for s in states:
                writer.add(s[row:row + rows])
            writer.close()
            store.end_step()
            row += rows
        descriptor = store.finish()
        t2 = time.perf_counter()
        layers = materialize(descriptor, reqs, map_pages=mode == "mapped")
        t3 = time.perf_counter()
        off, out = 0, []
        for _, n in reqs:
            out.append([h[off:off + n].clone().cpu() for h in layers])
            off += n
        t4 = time.perf_counter()
        same = compare_identical(out[-1][-1], states[-1][-(a.tokens // a.seqs):])
        assert same, same.detail
        del layers
        return [t1 - t0, t2 - t1, t3 - t2, t4 - t3]

    for _ in range(3):
        for mode in MODES:
            once(mode)
    runs: dict[str, list[list[float]]] = {m: [] for m in MODES}
    for _ in range(a.repeats):
        for mode in MODES:
            runs[mode].append(once(mode))
    print(f"{a.tokens} tokens in {a.steps} step(s) x {a.layers} layers x hidden {a.hidden} {a.dtype} "
          f"({a.tokens * a.layers * a.hidden * dtype.itemsize / 2**20:.0f} MiB captured), {a.threads} threads, {a.repeats} runs "
          "of each mode, alternating")
    result: dict[str, dict] = {}
    for mode in MODES:
        ms = {name: sorted(1000 * r[i] for r in runs[mode]) for i, name in enumerate(STAGES)}
        total = sorted(1000 * sum(r) for r in runs[mode])
        driver = sorted(1000 * (r[2] + r[3]) for r in runs[mode])
        print(f" materialize {mode}:")
        for name, v in ms.items():
            print(f"  {name:42s} median {statistics.median(v):6.1f} ms  (min {v[0]:.1f}, max {v[-1]:.1f})")
        print(f"  {'driver (materialize + clone)':42s} median {statistics.median(driver):6.1f} ms")
        print(f"  {'sum':42s} median {statistics.median(total):6.1f} ms")
        result[mode] = {"ms": ms, "driver_ms": driver, "sum_ms": total}
    ratio = statistics.median(result["copied"]["driver_ms"]) / statistics.median(result["mapped"]["driver_ms"])
    print(f" driver time copied / mapped: {ratio:.2f}x")
    if a.json:
        a.json.write_text(json.dumps({"args": {k: v for k, v in vars(a).items() if k != "json"},
                                      "modes": result, "driver_copied_over_mapped": ratio}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
