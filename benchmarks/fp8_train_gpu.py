#!/usr/bin/env python3
"""Stock speculators 0.9.0 ``train`` at Kimi-K2.5 draft dims reading fp8 rows vs bf16 rows (issue #35, item 2).

One verifier and one prepared dataset (``spec09_train_gpu.py``'s synthetic Kimi-K2.5 verifier and data:
``--num-seqs`` samples of [T, 4, 7168] bf16), then the same samples written as hs-connectors 0.9.0's
``FP8HiddenStatesConnector._write_tensors`` writes them (float8_e4m3fn + one fp32 scale per token) into a
second data directory. Then, side by side in one run:

1. **Loader alone**: speculators' own ``create_train_val_loaders`` (``ArrowDataset`` + packing +
   ``shift_batch``) with hs-connectors' ``FileTransfer`` / ``FP8Transfer`` (which dequantizes in the
   worker), ``--num-workers`` workers, prefetch 4 (the trainer's default); batches/s over
   ``--loader-batches`` after the first, rounds interleaved bf16 / fp8.
2. **Trainer**: ``speculators train ... --hidden-states-backend file|fp8 --num-workers N
   --loss-implementation eager`` (the eager loss: no spec-compat needed, shorter compile; the loader is
   the subject), killed once step ``--max-steps - 1`` is logged. Per run: s/step (median after the
   warm-up) and the trainer's own per-step profile, where ``fetch_ms`` / ``fetch_frac`` is the time
   the step waits for its batch: the GPU's idle share caused by the loader.

The files sit in the page cache (the machine has far more memory than the data): this measures the
loaders' CPU work (read + dequantize), not a disk. Writes JSON (``--out``) and prints ``RESULT_JSON``.

usage: python benchmarks/fp8_train_gpu.py [--num-seqs 40] [--max-steps 24] [--num-workers 4] [--out F]
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import shutil
import statistics
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent


def _load(name: str):
    spec = importlib.util.spec_from_file_location(name, HERE / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod
    spec.loader.exec_module(mod)  # type: ignore[union-attr]
    return mod


spec09 = _load("spec09_train_gpu")


def write_fp8(bf16_dir: Path, fp8_dir: Path) -> dict:
    """``fp8_dir``: the prepared dataset of ``bf16_dir`` with every hidden-states file rewritten as
    hs-connectors' fp8 connector writes it; the largest per-token relative error of the round trip."""
    import torch
    from safetensors.torch import load_file

    from hs_connectors.fp8_utils import SCALES_KEY, dequantize_fp8_tensor

    sys.path.insert(0, str(HERE))
    from fp8_rows_gpu import fp8_connector

    write = fp8_connector()._write_tensors
    shutil.copytree(bf16_dir, fp8_dir, ignore=shutil.ignore_patterns("hidden_states"))
    (fp8_dir / "hidden_states").mkdir()

    class Ready:
        def synchronize(self) -> None:
            return None

    worst, sizes = 0.0, {"bf16": 0, "fp8": 0}
    for src in sorted((bf16_dir / "hidden_states").glob("hs_*.safetensors")):
        tensors = load_file(str(src))
        dst = fp8_dir / "hidden_states" / src.name
        write(tensors, Ready(), str(dst), None)
        back = load_file(str(dst))
        hs = tensors["hidden_states"].float()
        deq = dequantize_fp8_tensor(back["hidden_states"], back[SCALES_KEY], torch.float32)
        amax = hs.abs().amax(dim=(1, 2), keepdim=True).clamp(min=1e-12)
        worst = max(worst, float(((deq - hs).abs() / amax).max()))
        if not torch.isfinite(deq).all() or back["hidden_states"].dtype != torch.float8_e4m3fn:
            raise SystemExit(f"{dst}: not a finite float8_e4m3fn payload")
        sizes["bf16"] += src.stat().st_size
        sizes["fp8"] += dst.stat().st_size
    return {"files": len(list((fp8_dir / "hidden_states").iterdir())), "bytes": sizes,
            "fp8_over_bf16_bytes": round(sizes["fp8"] / sizes["bf16"], 4),
            "max_abs_err_over_token_amax": worst}


def loader_rate(ddir: Path, fmt: str, args) -> float:
    """Batches/s of speculators' training loader over ``ddir`` (after the first batch)."""
    import torch
    from hs_connectors.transfer import FileTransfer, FP8Transfer
    from speculators.models.eagle3.data import shift_batch
    from speculators.train.dataloader import create_train_val_loaders

    transfer = (FP8Transfer if fmt == "fp8" else FileTransfer)(ddir / "hidden_states")
    train, _val = create_train_val_loaders(
        data_path=str(ddir), total_seq_len=args.seq_len, hidden_states_dtype=torch.bfloat16, transfer=transfer,
        vllm_endpoint=None, on_missing="raise", verifier_name_or_path=None, request_timeout=None, max_retries=0,
        generation_validation_retries=0, max_consecutive_generation_failures=1, hidden_size=args.hidden,
        num_target_layers=args.num_aux, num_workers=args.num_workers, prefetch_factor=4, preprocess=shift_batch)
    it = iter(train)
    next(it)
    t0, n = time.perf_counter(), 0
    for _ in range(args.loader_batches):
        try:
            next(it)
        except StopIteration:
            break
        n += 1
    rate = n / (time.perf_counter() - t0)
    del it
    return rate


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--work-dir", default="/tmp/fp8train")
    ap.add_argument("--out", default="benchmarks/results/fp8_train_gpu.json")
    spec09.add_run_args(ap, num_seqs=40, max_steps=24, deadline_s=560.0)
    ap.add_argument("--num-workers", type=int, default=4)
    ap.add_argument("--loader-batches", type=int, default=16)
    ap.add_argument("--loader-rounds", type=int, default=2)
    ap.add_argument("--skip-train", action="store_true", help="loader figures only")
    ap.add_argument("--loader-workers", default="", help="also time the loaders alone with these worker counts (comma list)")
    ap.add_argument("extra", nargs="*", help="extra trainer flags (after --)")
    args = ap.parse_args()
    args.num_aux = len(args.target_layer_ids.split(","))
    args.label = ""

    t_script = time.perf_counter()
    import torch

    device = "cuda" if torch.cuda.is_available() else "cpu"
    work = Path(args.work_dir)
    shutil.rmtree(work, ignore_errors=True)
    vdir, dirs = work / "verifier", {"bf16": work / "data-bf16", "fp8": work / "data-fp8"}
    out = {"issue": "#35 item 2", "script": "benchmarks/fp8_train_gpu.py", "device": spec09.device_info(),
           "versions": spec09.versions(), "num_workers": args.num_workers}
    spec09.build_verifier(vdir, args, device)
    t0 = time.perf_counter()
    out["data"] = spec09.build_data(dirs["bf16"], args, device)
    out["fp8_data"] = write_fp8(dirs["bf16"], dirs["fp8"])
    spec09.log(f"data written in {time.perf_counter() - t0:.1f} s: {out['fp8_data']}")

    rates: dict[str, list[float]] = {"bf16": [], "fp8": []}
    for rnd in range(args.loader_rounds):
        for fmt in (("bf16", "fp8") if rnd % 2 == 0 else ("fp8", "bf16")):
            rates[fmt].append(loader_rate(dirs[fmt], fmt, args))
            spec09.log(f"loader {fmt} round {rnd + 1}: {rates[fmt][-1]:.2f} batches/s")
    out["loader"] = {fmt: {"batches_per_s": [round(r, 3) for r in v],
                           "tokens_per_s_median": round(statistics.median(v) * args.seq_len)} for fmt, v in rates.items()}
    out["loader"]["fp8_over_bf16"] = round(statistics.median(rates["fp8"]) / statistics.median(rates["bf16"]), 3)
    scaling: dict[str, dict[str, float]] = {}
    for workers in [int(w) for w in args.loader_workers.split(",") if w]:
        a = argparse.Namespace(**vars(args))
        a.num_workers = workers
        scaling[str(workers)] = {fmt: round(loader_rate(dirs[fmt], fmt, a), 3) for fmt in ("fp8", "bf16")}
        spec09.log(f"loader with {workers} workers: {scaling[str(workers)]} batches/s")
    if scaling:
        out["loader_batches_per_s_by_workers"] = scaling

    if not args.skip_train:
        runs = {}
        for fmt in ("bf16", "fp8"):
            res: dict = {"format": fmt}
            backend = "fp8" if fmt == "fp8" else "file"
            a = argparse.Namespace(**vars(args))
            a.extra = ["--hidden-states-backend", backend, "--num-workers", str(args.num_workers),
                       "--loss-implementation", "eager", *args.extra]
            rwork = work / f"run-{fmt}"
            rwork.mkdir()
            rc, timed = spec09.run_trainer(a, res, work=rwork, vdir=vdir, ddir=dirs[fmt], t_script=time.perf_counter(),
                                           out_path=rwork / "run.json", log_path=Path(args.out).with_suffix(f".{fmt}.log"),
                                           stop_after_step=args.max_steps - 1)
            res["returncode"] = rc
            runs[fmt] = {k: res.get(k) for k in ("command", "returncode", "timing", "phases_s", "memory",
                                                 "profile_median_after_warmup", "error_tail", "step_ms_all")}
            spec09.log(f"train {fmt}: rc {rc}, timing {res.get('timing')}")
        out["train"] = runs
        tb, tf = (runs[f].get("timing") or {} for f in ("bf16", "fp8"))
        if tb and tf:
            pb, pf = (runs[f]["profile_median_after_warmup"] for f in ("bf16", "fp8"))
            out["train_fp8_over_bf16_step_time"] = round(tf["median_s_per_step"] / tb["median_s_per_step"], 3)
            out["gpu_idle_waiting_for_batch"] = {"bf16": pb.get("fetch_frac"), "fp8": pf.get("fetch_frac")}
    out["seconds"] = round(time.perf_counter() - t_script, 1)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(out, indent=1) + "\n")
    print("RESULT_JSON " + json.dumps({k: out.get(k) for k in (
        "fp8_data", "loader", "loader_batches_per_s_by_workers", "train_fp8_over_bf16_step_time",
        "gpu_idle_waiting_for_batch")}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
