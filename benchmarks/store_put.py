"""The capture hook's write into the hidden-states store and the connector's read of a prompt's
rows, alone, each vs its previous form, side by side, interleaved, one torch thread:

* put: ``HiddenStatesStore.put`` (sum buffer, ``index_copy_`` into the column's view) vs the form
  before 2026-12-04 (sum buffer, ``flat[slots, column] = rows``, an index_put over two indices);
* rows: ``gather_rows`` (whole blocks by ``index_select``, then the prefix) vs the form before
  (advanced indexing of every position: ``cache[blocks[pos // B], pos % B]``).

Slots come in runs of whole 16-token blocks, as the KV-cache manager hands them out.

usage: python benchmarks/store_put.py [--tokens 2048] [--prompt 256] [--hidden 256] [--rounds 7] [--calls 200]
Prints ms per call of each and the median ratios previous / current; ``--out`` writes the JSON.
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
    ap.add_argument("--prompt", type=int, default=256, help="tokens of the prompt whose rows are read")
    ap.add_argument("--hidden", type=int, default=256)
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--calls", type=int, default=200)
    ap.add_argument("--out")
    a = ap.parse_args()

    import torch

    from spec_compat.patches.hidden_states.ehs_capture import gather_rows
    from spec_compat.patches.hidden_states.ehs_capture import HiddenStatesStore

    torch.set_num_threads(1)
    n, h, block = a.tokens, a.hidden, 16
    store = HiddenStatesStore((1, 2, 3, 4), h, num_blocks=4 * n // block, block_size=block,
                              dtype=torch.float32, device="cpu")
    g = torch.Generator().manual_seed(0)
    hidden, residual = torch.randn(n, h, generator=g), torch.randn(n, h, generator=g)
    blocks = torch.randperm(store.cache.shape[0], generator=g)[:n // block]
    slots = (blocks[:, None] * block + torch.arange(block)).flatten().to(torch.int32)
    flat = store.cache.view(-1, 4, h)
    flat.normal_(generator=g)
    prompt_blocks = blocks[:(a.prompt + block - 1) // block].tolist()

    def previous() -> None:  # the hook before: the same sum buffer, then an index_put over two indices
        s = slots[:n].to(dtype=torch.long)
        rows = torch.add(hidden, residual, out=store._sum_buffer(n, hidden))
        flat[s, 1] = rows.to(flat.dtype)

    def current() -> None:
        store.put(1, hidden, slots, residual)

    previous()
    want = flat[slots.long(), 1].clone()
    flat[slots.long(), 1] = 0
    current()
    assert torch.equal(flat[slots.long(), 1], want), "the two forms wrote different rows"

    def rows_previous():
        pos = torch.arange(a.prompt)
        b = torch.tensor(prompt_blocks, dtype=torch.long)
        return store.cache[b[pos // block], pos % block].contiguous()

    def rows_current():
        return gather_rows(store.cache, prompt_blocks, a.prompt)

    assert torch.equal(rows_previous(), rows_current()), "the two forms read different rows"

    def ms(fn) -> float:
        t = time.perf_counter()
        for _ in range(a.calls):
            fn()
        return (time.perf_counter() - t) / a.calls * 1e3

    times: dict[str, list[float]] = {k: [] for k in ("put_previous", "put_current", "rows_previous", "rows_current")}
    fns = {"put_previous": previous, "put_current": current, "rows_previous": rows_previous,
           "rows_current": rows_current}
    for r in range(a.rounds):
        for name in (list(fns) if r % 2 == 0 else list(reversed(fns))):
            times[name].append(ms(fns[name]))

    def ratio(what: str) -> float:
        return round(statistics.median(p / c for p, c in zip(times[f"{what}_previous"], times[f"{what}_current"])), 3)

    res = {"tokens": n, "prompt": a.prompt, "hidden": h, "rounds": a.rounds, "calls": a.calls, "torch_threads": 1,
           **{f"{k}_ms": [round(x, 4) for x in v] for k, v in times.items()},
           "put_previous_over_current_median": ratio("put"), "rows_previous_over_current_median": ratio("rows")}
    print(json.dumps(res, indent=1))
    if a.out:
        Path(a.out).write_text(json.dumps(res, indent=1) + "\n")


if __name__ == "__main__":
    main()
