"""The capture hook's write into the hidden-states store, alone: ``HiddenStatesStore.put`` with the
residual vs the previous form (a fresh ``hidden + residual`` per call, then a boolean-masked
index), side by side, interleaved, one torch thread.

usage: python benchmarks/store_put.py [--tokens 2048] [--hidden 256] [--rounds 7] [--calls 200]
Prints ms per call of each and the median ratio previous / current; ``--out`` writes the JSON.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tokens", type=int, default=2048)
    ap.add_argument("--hidden", type=int, default=256)
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--calls", type=int, default=200)
    ap.add_argument("--out")
    a = ap.parse_args()

    import torch

    from spec_compat.shims.hidden_states.store import HiddenStatesStore

    torch.set_num_threads(1)
    n, h, block = a.tokens, a.hidden, 16
    store = HiddenStatesStore((1, 2, 3, 4), h, num_blocks=4 * n // block, block_size=block,
                              dtype=torch.float32, device="cpu")
    g = torch.Generator().manual_seed(0)
    hidden, residual = torch.randn(n, h, generator=g), torch.randn(n, h, generator=g)
    slots = torch.randperm(store.cache.shape[0] * block, generator=g)[:n].to(torch.int32)
    flat = store.cache.view(-1, 4, h)

    def previous() -> None:  # the hook before this change: a new sum tensor, then a masked index
        s = slots[:n].to(dtype=torch.long)
        keep = s >= 0
        flat[s[keep], 1] = (hidden + residual)[:n][keep].to(flat.dtype)

    def current() -> None:
        store.put(1, hidden, slots, residual)

    previous()
    want = flat[slots.long(), 1].clone()
    current()
    assert torch.equal(flat[slots.long(), 1], want), "the two forms wrote different rows"

    def ms(fn) -> float:
        t = time.perf_counter()
        for _ in range(a.calls):
            fn()
        return (time.perf_counter() - t) / a.calls * 1e3

    prev_ms, cur_ms = [], []
    for r in range(a.rounds):
        for name in (("previous", "current") if r % 2 == 0 else ("current", "previous")):
            (prev_ms if name == "previous" else cur_ms).append(ms(previous if name == "previous" else current))
    ratios = [p / c for p, c in zip(prev_ms, cur_ms)]
    res = {"tokens": n, "hidden": h, "rounds": a.rounds, "calls": a.calls, "torch_threads": 1,
           "previous_ms": [round(x, 3) for x in prev_ms], "current_ms": [round(x, 3) for x in cur_ms],
           "previous_over_current_median": round(statistics.median(ratios), 3)}
    print(json.dumps(res, indent=1))
    if a.out:
        Path(a.out).write_text(json.dumps(res, indent=1) + "\n")


if __name__ == "__main__":
    main()
