#!/usr/bin/env python3
"""Time stock ``speculators train`` (speculators 0.9.0) on one GPU at Kimi-K2.5 draft dims.

Issue #21, item 3. Everything the trainer reads is built here, synthetically, then the
stock CLI runs as a subprocess with its default flags (loss, optimizer, attention,
workers, logging) plus what a run must name (paths, vocabulary sizes, sequence length,
step count). Nothing of speculators is patched or imported into this process.

1. Verifier directory (what the trainer reads of the verifier): ``config.json``, a
   DeepSeek-V3 text config with Kimi-K2.5's sizes (hidden 7168, vocab 163840, 61 layers,
   64 heads, YaRN rope, ...), and ``model.safetensors`` with bf16
   ``model.embed_tokens.weight`` / ``lm_head.weight`` [163840, 7168] and
   ``model.norm.weight``. The trainer builds its draft decoder config from the verifier
   config (``create_transformer_layer_config``) and copies the embeddings and head.
   No tokenizer: ``--mask-token-id`` is given (EAGLE-3 does not use it; without it the
   trainer would load the verifier's tokenizer only to pick that id).
2. Data directory in speculators 0.9.0's on-disk format: the ``prepare-data`` dataset
   (``save_to_disk``; columns ``input_ids``, ``loss_mask``, ``seq_len``; torch format),
   ``token_freq.pt`` (the counts ``prepare-data --no-skip-token-freq`` writes), and
   ``hidden_states/hs_{i}.safetensors`` as ``generate-offline-data`` leaves them
   (``hidden_states`` [T, 4, H] bf16: three aux layers then the last; ``token_ids`` [T]).
   Random tokens (uniform), loss mask all ones, random normal hidden states. The
   vocabulary mapping (d2t/t2d, draft vocab 32000) is left to the trainer, which builds
   and caches it from ``token_freq.pt`` as in a stock run.
3. ``speculators train`` (``python -m speculators train ...``, the CLI's own module) with
   ``--epochs 1 --max-steps N --total-seq-len T``. The trainer's default ``--log-freq 1``
   logs a profile per step (``profile/step_ms``: host time from the end of one step to the
   end of the next, measured with device synchronisation, i.e. data wait + H2D + forward
   + backward + clip + optimizer + scheduler); the median after the warm-up steps is the
   figure. The child runs with ``COLUMNS`` wide so each log record is one line.
   Peak GPU memory: ``torch.cuda.max_memory_allocated`` / ``max_memory_reserved`` of the
   trainer process (read by an ``atexit`` hook of the ``-c`` launcher, which then runs the
   CLI unchanged), and the device's used memory sampled with ``nvidia-smi`` (all
   processes: the DataLoader workers open CUDA contexts too).

Writes JSON (``--out``) and prints it after ``RESULT_JSON``. For a CPU smoke test of the
data format, pass tiny sizes and ``--launcher "spec-compat run $(which speculators)"``
plus the trainer's CPU flags after ``--``.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shlex
import shutil
import signal
import statistics
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

# Kimi-K2.5's text model (DeepSeek-V3 layout) at its released sizes.
KIMI_K25_TEXT = {
    "architectures": ["DeepseekV3ForCausalLM"],
    "model_type": "deepseek_v3",
    "vocab_size": 163840,
    "hidden_size": 7168,
    "intermediate_size": 18432,
    "moe_intermediate_size": 2048,
    "num_hidden_layers": 61,
    "num_nextn_predict_layers": 0,
    "num_attention_heads": 64,
    "num_key_value_heads": 64,
    "n_shared_experts": 1,
    "n_routed_experts": 384,
    "routed_scaling_factor": 2.827,
    "kv_lora_rank": 512,
    "q_lora_rank": 1536,
    "qk_rope_head_dim": 64,
    "v_head_dim": 128,
    "qk_nope_head_dim": 128,
    "topk_method": "noaux_tc",
    "n_group": 1,
    "topk_group": 1,
    "num_experts_per_tok": 8,
    "moe_layer_freq": 1,
    "first_k_dense_replace": 1,
    "norm_topk_prob": True,
    "scoring_func": "sigmoid",
    "hidden_act": "silu",
    "max_position_embeddings": 262144,
    "initializer_range": 0.02,
    "rms_norm_eps": 1e-5,
    "tie_word_embeddings": False,
    "rope_theta": 50000.0,
    "rope_scaling": {
        "type": "yarn",
        "factor": 64.0,
        "original_max_position_embeddings": 4096,
        "beta_fast": 32.0,
        "beta_slow": 1.0,
        "mscale": 1.0,
        "mscale_all_dim": 1.0,
    },
    "attention_bias": False,
    "attention_dropout": 0.0,
    "bos_token_id": 163584,
    "eos_token_id": 163585,
    "torch_dtype": "bfloat16",
}

# Runs the CLI's own entry point unchanged; only records the allocator's peaks at exit.
PROBE = r"""
import atexit, json, os, sys
def _peak():
    try:
        import torch
        if torch.cuda.is_available() and torch.cuda.is_initialized():
            d = {"max_memory_allocated": torch.cuda.max_memory_allocated(),
                 "max_memory_reserved": torch.cuda.max_memory_reserved()}
            with open(os.environ["SPEC09_PEAK_FILE"], "w") as f:
                json.dump(d, f)
    except Exception as e:  # noqa: BLE001
        print("peak probe failed:", e, file=sys.stderr)
atexit.register(_peak)
sys.argv[0] = "speculators"
from speculators.__main__ import app
app()
"""

STEP_RE = re.compile(r"profile/step_ms=([0-9.eE+-]+)")
PROFILE_RE = re.compile(r"profile/([A-Za-z0-9_/]+)=([0-9.eE+-]+)")
GSTEP_RE = re.compile(r"global_step=(\d+)")


def log(msg: str) -> None:
    print(f"[spec09 {time.strftime('%H:%M:%S')}] {msg}", flush=True)


def build_verifier(vdir: Path, args, device: str) -> dict:
    import torch
    from safetensors.torch import save_file

    vdir.mkdir(parents=True, exist_ok=True)
    cfg = dict(KIMI_K25_TEXT, hidden_size=args.hidden, vocab_size=args.vocab,
               num_hidden_layers=args.verifier_layers)
    if args.hidden != KIMI_K25_TEXT["hidden_size"]:  # tiny smoke sizes
        cfg.update(num_attention_heads=args.heads, num_key_value_heads=args.heads,
                   intermediate_size=args.hidden * 2)
    cfg["bos_token_id"] = min(cfg["bos_token_id"], args.vocab - 2)
    cfg["eos_token_id"] = min(cfg["eos_token_id"], args.vocab - 1)
    (vdir / "config.json").write_text(json.dumps(cfg, indent=2) + "\n")
    g = torch.Generator(device=device).manual_seed(0)
    w = {}
    for name in ("model.embed_tokens.weight", "lm_head.weight"):
        w[name] = (torch.randn(args.vocab, args.hidden, generator=g, device=device,
                               dtype=torch.bfloat16) * 0.02).cpu()
    w["model.norm.weight"] = torch.ones(args.hidden, dtype=torch.bfloat16)
    save_file(w, str(vdir / "model.safetensors"), metadata={"format": "pt"})
    return {k: list(v.shape) for k, v in w.items()}


def build_data(ddir: Path, args, device: str) -> dict:
    import torch
    from datasets import Dataset
    from safetensors.torch import save_file

    hs_dir = ddir / "hidden_states"
    hs_dir.mkdir(parents=True, exist_ok=True)
    g = torch.Generator().manual_seed(1)
    T, n = args.seq_len, args.num_seqs
    ids = [torch.randint(0, args.vocab, (T,), generator=g, dtype=torch.long) for _ in range(n)]
    mask = [torch.ones(T, dtype=torch.long) for _ in range(n)]
    ds = Dataset.from_dict({
        "input_ids": [x.tolist() for x in ids],
        "loss_mask": [m.tolist() for m in mask],
        "seq_len": [T] * n,
    })
    ds.set_format(type="torch")
    ds.save_to_disk(str(ddir))

    counts = torch.bincount(torch.cat([x[m.bool()] for x, m in zip(ids, mask)]), minlength=args.vocab)
    nz = counts.nonzero().flatten()
    torch.save(dict(zip(nz.tolist(), counts[nz].tolist())), ddir / "token_freq.pt")

    gd = torch.Generator(device=device).manual_seed(2)
    layers = args.num_aux + 1

    def write(i: int, hs) -> None:
        save_file({"hidden_states": hs, "token_ids": ids[i]}, str(hs_dir / f"hs_{i}.safetensors"))

    with ThreadPoolExecutor(max_workers=4) as pool:
        futs = []
        for i in range(n):
            hs = torch.randn(T, layers, args.hidden, generator=gd, device=device,
                             dtype=torch.bfloat16).cpu()
            futs.append(pool.submit(write, i, hs))
        for f in futs:
            f.result()
    return {"num_seqs": n, "seq_len": T, "hidden_states_shape": [T, layers, args.hidden],
            "hidden_states_dtype": "bfloat16", "distinct_tokens": int(nz.numel()),
            "bytes_hidden_states": n * T * layers * args.hidden * 2}


class SmiSampler(threading.Thread):
    """Peak of nvidia-smi's used memory (whole device) while the trainer runs."""

    def __init__(self, interval: float = 0.5):
        super().__init__(daemon=True)
        self.interval, self.peak_mib, self.samples = interval, 0, 0
        self.peak_apps: dict[str, int] = {}
        self.stop = threading.Event()
        self.ok = shutil.which("nvidia-smi") is not None

    def run(self) -> None:
        while self.ok and not self.stop.is_set():
            try:
                out = subprocess.run(
                    ["nvidia-smi", "--query-gpu=memory.used", "--format=csv,noheader,nounits"],
                    capture_output=True, text=True, timeout=10).stdout.split()
                if out:
                    self.peak_mib = max(self.peak_mib, int(out[0]))
                    self.samples += 1
                apps = subprocess.run(
                    ["nvidia-smi", "--query-compute-apps=pid,used_memory", "--format=csv,noheader,nounits"],
                    capture_output=True, text=True, timeout=10).stdout.strip().splitlines()
                for line in apps:
                    pid, mem = [p.strip() for p in line.split(",")]
                    self.peak_apps[pid] = max(self.peak_apps.get(pid, 0), int(mem))
            except Exception:  # noqa: BLE001
                pass
            self.stop.wait(self.interval)


def versions() -> dict:
    from importlib.metadata import PackageNotFoundError, version

    out = {"python": sys.version.split()[0]}
    for p in ("torch", "speculators", "hs-connectors", "transformers", "datasets", "triton",
              "huggingface-hub", "tokenizers", "safetensors", "pydantic", "pyarrow"):
        try:
            out[p] = version(p)
        except PackageNotFoundError:
            out[p] = None
    return out


def device_info() -> dict:
    import torch

    d = {"cuda_available": torch.cuda.is_available(), "torch_cuda": torch.version.cuda}
    if torch.cuda.is_available():
        p = torch.cuda.get_device_properties(0)
        d.update(name=p.name, total_memory_mib=p.total_memory // 2**20, sm_count=p.multi_processor_count)
    if shutil.which("nvidia-smi"):
        d["nvidia_smi"] = subprocess.run(
            ["nvidia-smi", "--query-gpu=name,driver_version,memory.total,clocks.max.sm", "--format=csv,noheader"],
            capture_output=True, text=True).stdout.strip()
    d["cpu_count"] = os.cpu_count()
    return d


def approx_flops(draft: dict | None, T: int, draft_vocab: int, ttt: int, hidden: int) -> dict | None:
    """Matmul FLOPs per step of the EAGLE-3 draft (same counting as benchmarks/train_step.py).

    trainable 6*N*T: fc (3H*H, once) + per ttt step the decoder layer (q,k,v from 2H, o,
    gate/up/down) and the draft lm_head; frozen verifier lm_head forward 2*N*T once;
    attention 4*d_attn*P_k forward x3 (fwd+bwd) per ttt step, P_k = causal pairs within the
    sliding window + k*T.
    """
    if not draft:
        return None
    heads = draft["num_attention_heads"]
    kv = draft["num_key_value_heads"]
    hd = draft.get("head_dim") or hidden // heads
    inter = draft["intermediate_size"]
    window = draft.get("sliding_window") if draft.get("use_sliding_window") else None
    q = 2 * hidden * heads * hd
    k = v = 2 * hidden * kv * hd
    o = heads * hd * hidden
    mlp = 3 * hidden * inter
    n_layer = q + k + v + o + mlp
    n_fc = 3 * hidden * hidden
    n_head = hidden * draft_vocab
    pairs = sum(min(i + 1, window or T) for i in range(T))
    attn = sum(3 * 4 * heads * hd * (pairs + kk * T) for kk in range(ttt))
    trainable = 6 * n_fc * T + ttt * 6 * (n_layer + n_head) * T
    verifier = 2 * n_head * T
    total = trainable + verifier + attn
    return {"tflop_per_step": total / 1e12, "trainable_tflop": trainable / 1e12,
            "verifier_head_tflop": verifier / 1e12, "attention_tflop": attn / 1e12,
            "params_decoder_layer": n_layer, "params_fc": n_fc, "params_draft_lm_head": n_head,
            "attention_pairs_per_ttt_step": pairs, "sliding_window": window}


def run_trainer(args, result: dict, *, work: Path, vdir: Path, ddir: Path, t_script: float,
                out_path: Path, log_path: Path, stop_after_step: int | None = None) -> tuple[int, bool]:
    """Run ``speculators train`` on ``vdir`` / ``ddir`` (checkpoints and logs under ``work``), filling
    ``result``: returncode, phases, step times, the trainer's profile, memory, the resolved draft.
    ``stop_after_step``: kill the trainer once that global step is logged (no checkpoint, no
    validation: timing runs only). Returns (returncode, whether any step after the warm-up was timed)."""
    import torch  # noqa: F401  (the caller has it)

    sdir, ldir = work / "ckpt", work / "logs"
    train_args = [
        "train",
        "--verifier-name-or-path", str(vdir),
        "--data-path", str(ddir),
        "--save-path", str(sdir),
        "--log-dir", str(ldir),
        "--target-layer-ids", *args.target_layer_ids.split(","),
        "--draft-vocab-size", str(args.draft_vocab),
        "--mask-token-id", "0",
        "--total-seq-len", str(args.seq_len),
        "--epochs", "1",
        "--max-steps", str(args.max_steps),
        *args.extra,
    ]
    launcher = shlex.split(args.launcher) if args.launcher else [sys.executable, "-c", PROBE]
    cmd = launcher + train_args
    peak_file = work / "peak.json"
    env = dict(os.environ, COLUMNS="3000", PYTHONUNBUFFERED="1", SPEC09_PEAK_FILE=str(peak_file),
               TERM="dumb")
    result["command"] = "speculators " + shlex.join(train_args)
    log("running: " + result["command"])

    out_path.parent.mkdir(parents=True, exist_ok=True)
    smi = SmiSampler()
    smi.start()
    lines: list[str] = []
    step_ms: list[tuple[int, float]] = []
    profiles: list[tuple[int, dict]] = []
    marks: dict[str, float] = {}
    t_start = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env,
                            start_new_session=True)

    def killer() -> None:
        if proc.poll() is None:
            marks["killed_at_deadline_s"] = time.perf_counter() - t_start
            os.killpg(proc.pid, signal.SIGKILL)

    timer = threading.Timer(max(10.0, args.deadline_s - (time.perf_counter() - t_script)), killer)
    timer.start()
    with open(log_path, "w") as lf:
        for line in proc.stdout:  # type: ignore[union-attr]
            lf.write(line)
            lf.flush()
            sys.stdout.write(line)
            lines.append(line)
            now = time.perf_counter() - t_start
            m = STEP_RE.search(line)
            if m:
                gs = GSTEP_RE.search(line)
                step_ms.append((int(gs.group(1)) if gs else len(step_ms), float(m.group(1))))
                profiles.append((step_ms[-1][0], {k: float(v) for k, v in PROFILE_RE.findall(line)}))
                marks.setdefault("first_step_logged_s", now)
                marks["last_step_logged_s"] = now
                if stop_after_step is not None and step_ms[-1][0] >= stop_after_step and proc.poll() is None:
                    marks["stopped_after_step_s"] = now
                    os.killpg(proc.pid, signal.SIGKILL)
            if "Saving checkpoint" in line:
                marks.setdefault("checkpoint_start_s", now)
            if "Checkpoint saved" in line:
                marks.setdefault("checkpoint_saved_s", now)
            if "Validation epoch" in line and "completed" in line:
                marks.setdefault("validation_done_s", now)
    rc = proc.wait()
    timer.cancel()
    if "stopped_after_step_s" in marks:
        rc = 0  # killed on purpose once the timed steps were logged
    marks["exit_s"] = time.perf_counter() - t_start
    smi.stop.set()
    smi.join(timeout=15)

    result["returncode"] = rc
    result["phases_s"] = {k: round(v, 2) for k, v in marks.items()}
    result["steps_logged"] = len(step_ms)
    result["step_ms_all"] = [round(v, 3) for _, v in step_ms]
    timed = [v for gs, v in step_ms if gs >= args.warmup]
    if timed:
        med = statistics.median(timed)
        result["timing"] = {
            "warmup_steps_excluded": args.warmup,
            "timed_steps": len(timed),
            "median_s_per_step": med / 1000,
            "mean_s_per_step": statistics.fmean(timed) / 1000,
            "min_s_per_step": min(timed) / 1000,
            "max_s_per_step": max(timed) / 1000,
            "tokens_per_step": args.seq_len,
            "tokens_per_s_median": args.seq_len / (med / 1000),
            "source": "trainer log profile/step_ms (log_freq 1: synchronised host timer, one packed "
                      "sequence of seq_len tokens per step; values >999 ms are logged to 3 significant digits)",
        }
    keys = sorted({k for gs, d in profiles if gs >= args.warmup for k in d})
    result["profile_median_after_warmup"] = {
        k: statistics.median([d[k] for gs, d in profiles if gs >= args.warmup and k in d]) for k in keys}
    peak = json.loads(peak_file.read_text()) if peak_file.exists() else {}
    result["memory"] = {
        "trainer_max_memory_allocated_gib": peak.get("max_memory_allocated", 0) / 2**30 or None,
        "trainer_max_memory_reserved_gib": peak.get("max_memory_reserved", 0) / 2**30 or None,
        "nvidia_smi_peak_used_mib_device": smi.peak_mib or None,
        "nvidia_smi_peak_used_mib_per_pid": smi.peak_apps or None,
        "nvidia_smi_samples": smi.samples,
    }
    # what the trainer resolved: run.yaml / the saved draft config
    draft = None
    for p in sorted(sdir.glob("*/config.json")):
        try:
            c = json.loads(p.read_text())
            draft = c.get("transformer_layer_config") or None
            result["draft_config"] = {k: c.get(k) for k in ("architectures", "draft_vocab_size", "norm_before_residual",
                                                          "norm_before_fc", "norm_output", "eagle_aux_hidden_state_layer_ids",
                                                          "target_hidden_size")}
            result["draft_config"]["transformer_layer_config"] = {
                k: (draft or {}).get(k) for k in ("hidden_size", "num_attention_heads", "num_key_value_heads", "head_dim",
                                                  "intermediate_size", "num_hidden_layers", "sliding_window",
                                                  "use_sliding_window", "layer_types", "rope_parameters", "vocab_size")}
            break
        except Exception:  # noqa: BLE001
            pass
    run_yaml = sdir / "run.yaml"
    if run_yaml.exists():
        result["run_yaml"] = run_yaml.read_text()
    fl = approx_flops(draft, args.seq_len, args.draft_vocab, args.ttt_steps, args.hidden)
    if fl and result.get("timing"):
        fl["mfu_vs_peak"] = fl["tflop_per_step"] / result["timing"]["median_s_per_step"] / args.peak_tflops
        fl["peak_tflops"] = args.peak_tflops
    result["approx_flops"] = fl
    if rc != 0:
        tb = [i for i, l in enumerate(lines) if "Traceback" in l or "Error" in l]
        start = max(0, (tb[0] if tb else len(lines)) - 5)
        result["error_tail"] = "".join(lines[start:start + 200])[-20000:]
    result["log_file"] = str(log_path)
    return rc, bool(timed)


def add_run_args(ap: argparse.ArgumentParser, *, num_seqs: int, max_steps: int, deadline_s: float) -> None:
    """The verifier, data and trainer-run options (sizes default to Kimi-K2.5's), shared with
    ``fp8_train_gpu.py``."""
    ap.add_argument("--hidden", type=int, default=7168)
    ap.add_argument("--vocab", type=int, default=163840)
    ap.add_argument("--heads", type=int, default=4, help="tiny sizes only")
    ap.add_argument("--verifier-layers", type=int, default=61)
    ap.add_argument("--target-layer-ids", default="2,30,58")
    ap.add_argument("--draft-vocab", type=int, default=32000)
    ap.add_argument("--num-seqs", type=int, default=num_seqs)
    ap.add_argument("--seq-len", type=int, default=4096)
    ap.add_argument("--max-steps", type=int, default=max_steps)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--ttt-steps", type=int, default=3, help="the trainer's default; only for the FLOP count")
    ap.add_argument("--peak-tflops", type=float, default=790.0)
    ap.add_argument("--deadline-s", type=float, default=deadline_s,
                    help="kill the trainer this long after it (or this script) started")
    ap.add_argument("--launcher", default=None, help="command that runs the CLI (default: python -c PROBE)")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--work-dir", default="/tmp/spec09")
    ap.add_argument("--out", default="benchmarks/results/spec09_train_h200_kimi.json")
    ap.add_argument("--log", default=None, help="copy of the trainer's output (default: next to --out)")
    add_run_args(ap, num_seqs=64, max_steps=50, deadline_s=540.0)
    ap.add_argument("--label", default="")
    ap.add_argument("extra", nargs="*", help="extra trainer flags (after --)")
    args = ap.parse_args()
    args.num_aux = len(args.target_layer_ids.split(","))

    t_script = time.perf_counter()
    import torch

    device = "cuda" if torch.cuda.is_available() else "cpu"
    work = Path(args.work_dir)
    if work.exists():
        shutil.rmtree(work)
    vdir, ddir = work / "verifier", work / "data"
    result: dict = {"label": args.label, "date": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
                    "device": device_info(), "versions": versions()}
    log(f"device {result['device']}, versions {result['versions']}")

    t0 = time.perf_counter()
    weights = build_verifier(vdir, args, device)
    vcfg = json.loads((vdir / "config.json").read_text())
    result["verifier"] = {"config": {k: vcfg[k] for k in (
        "model_type", "hidden_size", "vocab_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads",
        "intermediate_size", "qk_rope_head_dim", "rope_theta", "rope_scaling", "max_position_embeddings")},
        "weights_bf16": weights}
    log(f"verifier written in {time.perf_counter() - t0:.1f} s")
    t1 = time.perf_counter()
    result["data"] = build_data(ddir, args, device)
    log(f"data written in {time.perf_counter() - t1:.1f} s: {result['data']}")
    if device == "cuda":
        torch.cuda.empty_cache()

    out_path = Path(args.out)
    log_path = Path(args.log) if args.log else out_path.with_suffix(".log")
    rc, timed = run_trainer(args, result, work=work, vdir=vdir, ddir=ddir, t_script=t_script,
                            out_path=out_path, log_path=log_path)
    out_path.write_text(json.dumps(result, indent=2) + "\n")
    print("RESULT_JSON " + json.dumps({k: result.get(k) for k in ("returncode", "timing", "memory", "phases_s")}))
    return 0 if rc == 0 and timed else 1


if __name__ == "__main__":
    sys.exit(main())
