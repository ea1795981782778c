"""The extraction connector's file write inside the engine step vs on its writer thread, at real
widths on a GPU: what the background writer (spec_compat/shims/hidden_states/writer.py) wins back.

Each step stands for one extraction step of rank 0: a forward of ``--tflop`` TFLOP of bf16 matmuls
(default 33: Kimi-K2.5's 32B active parameters x 2 x 4096 tokens / 8 tensor-parallel ranks), then
the prompt's rows [T, L, H] gathered on the device (a copy) and written as the connector writes
them (:func:`hidden_states_tensors` + an atomic safetensors write), in one of three modes,
interleaved in rounds:

* ``none``   - forward + device gather only (no file): the ceiling;
* ``inline`` - the connector before 2026-12-04: rows to the host (``.cpu()``) and the write inside
  the step;
* ``thread`` - the connector now: :func:`host_rows` (pinned copy queued on the stream, an event)
  and :meth:`BackgroundWriter.submit` (the step takes the lock and queues the write).

A round runs ``--steps`` steps per mode (order rotates), drains the writer, then deletes the files
(the client moves them away in real use).  Prints steps/s per mode, the median over rounds of
``thread / none``, ``inline / none`` and ``thread / inline``, and the write alone (ms per file).

usage: python benchmarks/writer_overlap.py [--tokens 4096] [--layers 4] [--hidden 7168]
       [--tflop 33] [--steps 8] [--rounds 5] [--dir /tmp/hs] [--json OUT]
Needs torch and safetensors; runs on CUDA when present (the CPU forward is far too slow for the
default size: pass a small --tflop there).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from spec_compat.shims.hidden_states.files import hidden_states_tensors, write_atomically  # noqa: E402
from spec_compat.shims.hidden_states.writer import BackgroundWriter, host_rows  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tokens", type=int, default=4096)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--hidden", type=int, default=7168)
    ap.add_argument("--tflop", type=float, default=33.0, help="forward work per step (TFLOP)")
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--dir", default="/tmp/hs-writer-bench")
    ap.add_argument("--json")
    args = ap.parse_args()

    import torch

    dev = "cuda" if torch.cuda.is_available() else "cpu"
    sync = torch.cuda.synchronize if dev == "cuda" else (lambda: None)
    T, L, H = args.tokens, args.layers, args.hidden
    x = torch.randn(T, H, device=dev, dtype=torch.bfloat16)
    w = torch.randn(H, H, device=dev, dtype=torch.bfloat16) / H ** 0.5
    per_mm = 2 * T * H * H / 1e12
    n_mm = max(1, round(args.tflop / per_mm))
    cache = torch.randn(T, L, H, device=dev, dtype=torch.bfloat16)  # the rows of one prompt
    ids = list(range(T))
    meta = {"layer_ids": ",".join(map(str, range(1, L + 1)))}
    storage = Path(args.dir)
    shutil.rmtree(storage, ignore_errors=True)
    storage.mkdir(parents=True)

    def forward() -> None:
        h = x
        for _ in range(n_mm):
            h = h @ w
        h.sum().item()  # the sampler's sync at the end of a step

    def rows() -> "torch.Tensor":
        return cache.clone()  # the connector's gather: a copy on the cache's device

    writer = BackgroundWriter()
    counter = [0]

    def step(mode: str) -> None:
        forward()
        r = rows()
        if mode == "none":
            return
        counter[0] += 1
        path = str(storage / f"r{counter[0]}.safetensors")
        if mode == "inline":
            write_atomically(path, hidden_states_tensors(r.cpu(), ids), meta)
        else:
            host, ready = host_rows(r)
            writer.submit(path, hidden_states_tensors(host, ids), meta, ready)

    # warm-up and the parts alone
    for _ in range(2):
        forward()
    sync()
    t0 = time.perf_counter(); forward(); fwd_ms = (time.perf_counter() - t0) * 1e3
    t0 = time.perf_counter(); r = rows().cpu(); copy_ms = (time.perf_counter() - t0) * 1e3
    write_ms = []
    for k in range(3):
        t0 = time.perf_counter()
        write_atomically(str(storage / f"alone{k}.safetensors"), hidden_states_tensors(r, ids), meta)
        write_ms.append((time.perf_counter() - t0) * 1e3)
    file_mb = os.path.getsize(storage / "alone0.safetensors") / 1e6
    print(f"device {dev} ({torch.cuda.get_device_name() if dev == 'cuda' else 'cpu'}), T={T} L={L} H={H} bf16, "
          f"file {file_mb:.0f} MB; forward {n_mm} matmuls = {n_mm * per_mm:.1f} TFLOP: {fwd_ms:.1f} ms; "
          f"row copy {copy_ms:.1f} ms; write alone {statistics.median(write_ms):.1f} ms", flush=True)

    modes = ["none", "inline", "thread"]
    per_round: list[dict[str, float]] = []
    for rnd in range(args.rounds):
        order = modes[rnd % 3:] + modes[:rnd % 3]
        rates: dict[str, float] = {}
        for mode in order:
            sync()
            t0 = time.perf_counter()
            for _ in range(args.steps):
                step(mode)
            writer.drain()  # the round counts until every file is in place
            rates[mode] = args.steps / (time.perf_counter() - t0)
            for f in storage.iterdir():
                f.unlink()
        per_round.append(rates)
        print(f"round {rnd + 1}: " + ", ".join(f"{m} {rates[m]:.2f} steps/s" for m in modes)
              + f"; thread/none {rates['thread'] / rates['none']:.3f}, inline/none {rates['inline'] / rates['none']:.3f}",
              flush=True)
    writer.close()

    def med(a: str, b: str) -> float:
        return round(statistics.median(r[a] / r[b] for r in per_round), 3)

    summary = {"device": torch.cuda.get_device_name() if dev == "cuda" else "cpu", "tokens": T, "layers": L,
               "hidden": H, "file_mb": round(file_mb, 1), "forward_ms": round(fwd_ms, 1), "row_copy_ms": round(copy_ms, 1),
               "write_alone_ms": round(statistics.median(write_ms), 1), "steps": args.steps, "rounds": args.rounds,
               "thread_over_none": med("thread", "none"), "inline_over_none": med("inline", "none"),
               "thread_over_inline": med("thread", "inline"), "per_round": per_round}
    print(f"median of {args.rounds} rounds: thread/none {summary['thread_over_none']}, inline/none "
          f"{summary['inline_over_none']}, thread/inline {summary['thread_over_inline']}")
    if args.json:
        Path(args.json).write_text(json.dumps(summary, indent=1) + "\n")
    shutil.rmtree(storage, ignore_errors=True)


if __name__ == "__main__":
    main()
