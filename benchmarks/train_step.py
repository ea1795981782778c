#!/usr/bin/env python3
"""Time real training steps of the stock speculators EAGLE-3 trainer.

Drives ``speculators.train.trainer.Trainer.train_epoch`` (unmodified) over a
``DataLoader`` of synthetic batches in the collated v1 format, for an
``Eagle3DraftModel`` built the way speculators' ``scripts/train.py`` builds it
(LlamaConfig from the verifier's config, ``simple_flex_attention``,
``norm_before_residual=True``, greedy proposal with ``ttt_steps``), with a
synthetic verifier directory (config.json + one safetensors file holding
``model.embed_tokens.weight`` and ``lm_head.weight``) and a random but valid
t2d/d2t vocabulary mapping.

Modes (one child process per mode x sequence length, so that every patch state,
compile cache and memory peak is its own):

  a  stock single-device path: fp32 weights and data, AdamW fp32
     (``import spec_compat`` with ``SPEC_COMPAT_DISABLE=single-device-bf16``
     when that patch is registered);
  b  the same script under spec-compat with its ``single-device-bf16`` patch on;
  c  anchor: the draft cast to bf16 (``model.to(torch.bfloat16)``), bf16 hidden
     states, the Trainer's own AdamW over the bf16 parameters.

Children of one group (``--concurrency``) build, compile and warm up side by
side, then are released one at a time for the timed steps, so compilation is
paid in parallel and timings never overlap.

Per step: the interval between CUDA events recorded by an optimizer
step-post-hook on ``trainer.opt`` (consecutive ends of ``opt.step()``), i.e. the
whole Trainer iteration on the GPU timeline: host-to-device copy of the batch,
forward, backward, grad clipping, AdamW, scheduler and the per-step metric
``.item()`` sync.  Batches are pre-built and pinned, so the DataLoader's
host-side cost (file reads, noise, collation in worker processes) is excluded;
the copy to the GPU is included, as the Trainer does it (``h2d_ms`` reports it
alone).

MFU (model FLOPs per step / step time / peak), counting matmul FLOPs only:
  trainable weights: 6*N*T for fc (N = 3H*H, applied once) and, per ttt step,
    for the decoder layer(s) (q,k,v from 2H in the first layer, o, gate/up/down)
    and the draft lm_head (H*draft_vocab);
  frozen verifier lm_head (H*draft_vocab): forward only, once: 2*N*T;
  attention per layer and ttt step k: 4*d*heads*P_k forward, x3 for fwd+bwd,
    P_k = sum over packed documents of L(L+1)/2 (causal) + k*T (the diagonal
    entries of the k earlier draft blocks);
  not counted: embeddings (gathers), norms, softmax/KL, the optimizer.
  Peak: --peak-tflops (default 790: dense bf16 8192^3 matmul measured on this
  workplace's H200s, KINDS.md: 769-798 TFLOP/s; the datasheet's 989 is also
  reported in the JSON as mfu_datasheet).

Runs on CPU at tiny sizes for a smoke test (``--tiny``, ``TORCHDYNAMO_DISABLE=1``).
Prints a table and, last, one line ``RESULT_JSON {...}``.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

PATCH_ID = "single-device-bf16"
MODES = {
    "a": "stock fp32 (patch off)",
    "b": "spec-compat bf16 shim",
    "c": "pure bf16 anchor",
}
DATASHEET_BF16_TFLOPS = 989.0
REPO_ROOT = Path(__file__).resolve().parent.parent


# --------------------------------------------------------------------------- shapes / FLOPs
def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0],
        epilog="Example (one H200): python benchmarks/train_step.py --seq-lens 2048,4096 --out-dir $OUT. "
        "CPU smoke test: TORCHDYNAMO_DISABLE=1 python benchmarks/train_step.py --tiny",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    p.add_argument("--modes", default="a,b,c", help="comma list of a,b,c (see module doc)")
    p.add_argument("--seq-lens", default="2048,4096", help="packed sequence lengths (comma list)")
    p.add_argument("--steps", type=int, default=10, help="timed steps per cell")
    p.add_argument("--warmup", type=int, default=3, help="untimed steps first (compilation happens here)")
    p.add_argument("--concurrency", type=int, default=3, help="cells built/compiled side by side")
    p.add_argument("--docs", type=int, default=1, help="documents packed per sequence (equal lengths)")
    p.add_argument("--device", choices=["cuda", "cpu"], default=None, help="default: cuda if available")
    p.add_argument("--hidden-size", type=int, default=7168)
    p.add_argument("--num-heads", type=int, default=64)
    p.add_argument("--head-dim", type=int, default=112)
    p.add_argument("--num-kv-heads", type=int, default=64)
    p.add_argument("--intermediate-size", type=int, default=18432)
    p.add_argument("--num-layers", type=int, default=1)
    p.add_argument("--target-vocab", type=int, default=163840)
    p.add_argument("--draft-vocab", type=int, default=32000)
    p.add_argument("--ttt-steps", type=int, default=3)
    p.add_argument("--lr", type=float, default=1e-4)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--loader", choices=["prebuilt", "stock"], default="prebuilt",
                   help="prebuilt: two pinned batches, no workers (runs 1-4); stock: as speculators' train.py "
                        "(loader workers collate, pin_memory=True)")
    p.add_argument("--loader-workers", type=int, default=4, help="workers of --loader stock")
    p.add_argument("--peak-tflops", type=float, default=790.0, help="dense bf16 peak used for MFU")
    p.add_argument("--tiny", action="store_true",
                   help="CPU smoke sizes: hidden 64, 4 heads x 16, inter 128, vocab 2048/256, seq 256, 2+2 steps")
    p.add_argument("--no-spec-compat", action="store_true", help="do not import spec_compat in the children")
    p.add_argument("--verifier-dir", default=None, help="synthetic verifier dir (made if missing)")
    p.add_argument("--work-dir", default=None, help="scratch dir (default: a temp dir)")
    p.add_argument("--out-dir", default=None, help="copy child logs and results.json here")
    p.add_argument("--child-timeout", type=float, default=560.0, help="seconds per child phase")
    p.add_argument("--label", default="", help="free text stored in the JSON (e.g. transformers variant)")
    p.add_argument("--variant", action="append", default=None, metavar="NAME:VAR=VAL[;VAR=VAL]",
                   help="run every mode again with these environment overrides (repeatable; 'NAME:' = "
                   "the unchanged environment), e.g. 'tf5:PYTHONPATH=/tmp/site_base'")
    # internal
    p.add_argument("--child", nargs=2, metavar=("MODE", "SEQ"), help=argparse.SUPPRESS)
    p.add_argument("--sync-dir", help=argparse.SUPPRESS)
    p.add_argument("--tag", help=argparse.SUPPRESS)
    a = p.parse_args(argv)
    if a.tiny:
        a.hidden_size, a.num_heads, a.head_dim, a.num_kv_heads = 64, 4, 16, 4
        a.intermediate_size, a.target_vocab, a.draft_vocab = 128, 2048, 256
        if a.seq_lens == p.get_default("seq_lens"):
            a.seq_lens = "256"
        if a.steps == p.get_default("steps"):
            a.steps = 2
        if a.warmup == p.get_default("warmup"):
            a.warmup = 2
        if a.device is None:
            a.device = "cpu"
    return a


def param_counts(a) -> dict[str, int]:
    H, nh, nkv, d, I = a.hidden_size, a.num_heads, a.num_kv_heads, a.head_dim, a.intermediate_size
    first = 2 * H * nh * d + 2 * (2 * H * nkv * d) + nh * d * H + 3 * H * I
    other = H * nh * d + 2 * H * nkv * d + nh * d * H + 3 * H * I
    return {
        "fc": 3 * H * H,
        "layers": first + (a.num_layers - 1) * other,
        "lm_head": H * a.draft_vocab,
        "verifier_lm_head": H * a.draft_vocab,
        "embed_tokens": a.target_vocab * H,
    }


def doc_lengths(T: int, docs: int) -> list[int]:
    base = T // docs
    out = [base] * docs
    out[-1] += T - base * docs
    return out


def step_flops(a, T: int) -> dict[str, float]:
    n = param_counts(a)
    S = a.ttt_steps
    trainable = 6 * T * (n["fc"] + S * (n["layers"] + n["lm_head"]))
    frozen = 2 * T * n["verifier_lm_head"]
    causal_pairs = sum(L * (L + 1) // 2 for L in doc_lengths(T, a.docs))
    attn = sum(3 * 4 * a.head_dim * a.num_heads * (causal_pairs + k * T) for k in range(S)) * a.num_layers
    return {"trainable": float(trainable), "verifier": float(frozen), "attention": float(attn),
            "total": float(trainable + frozen + attn)}


# --------------------------------------------------------------------------- verifier dir
def make_verifier(a, path: Path, device: str) -> None:
    cfg = {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "vocab_size": a.target_vocab,
        "hidden_size": a.hidden_size,
        "intermediate_size": a.intermediate_size,
        "num_hidden_layers": 61,
        "num_attention_heads": a.num_heads,
        "num_key_value_heads": a.num_kv_heads,
        "head_dim": a.head_dim,
        "hidden_act": "silu",
        "max_position_embeddings": 262144,
        "initializer_range": 0.02,
        "rms_norm_eps": 1e-5,
        "rope_theta": 50000.0,
        "tie_word_embeddings": False,
        "torch_dtype": "bfloat16",
        "_benchmark_tensors": ["model.embed_tokens.weight", "lm_head.weight", "model.norm.weight"],
    }
    stamp = path / "config.json"
    if stamp.exists() and (path / "model.safetensors").exists():
        if json.loads(stamp.read_text()) == cfg:
            print(f"[verifier] reusing {path}", flush=True)
            return
    import torch
    from safetensors.torch import save_file

    t0 = time.perf_counter()
    path.mkdir(parents=True, exist_ok=True)
    g = torch.Generator(device=device).manual_seed(1234)
    shape = (a.target_vocab, a.hidden_size)
    tensors = {}
    for name in ("model.embed_tokens.weight", "lm_head.weight"):
        w = torch.empty(shape, device=device, dtype=torch.bfloat16)
        w.normal_(0.0, 0.02, generator=g)
        tensors[name] = w.cpu().contiguous()
    # final norm weight: spec-compat's O7 patch (targets after the final norm) loads it
    tensors["model.norm.weight"] = (1.0 + 0.1 * torch.randn(a.hidden_size, device=device, generator=g)).to(
        torch.bfloat16).cpu()
    save_file(tensors, str(path / "model.safetensors"), metadata={"format": "pt"})
    stamp.write_text(json.dumps(cfg, indent=1))
    print(f"[verifier] wrote {path} ({sum(t.numel() for t in tensors.values()) * 2 / 2**30:.2f} GiB) "
          f"in {time.perf_counter() - t0:.1f}s", flush=True)


# --------------------------------------------------------------------------- child
def _versions() -> dict:
    from importlib import metadata

    out = {"python": sys.version.split()[0]}
    for dist in ("torch", "transformers", "speculators", "triton", "huggingface-hub", "tokenizers", "pydantic"):
        try:
            out[dist] = metadata.version(dist)
        except metadata.PackageNotFoundError:
            out[dist] = None
    return out


def child_main(a) -> int:
    mode, T = a.child[0], int(a.child[1])
    sync = Path(a.sync_dir)
    tag = a.tag
    result: dict = {"mode": mode, "seq_len": T, "status": "started"}

    def write_result():
        (sync / f"result.{tag}.json").write_text(json.dumps(result))

    t_start = time.perf_counter()
    if not a.no_spec_compat:
        import spec_compat  # noqa: F401  (before speculators: applies the registry)
    import torch

    from speculators.config import SpeculatorsConfig, VerifierConfig
    from speculators.models.eagle3 import Eagle3DraftModel, Eagle3SpeculatorConfig
    from speculators.proposals.greedy import GreedyTokenProposalConfig
    from speculators.train.trainer import Trainer, TrainerConfig
    from transformers import AutoConfig, LlamaConfig

    result["versions"] = _versions()
    if not a.no_spec_compat:
        recs = {r.id: r for r in spec_compat.records()}
        r = recs.get(PATCH_ID)
        result["patch_status"] = str(r.status) if r else "absent"
        result["patch_reason"] = r.reason if r else "not registered in this spec_compat"
        result["spec_compat_applied"] = sorted(i for i, r in recs.items() if str(r.status) == "applied")
    else:
        result["patch_status"] = "spec_compat not imported"
    result["import_s"] = time.perf_counter() - t_start

    cuda = a.device == "cuda"
    local_rank = 0 if cuda else "cpu"  # the Trainer does model.to(local_rank) / batch.to(local_rank)
    device = torch.device("cuda", 0) if cuda else torch.device("cpu")

    # vocabulary mapping: t2d bool mask with exactly draft_vocab True; d2t = selected ids - arange
    g = torch.Generator().manual_seed(a.seed)
    selected = torch.randperm(a.target_vocab, generator=g)[: a.draft_vocab].sort().values
    t2d = torch.zeros(a.target_vocab, dtype=torch.bool)
    t2d[selected] = True
    d2t = selected - torch.arange(a.draft_vocab)
    t2d, d2t = t2d.to(device), d2t.to(device)

    # draft model, built as speculators' scripts/train.py (v0.3.0) builds it
    vcfg = AutoConfig.from_pretrained(a.verifier_dir)
    layer_cfg = LlamaConfig(
        vocab_size=vcfg.vocab_size,
        hidden_size=vcfg.hidden_size,
        intermediate_size=vcfg.intermediate_size,
        num_hidden_layers=a.num_layers,
        num_attention_heads=vcfg.num_attention_heads,
        num_key_value_heads=vcfg.num_key_value_heads,
        hidden_act=vcfg.hidden_act,
        max_position_embeddings=vcfg.max_position_embeddings,
        initializer_range=vcfg.initializer_range,
        rms_norm_eps=vcfg.rms_norm_eps,
        head_dim=getattr(vcfg, "head_dim", None),
    )
    layer_cfg._attn_implementation = "simple_flex_attention"
    spec_cfg = Eagle3SpeculatorConfig(
        transformer_layer_config=layer_cfg,
        draft_vocab_size=a.draft_vocab,
        norm_before_residual=True,
        speculators_config=SpeculatorsConfig(
            algorithm="eagle3",
            proposal_methods=[GreedyTokenProposalConfig(proposal_type="greedy", speculative_tokens=a.ttt_steps)],
            default_proposal_method="greedy",
            verifier=VerifierConfig(name_or_path=a.verifier_dir, architectures=["LlamaForCausalLM"]),
        ),
    )
    torch.manual_seed(a.seed)
    t0 = time.perf_counter()
    model = Eagle3DraftModel(config=spec_cfg, t2d=t2d, d2t=d2t)
    if mode == "c":
        model.to(torch.bfloat16)
    result["build_s"] = time.perf_counter() - t0

    # synthetic batches, collated v1 format (after shift_batch: positions start at 1 per document)
    data_dtype = torch.bfloat16 if mode == "c" else torch.float32
    H = a.hidden_size
    lengths = doc_lengths(T, a.docs)
    pos = torch.cat([torch.arange(1, L + 1) for L in lengths]).unsqueeze(0)
    gd = torch.Generator().manual_seed(a.seed + 1)
    batches = []
    for _ in range(2):
        b = {
            "hidden_states": torch.randn(1, T, 3 * H, generator=gd).to(data_dtype),
            "input_ids": torch.randint(0, a.target_vocab, (1, T), generator=gd),
            "verifier_last_hidden_states": torch.randn(1, T, H, generator=gd).to(data_dtype),
            "loss_mask": torch.ones(1, T, dtype=torch.long),
            "lengths": torch.tensor(lengths, dtype=torch.long),
            "position_ids": pos.clone(),
        }
        if cuda and a.loader == "prebuilt":
            b = {k: v.pin_memory() for k, v in b.items()}
        batches.append(b)
    n_steps = a.warmup + a.steps

    class Batches(torch.utils.data.Dataset):
        def __len__(self):
            return n_steps

        def __getitem__(self, i):
            return batches[i % len(batches)]

    if a.loader == "stock":  # as speculators' scripts/train.py: loader workers, pin_memory
        loader = torch.utils.data.DataLoader(Batches(), batch_size=None, shuffle=False, num_workers=a.loader_workers,
                                             pin_memory=cuda)
    else:
        loader = torch.utils.data.DataLoader(Batches(), batch_size=None, shuffle=False, num_workers=0)
    call_kwargs = {"use_off_policy_tokens": False, "ttt_steps": a.ttt_steps, "ttt_step_loss_decay": 1.0}
    tcfg = TrainerConfig(
        lr=a.lr, num_epochs=1, save_path=str(sync / f"ckpt.{tag}"), resume_from_checkpoint=False,
        is_distributed=False, local_rank=local_rank,
        train_call_kwargs=call_kwargs, val_call_kwargs=call_kwargs,
    )
    t0 = time.perf_counter()
    trainer = Trainer(model, tcfg, loader, None)
    result["trainer_setup_s"] = time.perf_counter() - t0
    params = list(trainer.model.parameters())
    result["param_dtypes"] = sorted({str(p.dtype) for p in params})
    result["trainable_dtypes"] = sorted({str(p.dtype) for p in params if p.requires_grad})
    result["opt"] = type(trainer.opt).__name__

    # per-step losses from the Trainer's own metric logger
    import logging

    losses: list[float] = []

    class Grab(logging.Handler):
        def emit(self, record):
            msg = record.msg
            if isinstance(msg, dict) and "train" in msg:
                losses.append(float(msg["train"].get("loss", float("nan"))))

    mlog = logging.getLogger("speculators.metrics")
    mlog.setLevel(logging.INFO)
    mlog.addHandler(Grab())
    mlog.propagate = False

    ev_end: list = []
    host_end: list[float] = []
    mark: dict = {}
    count = [0]

    def post_hook(_opt, _args, _kwargs):
        i = count[0]
        count[0] += 1
        if cuda:
            e = torch.cuda.Event(enable_timing=True)
            e.record()
            ev_end.append(e)
        host_end.append(time.perf_counter())
        if i == a.warmup - 1:
            if cuda:
                torch.cuda.synchronize()
                mark["peak_warmup_gib"] = torch.cuda.max_memory_allocated() / 2**30
                torch.cuda.empty_cache()
                torch.cuda.reset_peak_memory_stats()
            mark["warmup_s"] = time.perf_counter() - mark["epoch_t0"]
            mark["first_step_s"] = host_end[0] - mark["epoch_t0"]
            (sync / f"ready.{tag}").write_text("1")
            go = sync / f"go.{tag}"
            deadline = time.time() + a.child_timeout
            while not go.exists():
                if time.time() > deadline:
                    raise TimeoutError("no go signal")
                time.sleep(0.05)
            if cuda:
                e = torch.cuda.Event(enable_timing=True)
                e.record()
                mark["ev_start"] = e
            mark["host_start"] = time.perf_counter()

    hook = trainer.opt.register_step_post_hook(post_hook)
    result["status"] = "training"
    write_result()
    mark["epoch_t0"] = time.perf_counter()
    trainer.train_epoch(0)
    if cuda:
        torch.cuda.synchronize()
    host_stop = time.perf_counter()
    hook.remove()

    if count[0] != n_steps:
        raise RuntimeError(f"optimizer stepped {count[0]} times, expected {n_steps}")
    if cuda:
        prev = mark["ev_start"]
        ms = []
        for e in ev_end[a.warmup:]:
            ms.append(prev.elapsed_time(e))
            prev = e
        result["peak_gib"] = torch.cuda.max_memory_allocated() / 2**30
        result["peak_warmup_gib"] = mark["peak_warmup_gib"]
        # the host-to-device copy of one batch alone, as the Trainer issues it
        h2d = []
        for _ in range(5):
            s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            s.record()
            _ = {k: v.to(local_rank, non_blocking=True) for k, v in batches[0].items()}
            e.record()
            torch.cuda.synchronize()
            h2d.append(s.elapsed_time(e))
        result["h2d_ms"] = statistics.median(h2d)
        result["gpu"] = torch.cuda.get_device_name(0)
    else:
        ms = [1000 * (t1 - t0) for t0, t1 in zip([mark["host_start"]] + host_end[a.warmup:-1], host_end[a.warmup:])]
        result["peak_gib"] = None
        result["gpu"] = None
    result["host_ms_per_step"] = 1000 * (host_stop - mark["host_start"]) / a.steps
    result["step_ms"] = ms
    result["warmup_s"] = mark["warmup_s"]
    result["first_step_s"] = mark["first_step_s"]
    result["losses"] = losses
    bad = [x for x in losses if not math.isfinite(x)]
    result["status"] = "ok" if not bad else "non-finite loss"
    write_result()
    return 0


# --------------------------------------------------------------------------- parent
def registered_patch_ids() -> set[str]:
    env = dict(os.environ, SPEC_COMPAT_DISABLE="*")
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO_ROOT), env.get("PYTHONPATH", "")]))
    code = "import json, spec_compat; print(json.dumps([p.id for p in spec_compat.REGISTRY.patches()]))"
    r = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    if r.returncode != 0:
        print(f"[spec_compat] import failed: {r.stderr.strip()[-500:]}", flush=True)
        return set()
    return set(json.loads(r.stdout.strip().splitlines()[-1]))


def summarize(a, res: dict) -> dict:
    ms = res.get("step_ms") or []
    if not ms:
        return res
    T = res["seq_len"]
    fl = step_flops(a, T)
    med = statistics.median(ms)
    res.update(
        ms_min=min(ms), ms_median=med, ms_max=max(ms),
        tokens_per_s=T / (med / 1000),
        tflops=fl["total"] / (med / 1000) / 1e12,
        mfu=fl["total"] / (med / 1000) / (a.peak_tflops * 1e12),
        mfu_datasheet=fl["total"] / (med / 1000) / (DATASHEET_BF16_TFLOPS * 1e12),
        flops=fl,
    )
    return res


def run_parent(a) -> int:
    import torch

    if a.device is None:
        a.device = "cuda" if torch.cuda.is_available() else "cpu"
    modes = [m.strip() for m in a.modes.split(",") if m.strip()]
    for m in modes:
        if m not in MODES:
            raise SystemExit(f"unknown mode {m!r}; choose from {', '.join(MODES)}")
    seqs = [int(s) for s in a.seq_lens.split(",") if s.strip()]
    work = Path(a.work_dir or tempfile.mkdtemp(prefix="train_step."))
    work.mkdir(parents=True, exist_ok=True)
    vdir = Path(a.verifier_dir) if a.verifier_dir else work / "verifier"
    a.verifier_dir = str(vdir)
    make_verifier(a, vdir, a.device)
    del torch  # the parent holds no GPU memory beyond the verifier generation
    out_dir = Path(a.out_dir) if a.out_dir else None
    if out_dir:
        out_dir.mkdir(parents=True, exist_ok=True)

    known = set() if a.no_spec_compat else registered_patch_ids()
    have_patch = PATCH_ID in known
    print(f"[spec_compat] {PATCH_ID} registered: {have_patch}", flush=True)

    sync = Path(tempfile.mkdtemp(prefix="sync.", dir=work))
    variants: list[tuple[str, dict]] = []
    for spec in a.variant or [":"]:
        name, _, assigns = spec.partition(":")
        env_over = {}
        for item in filter(None, assigns.split(";")):
            k, _, v = item.partition("=")
            env_over[k.strip()] = v
        variants.append((name.strip(), env_over))
    cells = [(m, T, vn) for T in seqs for vn, _ in variants for m in modes]
    var_env = dict(variants)
    results: list[dict] = []
    base_env = dict(os.environ)
    base_env.setdefault("PYTHONUNBUFFERED", "1")

    def cell_tag(m, T, vn):
        return f"{m}{'@' + vn if vn else ''}-{T}"
    passthrough = [
        "--device", a.device, "--steps", str(a.steps), "--warmup", str(a.warmup), "--docs", str(a.docs),
        "--hidden-size", str(a.hidden_size), "--num-heads", str(a.num_heads), "--head-dim", str(a.head_dim),
        "--num-kv-heads", str(a.num_kv_heads), "--intermediate-size", str(a.intermediate_size),
        "--num-layers", str(a.num_layers), "--target-vocab", str(a.target_vocab),
        "--draft-vocab", str(a.draft_vocab), "--ttt-steps", str(a.ttt_steps), "--lr", str(a.lr),
        "--seed", str(a.seed), "--verifier-dir", a.verifier_dir, "--child-timeout", str(a.child_timeout),
        "--loader", a.loader, "--loader-workers", str(a.loader_workers),
    ] + (["--no-spec-compat"] if a.no_spec_compat else [])

    for g0 in range(0, len(cells), max(1, a.concurrency)):
        group = cells[g0:g0 + max(1, a.concurrency)]
        procs = {}
        for m, T, vn in group:
            env = dict(base_env)
            env.update(var_env[vn])
            env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO_ROOT), env.get("PYTHONPATH", "")]))
            env.pop("SPEC_COMPAT_DISABLE", None)
            if m in ("a", "c") and have_patch:
                env["SPEC_COMPAT_DISABLE"] = PATCH_ID
            tag = cell_tag(m, T, vn)
            log = open(sync / f"log.{tag}.txt", "w")
            cmd = [sys.executable, str(Path(__file__).resolve()), "--child", m, str(T),
                   "--sync-dir", str(sync), "--tag", tag] + passthrough
            procs[(m, T, vn)] = (subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT), log)
            print(f"[start] {tag} pid {procs[(m, T, vn)][0].pid}", flush=True)
        # wait until every child of the group is warmed up (or gone)
        t0 = time.time()
        pending = set(procs)
        while pending and time.time() - t0 < a.child_timeout:
            for key in list(pending):
                tag = cell_tag(*key)
                if (sync / f"ready.{tag}").exists() or procs[key][0].poll() is not None:
                    pending.discard(key)
                    print(f"[ready] {tag} after {time.time() - t0:.0f}s "
                          f"(rc={procs[key][0].poll()})", flush=True)
            time.sleep(0.2)
        # release one at a time
        for key in group:
            m, T, vn = key
            tag = cell_tag(m, T, vn)
            p, log = procs[key]
            if p.poll() is None and (sync / f"ready.{tag}").exists():
                (sync / f"go.{tag}").write_text("1")
                try:
                    p.wait(timeout=a.child_timeout)
                except subprocess.TimeoutExpired:
                    p.kill()
                    p.wait()
            elif p.poll() is None:
                p.kill()
                p.wait()
            log.close()
            rfile = sync / f"result.{tag}.json"
            res = json.loads(rfile.read_text()) if rfile.exists() else {"mode": m, "seq_len": T}
            res["variant"] = vn
            if res.get("status") != "ok":
                res["status"] = f"{res.get('status', 'no result')} (rc={p.returncode})"
                res["log_tail"] = (sync / f"log.{tag}.txt").read_text()[-3000:]
                print(f"[fail] {tag}: {res['status']}\n{res['log_tail']}", flush=True)
            res["mode_desc"] = MODES[m]
            results.append(summarize(a, res))
            if out_dir:
                with open(out_dir / "logs.txt", "a") as fh:
                    fh.write(f"===== {tag} =====\n{(sync / f'log.{tag}.txt').read_text()[-100000:]}\n")
            if out_dir:
                (out_dir / "results.json").write_text(json.dumps(
                    [{k: v for k, v in x.items() if k != "log_tail"} for x in results], indent=1))
            r = results[-1]
            if "ms_median" in r:
                print(f"[done] {tag}: median {r['ms_median']:.1f} ms, MFU {100 * r['mfu']:.1f}%", flush=True)

    # table
    print()
    print(f"peak for MFU: {a.peak_tflops:.0f} TFLOP/s dense bf16; dims H={a.hidden_size} heads={a.num_heads}x{a.head_dim} "
          f"kv={a.num_kv_heads} inter={a.intermediate_size} layers={a.num_layers} vocab={a.target_vocab}/{a.draft_vocab} "
          f"ttt={a.ttt_steps} docs/seq={a.docs}")
    w = max([26] + [len(r['mode_desc']) + 7 + (len(r['variant']) + 3 if r.get('variant') else 0) for r in results])
    hdr = (f"{'mode':<{w}} {'T':>5} {'ms min':>8} {'median':>8} {'max':>8} {'tok/s':>8} {'peak GiB':>8} "
           f"{'TFLOP/s':>8} {'MFU':>6} {'h2d ms':>6} {'1st s':>6} {'loss0':>8} {'patch':<12}")
    print(hdr)
    print("-" * len(hdr))
    for r in results:
        name = f"({r['mode']}) {r['mode_desc']}" + (f" [{r['variant']}]" if r.get("variant") else "")
        if "ms_median" not in r:
            print(f"{name:<{w}} {r['seq_len']:>5} FAILED: {r.get('status')}")
            continue
        peak = f"{r['peak_gib']:.1f}" if r.get("peak_gib") is not None else "-"
        h2d = f"{r['h2d_ms']:.1f}" if r.get("h2d_ms") is not None else "-"
        loss0 = f"{r['losses'][0]:.4f}" if r.get("losses") else "-"
        print(f"{name:<{w}} {r['seq_len']:>5} {r['ms_min']:>8.1f} {r['ms_median']:>8.1f} {r['ms_max']:>8.1f} "
              f"{r['tokens_per_s']:>8.0f} {peak:>8} {r['tflops']:>8.1f} {100 * r['mfu']:>5.1f}% {h2d:>6} "
              f"{r['first_step_s']:>6.1f} {loss0:>8} {r.get('patch_status', '-'):<12}")
    ratios = {}
    for T in seqs:
        for vn, _ in variants:
            by = {r["mode"]: r for r in results
                  if r["seq_len"] == T and r.get("variant") == vn and "ms_median" in r}
            if "b" in by:
                for other in ("a", "c"):
                    if other in by:
                        key = f"b/{other}@{T}" + (f"[{vn}]" if vn else "")
                        ratios[key] = by[other]["ms_median"] / by["b"]["ms_median"]
    if ratios:
        print("throughput ratios (tokens/s): " + ", ".join(f"{k} = {v:.2f}" for k, v in ratios.items()))
    summary = {
        "label": a.label, "device": a.device, "peak_tflops": a.peak_tflops,
        "dims": {k: getattr(a, k) for k in ("hidden_size", "num_heads", "head_dim", "num_kv_heads",
                                            "intermediate_size", "num_layers", "target_vocab", "draft_vocab",
                                            "ttt_steps", "docs", "steps", "warmup", "loader", "loader_workers")},
        "param_counts": param_counts(a), "patch_registered": have_patch, "ratios": ratios,
        "results": [{k: v for k, v in r.items() if k != "log_tail"} for r in results],
    }
    if out_dir:
        (out_dir / "results.json").write_text(json.dumps(summary, indent=1))
    print("RESULT_JSON " + json.dumps(summary))
    return 0 if all("ms_median" in r for r in results) else 1


def main(argv=None) -> int:
    a = parse_args(argv)
    if a.child:
        try:
            return child_main(a)
        except BaseException as exc:  # record the failure for the parent, then re-raise
            import traceback

            traceback.print_exc()
            try:
                p = Path(a.sync_dir) / f"result.{a.tag}.json"
                res = json.loads(p.read_text()) if p.exists() else {"mode": a.child[0], "seq_len": int(a.child[1])}
                res["status"] = f"error: {type(exc).__name__}: {str(exc)[:800]}"
                p.write_text(json.dumps(res))
            finally:
                raise
    return run_parent(a)


if __name__ == "__main__":
    sys.exit(main())
