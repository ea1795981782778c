#!/usr/bin/env python3
"""Where the time of one training step goes: (b) the ``single-device-bf16`` shim vs (c) pure bf16.

Status (2026-12-03): written for issue #22 item 4; ran on one H200 (``nvidia-h200`` device machine,
torch 2.11.0+cu130) on 2026-12-03: a CUDA smoke test (``--tiny --device cuda --seq-len 256``), then two
passes at T=4096 on fresh machines (``--timed 10``, then ``--timed 20`` with b5).  After pass 1, two fixes:
GPU work launched before the profiled window (the warm-up step's backward tail, clip and AdamW, still
queued when the window opens) is left out instead of counted as "other", and a prefetch segment's
first copy is no longer issued during the previous segment's last (profiled) step.  Results:
``benchmarks/results/h200-train-step-profile.json`` (pass 2), ``...-pass1.json``; RESULTS.md ›
Training step › 2026-12-03 profile.

Reuses ``benchmarks/train_step.py`` (imported, unchanged): the same synthetic verifier, model
(``Eagle3DraftModel`` at Kimi-K2.5 draft dims), pinned batches, stock ``Trainer.train_epoch`` and
per-step CUDA-event timing (``train_step.child_main``).  Around it, in the child processes only:

* a step schedule of *segments*, each one a variant of the same process's training loop:
  ``trans`` steps (untimed: a recompile or a pipeline start), ``timed`` steps (no profiler:
  the ms/step reported), then one profiler warm-up step and ``--prof-steps`` profiled steps
  (``torch.profiler``, CPU + CUDA activities);
* ``record_function`` ranges around the model call (``sp::forward``), ``loss.backward()``
  (``sp::backward``) and ``torch.nn.utils.clip_grad_norm_`` (``sp::clip_grad_norm_``); AdamW's
  own ``Optimizer.step#AdamW.step`` range marks the optimizer.  Every kernel is attributed to the
  range its launch fell in (by time: the main thread blocks in backward while the autograd thread
  launches), host-to-device copies by their memcpy kind.

Segments, mode b (one process, the shim applied):
  b        the shim as it is;
  b2       + the batch's ``hidden_states`` cast to bf16 on the host before the copy (as a collate
           step would) and the frozen ``verifier_lm_head`` weight kept in bf16: both are consumed
           only by autocast matmuls, which cast them to bf16 anyway (same values, no change in
           the training math);
  b3       b2 + ``clip_grad_norm_`` folded into the fused AdamW: the total norm is computed as
           before, the clip factor is handed to the fused kernel as ``grad_scale`` (grad / (1/c)
           instead of a separate ``grad *= c`` pass over the fp32 gradients);
  b4       b3 + the next batch copied to the GPU on a side stream while this step computes;
  b5       b2 + the side-stream copy (b4 without the clip fold);
  b_again  the shim as it is again (drift control; expected to reuse the first compiled graph).
Mode c (one process, the shim disabled, model and data in bf16):
  c        the anchor as measured in RESULTS.md; c4: c + the side-stream prefetch; c_again.

Usage (device): python benchmarks/train_step_profile.py --seq-len 4096 --out results.json
Smoke test: python benchmarks/train_step_profile.py --tiny --device cuda --seq-len 256 --timed 2 --prof-steps 1
Arguments not listed here go to train_step.py's parser (dims, --warmup, --lr, ...).
"""

from __future__ import annotations

import argparse
import bisect
import gzip
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import train_step as ts  # noqa: E402

PLANS = {
    # name, options, transition steps, profiled
    "b": [
        ("b", {}, 1, True),
        ("b2", {"bf16_inputs": True}, 2, True),
        ("b3", {"bf16_inputs": True, "fold_clip": True}, 1, True),
        ("b4", {"bf16_inputs": True, "fold_clip": True, "prefetch": True}, 2, True),
        ("b5", {"bf16_inputs": True, "prefetch": True}, 2, True),
        ("b_again", {}, 2, False),
    ],
    "c": [
        ("c", {}, 1, True),
        ("c4", {"prefetch": True}, 2, True),
        ("c_again", {}, 2, False),
    ],
}
SEG_DESC = {
    "b": "spec-compat single-device-bf16 shim as is (autocast, fp32 master weights, fused AdamW)",
    "b2": "b + hidden_states cast to bf16 on the host before the H2D copy + frozen verifier_lm_head weight in bf16",
    "b3": "b2 + clip_grad_norm_ folded into the fused AdamW (clip factor passed as grad_scale)",
    "b4": "b3 + next batch copied H2D on a side stream during the current step",
    "b5": "b2 + next batch copied H2D on a side stream (b4 without the clip fold)",
    "b_again": "b again (drift control)",
    "c": "pure bf16 anchor (model.to(bf16), bf16 data, stock foreach AdamW on bf16 params)",
    "c4": "c + next batch copied H2D on a side stream during the current step",
    "c_again": "c again (drift control)",
}


def my_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], allow_abbrev=False)
    p.add_argument("--seq-len", type=int, default=4096)
    p.add_argument("--modes", default="b,c")
    p.add_argument("--timed", type=int, default=10, help="timed (unprofiled) steps per segment")
    p.add_argument("--prof-steps", type=int, default=3, help="profiled steps per segment (after 1 profiler warm-up)")
    p.add_argument("--top", type=int, default=30, help="top kernels kept per segment")
    p.add_argument("--out", default=None, help="result JSON path")
    p.add_argument("--trace-out", default=None, help="copy gzipped chrome traces of these segments here")
    p.add_argument("--keep-traces", default="b,c", help="segments whose traces go to --trace-out")
    p.add_argument("--work-dir", default=None)
    p.add_argument("--phase-timeout", type=float, default=560.0)
    # internal
    p.add_argument("--prof-child", nargs=2, metavar=("MODE", "SEQ"), help=argparse.SUPPRESS)
    p.add_argument("--psync", help=argparse.SUPPRESS)
    p.add_argument("--ptag", help=argparse.SUPPRESS)
    return p


def build_labels(plan, warmup: int, timed: int, prof_k: int) -> list[list[str]]:
    labels = [[plan[0][0], "warmup"] for _ in range(warmup)]
    for name, _opts, trans, prof in plan:
        labels += [[name, "trans"] for _ in range(trans)]
        labels += [[name, "timed"] for _ in range(timed)]
        if prof:
            labels += [[name, "profw"]] + [[name, "prof"] for _ in range(prof_k)]
    return labels


# --------------------------------------------------------------------------- child
def install(mode: str, plan, labels, prof_k: int, trace_dir: Path, info: dict) -> None:
    """Patch, in this child process only: Trainer.train_epoch (set-up around the stock loop),
    torch.nn.utils.clip_grad_norm_ (range + optional fold), torch.Tensor.backward (range)."""
    import torch
    from torch.profiler import ProfilerActivity, profile, record_function, schedule

    import speculators.train.trainer as tr

    opts = {name: o for name, o, _t, _p in plan}
    n = len(labels)
    st = {"count": 0, "prof": None, "trainer": None, "w32": None, "bf16_cache": {}, "seg_peak": {}, "bf16_ok": False,
          "fold_used": 0, "prof_files": {}}
    info.update(labels=labels, seg_options=opts, seg_peak_gib=st["seg_peak"], prof_files=st["prof_files"])

    def opt_of(i: int) -> dict:
        return opts[labels[min(i, n - 1)][0]]

    # -- clip_grad_norm_: a range, and in fold_clip segments the factor goes to the fused AdamW
    orig_clip = torch.nn.utils.clip_grad_norm_

    def clip(parameters, max_norm, norm_type=2.0, error_if_nonfinite=False, foreach=None):
        with record_function("sp::clip_grad_norm_"):
            tr_ = st["trainer"]
            fused = tr_ is not None and bool(tr_.opt.param_groups[0].get("fused"))
            if not (opt_of(st["count"]).get("fold_clip") and fused):
                return orig_clip(parameters, max_norm, norm_type, error_if_nonfinite, foreach)
            with torch.no_grad():
                if isinstance(parameters, torch.Tensor):
                    parameters = [parameters]
                grads = [p.grad for p in parameters if p.grad is not None]
                total = torch.nn.utils.get_total_norm(grads, norm_type, error_if_nonfinite, foreach)
                coef = torch.clamp(float(max_norm) / (total + 1e-6), max=1.0)  # as clip_grads_with_norm_
                # fused AdamW divides each gradient by grad_scale inside its one kernel
                tr_.opt.grad_scale = torch.reciprocal(coef).to(torch.float32)
                st["fold_used"] += 1
                return total

    torch.nn.utils.clip_grad_norm_ = clip

    orig_backward = torch.Tensor.backward

    def backward(self, *a, **kw):
        with record_function("sp::backward"):
            return orig_backward(self, *a, **kw)

    torch.Tensor.backward = backward

    class Feed:
        """The Trainer's loader, per step: the host batch (hidden_states in bf16 where the segment
        says so), or a batch already copied on a side stream one step ahead."""

        def __init__(self, loader):
            self.loader = loader
            self.batch_sampler = getattr(loader, "batch_sampler", None)
            self.dataset = getattr(loader, "dataset", None)

        def __len__(self):
            return len(self.loader)

        def host_batch(self, i: int, b: dict) -> dict:
            if not (st["bf16_ok"] and opt_of(i).get("bf16_inputs")) or b["hidden_states"].dtype == torch.bfloat16:
                return b
            key = id(b["hidden_states"])
            hs = st["bf16_cache"].get(key)
            if hs is None:  # filled before the first step for both pre-built batches
                hs = b["hidden_states"].to(torch.bfloat16)
                hs = hs.pin_memory() if b["hidden_states"].is_pinned() else hs
                st["bf16_cache"][key] = hs
            return {**b, "hidden_states": hs}

        def __iter__(self):
            cuda = torch.cuda.is_available() and info["cuda"]
            side = torch.cuda.Stream() if cuda else None
            dev = torch.device("cuda", 0) if cuda else None
            ready: dict = {}
            src = iter(self.loader)
            i = 0
            cur = next(src, None)
            while cur is not None:
                nxt = next(src, None)
                out = ready.pop(i, None)
                if out is not None:
                    main = torch.cuda.current_stream()
                    main.wait_stream(side)
                    for v in out.values():
                        if isinstance(v, torch.Tensor):
                            v.record_stream(main)
                else:
                    out = self.host_batch(i, cur)
                # prefetch only within one segment: a segment's last step must not carry the next
                # segment's copy (it would land in its profiled window)
                same = labels[min(i, n - 1)][0] == labels[min(i + 1, n - 1)][0]
                if cuda and nxt is not None and same and opt_of(i + 1).get("prefetch"):
                    hb = self.host_batch(i + 1, nxt)
                    with torch.cuda.stream(side):
                        ready[i + 1] = {k: v.to(dev, non_blocking=True) if isinstance(v, torch.Tensor) else v
                                        for k, v in hb.items()}
                yield out
                cur = nxt
                i += 1

    def set_frozen_bf16(model, on: bool) -> None:
        w = model.verifier_lm_head.weight
        if on and w.dtype != torch.bfloat16:
            st["w32"] = w.data
            w.data = w.data.to(torch.bfloat16)
        elif not on and st["w32"] is not None and w.dtype != st["w32"].dtype:
            w.data = st["w32"]

    def on_trace(seg):
        def handler(prof):
            t0 = time.perf_counter()
            path = trace_dir / f"trace.{info['tag']}.{seg}.json"
            prof.export_chrome_trace(str(path))
            st["prof_files"][seg] = str(path)
            print(f"[profile] {seg}: trace {path.stat().st_size / 2**20:.1f} MiB in {time.perf_counter() - t0:.1f}s",
                  flush=True)
        return handler

    def post(opt, _args, _kwargs):
        i = st["count"]
        st["count"] += 1
        opt.__dict__.pop("grad_scale", None)
        seg, phase = labels[i]
        nxt = labels[i + 1] if i + 1 < n else None
        cuda = info["cuda"]
        if phase in ("profw", "prof") and st["prof"] is not None:
            if nxt is None or nxt[1] != "prof":
                if cuda:
                    torch.cuda.synchronize()
                st["prof"].step()  # ends the last active step: trace saved
                st["prof"].stop()
                st["prof"] = None
            else:
                st["prof"].step()
        if nxt is not None and nxt[0] != seg:
            if cuda:
                st["seg_peak"][seg] = torch.cuda.max_memory_allocated() / 2**30
                torch.cuda.reset_peak_memory_stats()
            if st["bf16_ok"]:
                set_frozen_bf16(st["trainer"].model, bool(opts[nxt[0]].get("bf16_inputs")))
        if nxt is not None and nxt[1] == "profw":
            if cuda:
                torch.cuda.synchronize()
            acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
            st["prof"] = profile(activities=acts, schedule=schedule(wait=0, warmup=1, active=prof_k, repeat=1),
                                 on_trace_ready=on_trace(nxt[0]))
            st["prof"].start()

    orig_epoch = tr.Trainer.train_epoch

    def train_epoch(self, epoch):
        st["trainer"] = self
        # bf16 inputs / frozen weight only under the shim's autocast (CUDA); elsewhere they would not type-check
        st["bf16_ok"] = mode == "b" and bool(self.__dict__.get("_spec_compat_fused_adamw"))
        info["bf16_inputs_active"] = st["bf16_ok"]
        info["opt_fused"] = bool(self.opt.param_groups[0].get("fused"))
        info["opt_foreach"] = self.opt.param_groups[0].get("foreach")
        info["verifier_lm_head_dtype"] = str(self.model.verifier_lm_head.weight.dtype)
        loader = self.train_loader
        feed = Feed(loader)
        if st["bf16_ok"] and any(o.get("bf16_inputs") for o in opts.values()) and feed.dataset is not None:
            for k in range(min(2, len(feed.dataset))):
                feed.host_batch(next(j for j, lab in enumerate(labels) if opts[lab[0]].get("bf16_inputs")),
                                feed.dataset[k])
        fwd = self.model.forward

        def forward(*a, **kw):
            with record_function("sp::forward"):
                return fwd(*a, **kw)

        self.model.forward = forward
        self.train_loader = feed
        hook = self.opt.register_step_post_hook(post)
        try:
            return orig_epoch(self, epoch)
        finally:
            hook.remove()
            self.train_loader = loader
            self.model.forward = fwd
            if info["cuda"]:
                st["seg_peak"][labels[-1][0]] = torch.cuda.max_memory_allocated() / 2**30
            info["fold_clip_steps"] = st["fold_used"]

    tr.Trainer.train_epoch = train_epoch


_MM = re.compile(r"gemm|nvjet|cutlass|xmma|cublas|splitk|wgmma", re.I)
_CAST_OK = {"", "add", "view", "clone", "t", "permute", "transpose", "sum", "copy", "expand", "squeeze", "unsqueeze"}


def kernel_class(name: str) -> str:
    low = name.lower()
    if not low.startswith("triton") and _MM.search(low):
        return "matmul"
    if low.startswith("triton_tem") or "flex_attention" in low or "flash" in low:
        return "attention"
    m = re.match(r"triton_(?:poi|red|per)_fused_(.*?)(?:_\d+)?$", name)
    if m:
        body = m.group(1)
        if "_to_copy" in body or body.startswith("to_copy"):
            rest = body.replace("_to_copy", " ").replace("to_copy", " ").replace("_", " ").split()
            if all(tok in _CAST_OK for tok in rest):
                return "cast"
        return "other"
    if "copy_kernel" in low or "to_copy" in low:
        return "cast"
    return "other"


def range_label(name: str) -> str | None:
    if name == "sp::forward":
        return "fwd"
    if name == "sp::backward":
        return "bwd"
    if name == "sp::clip_grad_norm_":
        return "clip_grad_norm"
    if name.startswith("Optimizer.step#"):
        return "optimizer"
    return None


def analyze(path: str, k_steps: int, wall_ms: list[float], top: int) -> dict:
    raw = json.loads(Path(path).read_text())
    evs = raw["traceEvents"] if isinstance(raw, dict) else raw
    ranges, launch_ts, gpu = [], {}, []
    win0 = None  # host start of the first profiled step (ProfilerStep#N)
    for e in evs:
        if e.get("ph") != "X":
            continue
        cat = e.get("cat", "")
        if cat in ("user_annotation", "cpu_op"):
            name = e.get("name", "")
            if name.startswith("ProfilerStep#"):
                win0 = float(e["ts"]) if win0 is None else min(win0, float(e["ts"]))
            lab = range_label(name)
            if lab:
                ranges.append((float(e["ts"]), float(e["ts"]) + float(e.get("dur", 0)), lab))
        elif cat in ("cuda_runtime", "cuda_driver"):
            c = (e.get("args") or {}).get("correlation")
            if c is not None:
                launch_ts[c] = float(e["ts"])
        elif cat in ("kernel", "gpu_memcpy", "gpu_memset"):
            gpu.append(e)
    ranges.sort()
    starts = [r[0] for r in ranges]
    # The host runs ahead of the GPU: when the window opens (in the optimizer post-hook of the
    # profiler's warm-up step), that step's backward tail, clip and AdamW are still queued and run
    # inside the window.  Their launches are not in the trace (or precede the window): count them
    # apart, not as work of the profiled steps.
    carried, kept = [], []
    for e in gpu:
        lt = launch_ts.get((e.get("args") or {}).get("correlation"))
        (carried if lt is None or (win0 is not None and lt < win0) else kept).append(e)
    gpu = kept

    def where(ts_: float | None) -> str:
        if ts_ is None:
            return "other"
        j = bisect.bisect_right(starts, ts_) - 1
        for jj in range(j, max(j - 4, -1), -1):  # the ranges do not nest; look a few back anyway
            s, e, lab = ranges[jj]
            if s <= ts_ <= e:
                return lab
        return "other"

    cats: dict[str, float] = {}
    kern: dict[tuple, list] = {}
    memcpy: dict[tuple, list] = {}
    intervals = []
    for e in gpu:
        dur = float(e.get("dur", 0))
        ts0 = float(e["ts"])
        intervals.append((ts0, ts0 + dur))
        args = e.get("args") or {}
        name = e.get("name", "")
        rng = where(launch_ts.get(args.get("correlation")))
        if e.get("cat") == "gpu_memcpy":
            kind = "h2d" if "HtoD" in name else ("d2h" if "DtoH" in name else "d2d")
            cat = "h2d_copy" if kind == "h2d" else f"{rng}_memcpy_{kind}"
            key = (name, int(args.get("bytes", -1)))
            memcpy.setdefault(key, [0.0, 0, cat, args.get("stream")])
            memcpy[key][0] += dur
            memcpy[key][1] += 1
            kc = "memcpy"
        elif e.get("cat") == "gpu_memset":
            kc = "memset"
            cat = f"{rng}_memset"
        else:
            kc = kernel_class(name)
            cat = f"{rng}_{kc}" if rng in ("fwd", "bwd") else rng
        cats[cat] = cats.get(cat, 0.0) + dur
        key = (name, cat, kc)
        kern.setdefault(key, [0.0, 0])
        kern[key][0] += dur
        kern[key][1] += 1
    intervals.sort()
    busy, cur_s, cur_e = 0.0, None, None
    for s, e in intervals:
        if cur_e is None or s > cur_e:
            if cur_e is not None:
                busy += cur_e - cur_s
            cur_s, cur_e = s, e
        else:
            cur_e = max(cur_e, e)
    if cur_e is not None:
        busy += cur_e - cur_s
    per = 1e-3 / k_steps  # us total -> ms per step
    breakdown = {k: v * per for k, v in sorted(cats.items(), key=lambda kv: -kv[1])}
    wall = statistics.median(wall_ms) if wall_ms else None
    kernel_sum = sum(cats.values()) * per
    def g(*prefixes: str) -> float:
        return sum(v for k, v in breakdown.items() if k.startswith(prefixes))

    grouped = {
        "h2d_copy": g("h2d_copy"),
        "casts_fwd_bwd (pure _to_copy kernels)": g("fwd_cast", "bwd_cast"),
        "matmul_fwd": g("fwd_matmul"),
        "matmul_bwd": g("bwd_matmul"),
        "attention_fwd_bwd": g("fwd_attention", "bwd_attention"),
        "elementwise_reduction_fwd (norms, rope, loss, fused casts)": g("fwd_other", "fwd_memset", "fwd_memcpy"),
        "elementwise_reduction_bwd": g("bwd_other", "bwd_memset", "bwd_memcpy"),
        "optimizer_step": g("optimizer"),
        "clip_grad_norm": g("clip_grad_norm"),
    }
    grouped["other_kernels (outside fwd/bwd/clip/opt)"] = kernel_sum - sum(grouped.values())
    out = {
        "profiled_steps": k_steps,
        "wall_ms_per_step_profiled_median": wall,
        "wall_ms_per_step_profiled": wall_ms,
        "kernel_ms_per_step_sum": kernel_sum,
        "gpu_busy_ms_per_step": busy * per,
        "gpu_idle_ms_per_step": (wall - busy * per) if wall is not None else None,
        "grouped_ms_per_step": grouped,
        "breakdown_ms_per_step": breakdown,
        "memcpy": [
            {"name": k[0], "bytes": k[1], "category": v[2], "stream": v[3], "ms_per_step": v[0] * per,
             "calls_per_step": v[1] / k_steps,
             "GB_per_s": (k[1] * v[1] / (v[0] * 1e-6) / 1e9) if v[0] > 0 and k[1] > 0 else None}
            for k, v in sorted(memcpy.items(), key=lambda kv: -kv[1][0])[:12]
        ],
        "top_kernels": [
            {"name": k[0][:160], "category": k[1], "class": k[2], "ms_per_step": v[0] * per,
             "calls_per_step": v[1] / k_steps}
            for k, v in sorted(kern.items(), key=lambda kv: -kv[1][0])[:top]
        ],
        "ranges_found": sorted({r[2] for r in ranges}),
        "carried_in_from_warmup_step": {"events": len(carried),
                                        "gpu_ms_total": sum(float(e.get("dur", 0)) for e in carried) * 1e-3,
                                        "note": "launched before the profiled window; excluded from every figure above"},
    }
    return out


def child(p, rest: list[str]) -> int:
    mode, seq = p.prof_child
    plan = PLANS[mode]
    base = ts.parse_args(rest + ["--child", mode, seq, "--sync-dir", p.psync, "--tag", p.ptag])
    labels = build_labels(plan, base.warmup, p.timed, p.prof_steps)
    n_post = len(labels) - base.warmup
    argv = rest + ["--steps", str(n_post), "--child", mode, seq, "--sync-dir", p.psync, "--tag", p.ptag]
    sync = Path(p.psync)
    trace_dir = sync / "traces"
    trace_dir.mkdir(exist_ok=True)
    info = {"mode": mode, "tag": p.ptag, "cuda": base.device == "cuda"}

    # spec_compat first (as train_step's child does), so that the shim wraps the Trainer
    if not base.no_spec_compat:
        import spec_compat  # noqa: F401
    install(mode, plan, labels, p.prof_steps, trace_dir, info)
    rc = ts.main(argv)
    res_path = sync / f"result.{p.ptag}.json"
    res = json.loads(res_path.read_text()) if res_path.exists() else {}
    step_ms = res.get("step_ms") or []
    prof = {}
    for name, _o, _t, profiled in plan:
        f = info["prof_files"].get(name)
        if not profiled or not f:
            continue
        idx = [j for j, lab in enumerate(labels[base.warmup:]) if lab == [name, "prof"]]
        wall = [step_ms[j] for j in idx if j < len(step_ms)]
        t0 = time.perf_counter()
        try:
            prof[name] = analyze(f, p.prof_steps, wall, p.top)
        except Exception as exc:  # keep the timings even if one trace cannot be read
            prof[name] = {"error": f"{type(exc).__name__}: {exc}"}
        print(f"[profile] {name}: analysed in {time.perf_counter() - t0:.1f}s", flush=True)
    info["profiles"] = prof
    (sync / f"profile.{p.ptag}.json").write_text(json.dumps(info, default=str))
    return rc


# --------------------------------------------------------------------------- parent
def summarize_mode(a, res: dict, info: dict, T: int) -> dict:
    labels = info.get("labels") or []
    warm = a.warmup
    step_ms = res.get("step_ms") or []
    losses = res.get("losses") or []
    fl = ts.step_flops(a, T)
    segs = {}
    for name in dict.fromkeys(lab[0] for lab in labels):
        def pick(phase, src, off):
            return [src[j - off] for j, lab in enumerate(labels) if lab == [name, phase] and 0 <= j - off < len(src)]
        timed = pick("timed", step_ms, warm)
        profd = pick("prof", step_ms, warm)
        seg_losses = [losses[j] for j, lab in enumerate(labels) if lab[0] == name and j < len(losses)]
        s = {"desc": SEG_DESC.get(name, ""), "options": info.get("seg_options", {}).get(name),
             "timed_steps": len(timed), "step_ms": timed,
             "peak_gib": (info.get("seg_peak_gib") or {}).get(name)}
        if timed:
            med = statistics.median(timed)
            s.update(ms_min=min(timed), ms_median=med, ms_mean=statistics.fmean(timed), ms_max=max(timed),
                     tokens_per_s=T / (med / 1000), mfu=fl["total"] / (med / 1000) / (a.peak_tflops * 1e12))
        if profd:
            s["ms_median_profiled"] = statistics.median(profd)
        if seg_losses:
            s["loss_first_last"] = [seg_losses[0], seg_losses[-1]]
        pr = (info.get("profiles") or {}).get(name)
        if pr:
            s["profile"] = pr
        segs[name] = s
    return segs


def parent(p, rest: list[str]) -> int:
    a = ts.parse_args(rest)
    import torch

    if a.device is None:
        a.device = "cuda" if torch.cuda.is_available() else "cpu"
    T = p.seq_len
    modes = [m.strip() for m in p.modes.split(",") if m.strip()]
    for m in modes:
        if m not in PLANS:
            raise SystemExit(f"mode {m!r}: choose from {', '.join(PLANS)}")
    work = Path(p.work_dir or tempfile.mkdtemp(prefix="ts_profile."))
    work.mkdir(parents=True, exist_ok=True)
    vdir = Path(a.verifier_dir) if a.verifier_dir else work / "verifier"
    a.verifier_dir = str(vdir)
    ts.make_verifier(a, vdir, a.device)
    gpu_name = torch.cuda.get_device_name(0) if a.device == "cuda" else None
    del torch
    have_patch = (not a.no_spec_compat) and ts.PATCH_ID in ts.registered_patch_ids()
    print(f"[spec_compat] {ts.PATCH_ID} registered: {have_patch}", flush=True)
    sync = Path(tempfile.mkdtemp(prefix="sync.", dir=work))
    extra = ["--verifier-dir", str(vdir), "--device", a.device]
    mine = ["--timed", str(p.timed), "--prof-steps", str(p.prof_steps), "--top", str(p.top)]
    procs = {}
    for m in modes:
        env = dict(os.environ)
        env.setdefault("PYTHONUNBUFFERED", "1")
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ts.REPO_ROOT), env.get("PYTHONPATH", "")]))
        env.pop("SPEC_COMPAT_DISABLE", None)
        if m == "c" and have_patch:
            env["SPEC_COMPAT_DISABLE"] = ts.PATCH_ID
        tag = f"{m}-{T}"
        log = open(sync / f"log.{tag}.txt", "w")
        cmd = [sys.executable, str(Path(__file__).resolve()), "--prof-child", m, str(T), "--psync", str(sync),
               "--ptag", tag] + mine + rest + extra
        procs[m] = (subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT), log, tag)
        print(f"[start] {tag} pid {procs[m][0].pid}", flush=True)
    t0 = time.time()
    pending = set(modes)
    while pending and time.time() - t0 < p.phase_timeout:
        for m in list(pending):
            if (sync / f"ready.{procs[m][2]}").exists() or procs[m][0].poll() is not None:
                pending.discard(m)
                print(f"[ready] {procs[m][2]} after {time.time() - t0:.0f}s (rc={procs[m][0].poll()})", flush=True)
        time.sleep(0.2)
    out: dict = {
        "what": "train_step_profile: per-step GPU time breakdown of (b) single-device-bf16 shim vs (c) pure bf16",
        "device": a.device, "gpu": gpu_name, "seq_len": T, "peak_tflops": a.peak_tflops,
        "flops_per_step": ts.step_flops(a, T), "param_counts": ts.param_counts(a),
        "dims": {k: getattr(a, k) for k in ("hidden_size", "num_heads", "head_dim", "num_kv_heads",
                                            "intermediate_size", "num_layers", "target_vocab", "draft_vocab",
                                            "ttt_steps", "docs", "warmup")},
        "timed_steps_per_segment": p.timed, "profiled_steps_per_segment": p.prof_steps,
        "patch_registered": have_patch, "segments": {}, "modes": {},
    }
    for m in modes:
        proc, log, tag = procs[m]
        t1 = time.time()
        if proc.poll() is None and (sync / f"ready.{tag}").exists():
            (sync / f"go.{tag}").write_text("1")
            try:
                proc.wait(timeout=p.phase_timeout)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        elif proc.poll() is None:
            proc.kill()
            proc.wait()
        log.close()
        print(f"[done] {tag} rc={proc.returncode} in {time.time() - t1:.0f}s", flush=True)
        rf, pf = sync / f"result.{tag}.json", sync / f"profile.{tag}.json"
        res = json.loads(rf.read_text()) if rf.exists() else {}
        info = json.loads(pf.read_text()) if pf.exists() else {}
        logtxt = (sync / f"log.{tag}.txt").read_text()
        if p.out:
            Path(p.out).parent.mkdir(parents=True, exist_ok=True)
            with open(Path(p.out).with_suffix(".logs.txt"), "a") as fh:
                fh.write(f"===== {tag} =====\n{logtxt[-60000:]}\n")
        out["modes"][m] = {k: res.get(k) for k in (
            "status", "versions", "patch_status", "spec_compat_applied", "param_dtypes", "trainable_dtypes", "opt",
            "h2d_ms", "gpu", "first_step_s", "peak_warmup_gib")}
        out["modes"][m].update({k: info.get(k) for k in (
            "opt_fused", "opt_foreach", "verifier_lm_head_dtype", "fold_clip_steps", "bf16_inputs_active")})
        out["modes"][m]["rc"] = proc.returncode
        if res.get("status") != "ok":
            out["modes"][m]["log_tail"] = logtxt[-4000:]
            print(logtxt[-4000:], flush=True)
        out["segments"].update(summarize_mode(a, res, info, T))
        if p.out:  # partial result after every mode
            Path(p.out).write_text(json.dumps(out, indent=1, default=str))
        if p.trace_out:
            keep = {s.strip() for s in p.keep_traces.split(",")}
            Path(p.trace_out).mkdir(parents=True, exist_ok=True)
            for seg, f in (info.get("prof_files") or {}).items():
                if seg in keep and Path(f).exists():
                    with open(f, "rb") as src, gzip.open(Path(p.trace_out) / f"trace_{seg}.json.gz", "wb") as dst:
                        shutil.copyfileobj(src, dst)
    segs = out["segments"]
    ratios = {}
    for anchor in ("c", "c4", "c_again"):
        if "ms_median" not in segs.get(anchor, {}):
            continue
        for name, s in segs.items():
            if name.startswith("b") and "ms_median" in s:
                ratios[f"{name}/{anchor}"] = segs[anchor]["ms_median"] / s["ms_median"]
    out["throughput_ratios"] = ratios
    # per-category GPU time of each profiled b segment minus the anchor's (ms/step)
    gaps = {}
    for anchor in ("c", "c4"):
        ga = ((segs.get(anchor) or {}).get("profile") or {}).get("grouped_ms_per_step")
        if not ga:
            continue
        for name, s in segs.items():
            gb = (s.get("profile") or {}).get("grouped_ms_per_step")
            if name.startswith("b") and gb:
                gaps[f"{name}-{anchor}"] = {k: gb[k] - ga.get(k, 0.0) for k in gb}
                gaps[f"{name}-{anchor}"]["kernel_sum"] = (s["profile"]["kernel_ms_per_step_sum"]
                                                          - segs[anchor]["profile"]["kernel_ms_per_step_sum"])
    out["gpu_time_gap_ms_per_step"] = gaps
    # table
    print()
    hdr = f"{'segment':<9} {'ms min':>7} {'median':>7} {'max':>7} {'prof.':>7} {'MFU':>6} {'peak GiB':>8}  loss first->last"
    print(hdr)
    print("-" * len(hdr))
    for name, s in segs.items():
        if "ms_median" not in s:
            print(f"{name:<9} no timings")
            continue
        lf = s.get("loss_first_last") or [float("nan")] * 2
        pk = f"{s['peak_gib']:.1f}" if s.get("peak_gib") is not None else "-"
        pm = f"{s['ms_median_profiled']:.1f}" if s.get("ms_median_profiled") else "-"
        print(f"{name:<9} {s['ms_min']:>7.1f} {s['ms_median']:>7.1f} {s['ms_max']:>7.1f} {pm:>7} "
              f"{100 * s['mfu']:>5.1f}% {pk:>8}  {lf[0]:.4f} -> {lf[1]:.4f}")
    print("throughput ratios: " + ", ".join(f"{k} = {v:.3f}" for k, v in ratios.items()))
    for name, s in segs.items():
        pr = s.get("profile")
        if not pr or "grouped_ms_per_step" not in pr:
            continue
        print(f"\n[{name}] profiled wall {pr['wall_ms_per_step_profiled_median']:.1f} ms/step, kernels "
              f"{pr['kernel_ms_per_step_sum']:.1f}, GPU busy {pr['gpu_busy_ms_per_step']:.1f}, idle "
              f"{pr['gpu_idle_ms_per_step']:.1f}")
        for k, v in pr["grouped_ms_per_step"].items():
            print(f"    {k:<60} {v:8.2f}")
    if p.out:
        Path(p.out).write_text(json.dumps(out, indent=1, default=str))
        print(f"\nwrote {p.out}")
    ok = all(out["modes"][m].get("status") == "ok" for m in modes)
    return 0 if ok else 1


def main(argv=None) -> int:
    p, rest = my_parser().parse_known_args(argv)
    if p.prof_child:
        return child(p, rest)
    return parent(p, rest)


if __name__ == "__main__":
    sys.exit(main())
