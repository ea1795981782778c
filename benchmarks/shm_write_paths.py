"""P2: ways a worker can put ``hidden + residual`` rows into a fresh /dev/shm segment, side by side.

The shipped hand-off (``SegmentedCapture``) sums into a fresh tensor and copies it into the segment
with ``os.pwrite``. Summing straight into the segment's pages saves a pass over the rows but has to
map the file, and a fresh tmpfs page touched through a mapping is allocated at fault time (a full
/dev/shm would then be a SIGBUS, hence ``posix_fallocate`` first). This times, per call of
``--layers`` layers of ``--tokens`` x ``--hidden`` fp32 rows (the Kimi fixture's size by default):

* ``pwrite``        - sum into a fresh tensor, ``os.pwrite`` into the segment (shipped)
* ``fallocate+populate`` - reserve with ``posix_fallocate``, ``mmap(MAP_POPULATE)``, ``torch.add(out=)``
* ``fallocate``     - the same without ``MAP_POPULATE`` (pages faulted in by the add)
* ``populate-write`` - ``mmap`` + ``madvise(MADV_POPULATE_WRITE)`` (allocates, errors instead of SIGBUS)
* ``pwrite-reused`` - ``pwrite`` as shipped, into a segment whose pages an earlier call already
  allocated (one file kept for the whole run): what segments reused between calls would cost

Columns: prepare (sum / reserve), map (mmap and populate), write (pwrite / add into the mapping),
total; medians over ``--repeats`` alternating runs. Every variant's bytes are checked against the sum.

usage: python benchmarks/shm_write_paths.py [--tokens 8192] [--hidden 256] [--layers 4] [--threads 2]
           [--repeats 12] [--json OUT]
"""

from __future__ import annotations

import argparse
import json
import mmap
import os
import secrets
import statistics
import time
from pathlib import Path

VARIANTS = ("pwrite", "fallocate+populate", "fallocate", "populate-write", "pwrite-reused")
MADV_POPULATE_WRITE = getattr(mmap, "MADV_POPULATE_WRITE", 23)  # Linux >= 5.14


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tokens", type=int, default=8192)
    ap.add_argument("--hidden", type=int, default=256)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=12)
    ap.add_argument("--json", type=Path)
    a = ap.parse_args()

    import torch

    from spec_compat.verify.compare import compare_identical

    torch.set_num_threads(a.threads)
    torch.manual_seed(0)
    hidden = [torch.randn(a.tokens, a.hidden) for _ in range(a.layers)]
    residual = [torch.randn(a.tokens, a.hidden) for _ in range(a.layers)]
    expected = [h + r for h, r in zip(hidden, residual)]
    nbytes = a.tokens * a.hidden * 4

    kept = f"/dev/shm/spec_compat_bench_{secrets.token_hex(4)}_kept"

    def run(variant: str) -> list[float]:
        reused = variant == "pwrite-reused"
        path = kept if reused else f"/dev/shm/spec_compat_bench_{secrets.token_hex(4)}"
        fd = os.open(path, os.O_CREAT | os.O_RDWR, 0o600)
        try:
            os.ftruncate(fd, a.layers * nbytes)
            parts = [0.0, 0.0, 0.0]
            for layer in range(a.layers):
                offset = layer * nbytes
                t0 = time.perf_counter()
                if variant.startswith("pwrite"):
                    s = hidden[layer] + residual[layer]
                    t1 = t2 = time.perf_counter()
                    view = memoryview(s.numpy()).cast("B")
                    while view:
                        n = os.pwrite(fd, view, offset)
                        view, offset = view[n:], offset + n
                    t3 = time.perf_counter()
                else:
                    if variant.startswith("fallocate"):
                        os.posix_fallocate(fd, offset, nbytes)
                    t1 = time.perf_counter()
                    flags = mmap.MAP_SHARED | (mmap.MAP_POPULATE if variant == "fallocate+populate" else 0)
                    mm = mmap.mmap(fd, nbytes, flags=flags, offset=offset)
                    if variant == "populate-write":
                        mm.madvise(MADV_POPULATE_WRITE)
                    t2 = time.perf_counter()
                    out = torch.frombuffer(mm, dtype=torch.float32).view(a.tokens, a.hidden)
                    torch.add(hidden[layer], residual[layer], out=out)
                    del out
                    mm.close()
                    t3 = time.perf_counter()
                parts[0] += t1 - t0
                parts[1] += t2 - t1
                parts[2] += t3 - t2
            for layer in range(a.layers):  # the bytes landed where the reader will look
                got = torch.empty(a.tokens, a.hidden)
                os.preadv(fd, [memoryview(got.numpy()).cast("B")], layer * nbytes)
                same = compare_identical(got, expected[layer])
                assert same, (variant, layer, same.detail)
            return parts
        finally:
            os.close(fd)
            if not reused:
                os.unlink(path)

    runs: dict[str, list[list[float]]] = {v: [] for v in VARIANTS}
    try:
        for v in VARIANTS:
            run(v)
        for _ in range(a.repeats):
            for v in VARIANTS:
                runs[v].append(run(v))
    finally:
        if os.path.exists(kept):
            os.unlink(kept)
    print(f"{a.layers} layers x {a.tokens} x {a.hidden} fp32 ({a.layers * nbytes / 2**20:.0f} MiB), "
          f"{a.threads} threads, {a.repeats} alternating runs; medians in ms")
    print(f"  {'variant':20s} {'prepare':>8s} {'map':>8s} {'write':>8s} {'total':>8s}")
    result = {}
    for v in VARIANTS:
        med = [statistics.median(1000 * r[i] for r in runs[v]) for i in range(3)]
        total = statistics.median(1000 * sum(r) for r in runs[v])
        result[v] = {"prepare_ms": med[0], "map_ms": med[1], "write_ms": med[2], "total_ms": total}
        print(f"  {v:20s} {med[0]:8.1f} {med[1]:8.1f} {med[2]:8.1f} {total:8.1f}")
    for v in VARIANTS[1:]:
        ratio = result[v]["total_ms"] / result["pwrite"]["total_ms"]
        result[v]["total_over_pwrite"] = ratio
        print(f"  {v} / pwrite: {ratio:.2f}x")
    if a.json:
        a.json.write_text(json.dumps({"args": {k: v for k, v in vars(a).items() if k != "json"},
                                      "variants": result}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
