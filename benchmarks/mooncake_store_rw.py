#!/usr/bin/env python3
"""Put / get MB/s of hs-connectors 0.9.0's Mooncake store vs the file backend's safetensors files, at
the Llama fixture's and Kimi-K2.5's row widths (issue #33, item 5).

A real ``mooncake_master`` (the wheel's binary, ``extract_hidden_states_server._mooncake_master``);
the writer is this process, with hs-connectors' ``MooncakeHiddenStatesStore`` configured as its
connector is (tcp); the reader is a second process with its own store client (as the trainer is),
reading each sample with ``get_sample`` (the call speculators' loader makes: ``is_exist`` polling,
then ``get_into`` a registered buffer, then the tensors cut out), then touching every page of it. The manifest is built as the
connector builds it (``packed_layout`` of ``hidden_states`` [T, L, H] and ``token_ids`` [T]).
The file side writes what the backport writes (``hidden_states`` + ``token_ids`` with safetensors,
no fsync, so the page cache holds it) and reads it back in the reader process with
``safetensors.torch.load_file`` (which maps the file: the page touch is the read).

Rounds alternate the order of the two backends. Prints, per width: put MB/s, get MB/s (the reader's
wall time per sample, including its wait for the object), their ratio to the file's, and writes JSON.

usage: python benchmarks/mooncake_store_rw.py [--rounds 3] [--samples 6] [--json OUT]
(run in the server environment of a speculators 0.9.0 cell: hs-connectors and Mooncake installed)
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import multiprocessing as mp
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
#: name: (tokens, layers, hidden, dtype name); bytes per token: Llama fixture 4 x 256 x fp32, Kimi 4 x 7168 x bf16
WIDTHS = {"llama": (256, 4, 256, "float32"), "kimi-k25": (2048, 4, 7168, "bfloat16")}
SEGMENT = 1 << 30


def store_config(master: str) -> dict[str, Any]:
    return {"local_hostname": "127.0.0.1", "metadata_server": "P2PHANDSHAKE", "master_server_address": master,
            "global_segment_size": SEGMENT, "local_buffer_size": 512 << 20, "protocol": "tcp"}


def manifest(handle: str, T: int, L: int, H: int, dtype: Any) -> dict[str, Any]:
    import torch
    from hs_connectors.mooncake_store import VERSION, packed_layout

    spec, total = packed_layout({"hidden_states": ([T, L, H], dtype), "token_ids": ([T], torch.int64)})
    return {"handle": handle, "version": VERSION, "tensors": spec,
            "metadata": {"num_tokens": T, "total_aligned_bytes": total, "extract_mode": "prompt_only"}}


def reader(master: str, jobs: Any, results: Any) -> None:
    """The trainer's side: one store client; each job is ("mooncake", manifest) or ("file", path)."""
    from hs_connectors.mooncake_store import MooncakeHiddenStatesStore, MooncakeStoreConfig
    from safetensors.torch import load_file

    store = MooncakeHiddenStatesStore(MooncakeStoreConfig.from_dict(store_config(master))).setup()
    results.put(("ready", 0.0, 0))
    while True:
        job = jobs.get()
        if job is None:
            return
        kind, what = job
        t0 = time.perf_counter()
        tensors = store.get_sample(what) if kind == "mooncake" else load_file(what)
        hs = tensors["hidden_states"]
        # touch every page: load_file maps the file, so its tensors are read on first use (as the loader's collate does)
        float(hs.reshape(-1)[:: max(1, 4096 // hs.element_size())].float().sum())
        results.put((kind, time.perf_counter() - t0, int(hs.numel() * hs.element_size())))
        if kind == "mooncake":
            store.delete_sample(what["handle"])


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--samples", type=int, default=6, help="samples per width, backend and round")
    ap.add_argument("--widths", default=",".join(WIDTHS))
    ap.add_argument("--json")
    args = ap.parse_args()

    import torch
    from hs_connectors.mooncake_store import MooncakeHiddenStatesStore, MooncakeStoreConfig
    from safetensors.torch import save_file

    spec = importlib.util.spec_from_file_location("ehs_server_bench", HERE / "extract_hidden_states_server.py")
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)  # type: ignore[union-attr]
    work = Path(tempfile.mkdtemp(prefix="mooncake-rw-"))
    os.environ["MOONCAKE_LOCAL_HOSTNAME"] = "127.0.0.1"
    master_proc, master = bench._mooncake_master(work)
    ctx = mp.get_context("spawn")
    jobs, results = ctx.Queue(), ctx.Queue()
    proc = ctx.Process(target=reader, args=(master, jobs, results), daemon=True)
    proc.start()
    try:
        results.get(timeout=120)
        store = MooncakeHiddenStatesStore(MooncakeStoreConfig.from_dict(store_config(master))).setup()
        out: dict[str, Any] = {"master": "mooncake_master (mooncake-transfer-engine-non-cuda), tcp, one host",
                               "samples": args.samples, "rounds": args.rounds, "widths": {}}
        for name in args.widths.split(","):
            T, L, H, dt = WIDTHS[name]
            dtype = getattr(torch, dt)
            rows = torch.randn(T, L, H).to(dtype)
            ids = torch.arange(T, dtype=torch.int64)
            mb = rows.numel() * rows.element_size() / 1e6
            per: dict[str, dict[str, list[float]]] = {b: {"put": [], "get": []} for b in ("file", "mooncake")}
            for rnd in range(args.rounds):
                for backend in (("file", "mooncake") if rnd % 2 == 0 else ("mooncake", "file")):
                    puts, gets = [], []
                    for i in range(args.samples):
                        key = f"{name}-{rnd}-{i}"
                        t0 = time.perf_counter()
                        if backend == "mooncake":
                            m = manifest(key, T, L, H, dtype)
                            store.put_sample(m, {"hidden_states": rows, "token_ids": ids})
                            job: Any = ("mooncake", m)
                        else:
                            path = str(work / f"{key}.safetensors")
                            save_file({"hidden_states": rows, "token_ids": ids}, path)
                            job = ("file", path)
                        puts.append(time.perf_counter() - t0)
                        jobs.put(job)
                        kind, seconds, nbytes = results.get(timeout=300)
                        assert kind == backend and nbytes == rows.numel() * rows.element_size(), (kind, nbytes)
                        gets.append(seconds)
                        if backend == "file":
                            os.unlink(job[1])
                    per[backend]["put"].append(mb / statistics.median(puts))
                    per[backend]["get"].append(mb / statistics.median(gets))
                print(f"{name} round {rnd + 1}: " + ", ".join(
                    f"{b} put {per[b]['put'][-1]:.0f} / get {per[b]['get'][-1]:.0f} MB/s" for b in per), flush=True)
            med = {b: {op: round(statistics.median(v), 1) for op, v in ops.items()} for b, ops in per.items()}
            ms = {b: {op: round(mb / v * 1e3, 2) for op, v in ops.items()} for b, ops in med.items()}
            out["widths"][name] = {
                "tokens": T, "layers": L, "hidden": H, "dtype": dt, "sample_mb": round(mb, 2),
                "bytes_per_token": L * H * rows.element_size(), "mb_per_s_median": med, "ms_per_sample": ms,
                "mooncake_over_file": {op: round(med["mooncake"][op] / med["file"][op], 3) for op in ("put", "get")},
                "per_round": per}
        print("RESULT_JSON " + json.dumps({k: {kk: vv for kk, vv in v.items() if kk != "per_round"}
                                           for k, v in out["widths"].items()}), flush=True)
        if args.json:
            Path(args.json).write_text(json.dumps(out, indent=1) + "\n")
    finally:
        jobs.put(None)
        proc.join(30)
        master_proc.terminate()
        master_proc.wait(30)
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
