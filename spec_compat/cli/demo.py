"""The whole stock pipeline on a tiny fixture, on this machine: ``spec-compat demo``.

fixture -> the chat jsonl shipped with spec-compat -> speculators' preprocessing
(tokenise, loss masks, token frequencies) -> speculators' vLLM hidden-state
generator -> ``data_N.pt`` files + ``data_config.json`` (the format of speculators'
``scripts/data_generation_offline.py``) -> vocabulary mapping (``d2t``/``t2d``,
``speculators.train.vocab_mapping``) -> EAGLE-3 draft trained by
``speculators.train.Trainer`` -> saved draft, reloaded with speculators' loader ->
``report``.

Every step calls speculators' own code with the arguments its stock scripts use
(``scripts/train.py`` etc. are not part of the speculators wheel, so the demo
drives the same library calls); spec-compat only applies its registry.
"""

from __future__ import annotations

import json
import logging
import os
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

log = logging.getLogger("spec_compat")

DEMO_DATA = Path(__file__).parent.parent / "data" / "demo_chat.jsonl"


@dataclass
class DemoResult:
    out: Path
    model_dir: Path
    data_dir: Path
    draft_dir: Path
    samples: int = 0
    tokens: int = 0
    layer_ids: list[int] = field(default_factory=list)
    aux_layer_ids: list[int] | None = None
    losses: list[float] = field(default_factory=list)
    val_losses: list[float] = field(default_factory=list)
    timings: dict[str, float] = field(default_factory=dict)
    regenerated: dict[str, int] | None = None
    evaluation: dict[str, Any] | None = None
    #: why the serving step did not run (vLLM without speculative decoding on this platform)
    evaluation_skipped: str | None = None

    def as_dict(self) -> dict[str, Any]:
        d = dict(self.__dict__)
        for k in ("out", "model_dir", "data_dir", "draft_dir"):
            d[k] = str(d[k])
        return d


class _Progress:
    def __init__(self, total: int, stream: Any = None) -> None:
        self.total = total
        self.n = 0
        self.stream = stream or sys.stderr
        self.t0 = time.perf_counter()
        self.timings: dict[str, float] = {}

    def step(self, name: str, fn: Callable[[], Any]) -> Any:
        self.n += 1
        print(f"[demo {self.n}/{self.total}] {name} ...", file=self.stream, flush=True)
        t = time.perf_counter()
        out = fn()
        dt = time.perf_counter() - t
        self.timings[name] = round(dt, 2)
        print(f"[demo {self.n}/{self.total}] {name}: done in {dt:.1f}s", file=self.stream, flush=True)
        return out


class _MetricCollector(logging.Handler):
    """Collects the per-step metrics speculators' Trainer logs on ``speculators.metrics``."""

    def __init__(self) -> None:
        super().__init__(level=logging.INFO)
        self.train: list[float] = []
        self.val: list[float] = []

    def emit(self, record: logging.LogRecord) -> None:
        msg = record.msg
        if isinstance(msg, dict):
            if "train" in msg and "loss" in msg["train"]:
                self.train.append(float(msg["train"]["loss"]))
            if "val" in msg and "loss_epoch" in msg["val"]:
                self.val.append(float(msg["val"]["loss_epoch"]))


def _verifier_text_config(model_dir: Path) -> Any:
    from transformers import AutoConfig

    from ..shims.verifier import text_config

    # our own fixture: its remote code is ours
    return text_config(AutoConfig.from_pretrained(str(model_dir), trust_remote_code=True))


def _preprocess(model_dir: Path, jsonl: Path, out: Path, seq_len: int) -> Any:
    from speculators.data_generation.preprocessing import load_and_preprocess_dataset

    dataset, _tok = load_and_preprocess_dataset(
        target_model_path=str(model_dir), train_data_path=str(jsonl), seq_length=seq_len,
        build_dataset_num_proc=1, seed=0, token_freq_path=str(out / "token_freq.pt"),
        cache_dir=str(out / "hf_cache"))
    if len(dataset) == 0:
        raise RuntimeError("speculators' preprocessing produced no samples (every conversation was dropped)")
    return dataset


def _extract(model_dir: Path, dataset: Any, data_dir: Path, layer_ids: list[int] | None, seq_len: int,
             batch_size: int, train_data: Path = DEMO_DATA) -> tuple[int, int]:
    """``layer_ids=None``: speculators' own choice ``[2, n//2, n-3, n-1]``."""
    import torch
    from speculators.data_generation.config_generator import DataGenerationConfig
    from speculators.data_generation.vllm_hidden_states_generator import VllmHiddenStatesGenerator

    from ..verify.settings import prefer_non_mla

    prefer_non_mla(_verifier_text_config(model_dir))
    data_dir.mkdir(parents=True, exist_ok=True)
    gen = VllmHiddenStatesGenerator(str(model_dir), layer_ids=layer_ids, max_model_len=seq_len)
    n = tokens = 0
    try:
        for start in range(0, len(dataset), batch_size):
            batch = dataset[start:start + batch_size]
            results = gen.generate(batch["input_ids"])
            for j, res in enumerate(results):
                ids = res["input_ids"]
                torch.save({"input_ids": ids,
                            "hidden_states": [h.contiguous() for h in res["hidden_states"]],
                            "loss_mask": batch["loss_mask"][j][: len(ids)]}, data_dir / f"data_{n}.pt")
                n += 1
                tokens += len(ids)
            print(f"  extracted {n}/{len(dataset)} samples", file=sys.stderr, flush=True)
        config = DataGenerationConfig.from_generator(
            generator=gen, train_data_path=str(train_data), seq_length=seq_len,
            cache_dir=str(data_dir.parent / "hf_cache"), num_samples=n, max_samples=None, seed=0)
        (data_dir / "data_config.json").write_text(json.dumps(config.to_dict(), indent=2))
    finally:
        del gen
    return n, tokens


def _vocab_mapping(model_dir: Path, out: Path, draft_vocab: int) -> tuple[Path, Path]:
    import numpy as np
    import torch
    from speculators.train.vocab_mapping import build_vocab_mappings_from_distribution

    target_vocab = int(_verifier_text_config(model_dir).vocab_size)
    freq = torch.load(out / "token_freq.pt", weights_only=True)
    d2t, t2d = build_vocab_mappings_from_distribution(
        token_freq_dict=freq, draft_vocab_size=min(draft_vocab, target_vocab), target_vocab_size=target_vocab)
    vocab = out / "vocab_mapping"
    vocab.mkdir(parents=True, exist_ok=True)
    np.save(vocab / "d2t.npy", d2t.cpu().numpy())
    np.save(vocab / "t2d.npy", t2d.cpu().numpy())
    return vocab / "d2t.npy", vocab / "t2d.npy"


def build_draft(model_dir: Path, d2t: Any, t2d: Any) -> Any:
    """The EAGLE-3 draft as speculators' scripts/train.py builds it (one Llama decoder layer sized
    from the verifier's text config, 3 test-time-training steps, greedy proposals)."""
    from speculators.config import SpeculatorsConfig, VerifierConfig
    from speculators.models.eagle3 import Eagle3DraftModel, Eagle3SpeculatorConfig
    from speculators.proposals.greedy import GreedyTokenProposalConfig
    from transformers import LlamaConfig

    v = _verifier_text_config(model_dir)
    layer_config = LlamaConfig(
        vocab_size=v.vocab_size, hidden_size=v.hidden_size, intermediate_size=v.intermediate_size,
        num_hidden_layers=1, num_attention_heads=v.num_attention_heads,
        num_key_value_heads=v.num_key_value_heads, hidden_act=v.hidden_act,
        max_position_embeddings=v.max_position_embeddings, initializer_range=v.initializer_range,
        rms_norm_eps=v.rms_norm_eps, head_dim=getattr(v, "head_dim", None))
    layer_config._attn_implementation = "simple_flex_attention"  # as scripts/train.py
    arch = (getattr(v, "architectures", None) or ["LlamaForCausalLM"])[0]
    config = Eagle3SpeculatorConfig(
        transformer_layer_config=layer_config, draft_vocab_size=int(d2t.shape[0]), norm_before_residual=True,
        speculators_config=SpeculatorsConfig(
            algorithm="eagle3",
            proposal_methods=[GreedyTokenProposalConfig(proposal_type="greedy", speculative_tokens=3)],
            default_proposal_method="greedy",
            verifier=VerifierConfig(name_or_path=str(model_dir), architectures=[arch])))
    return Eagle3DraftModel(config, t2d, d2t)


def _train(model_dir: Path, data_dir: Path, d2t_path: Path, t2d_path: Path, save: Path, epochs: int,
           total_seq_len: int, lr: float, collector: _MetricCollector, resume: bool = False) -> None:
    """speculators' scripts/train.py main(), single process, with the library's own objects."""
    import numpy as np
    import torch
    from speculators.train.data import (Eagle3SampleFileDataset, create_collate_fn, split_files,
                                        standardize_data_v1)
    from speculators.train.distributed_batch_sampler import MultipackDistributedBatchSamplerV2
    from speculators.train.noise_transforms import AddUniformNoise
    from speculators.train.trainer import Trainer, TrainerConfig
    from speculators.train.utils import maybe_setup_distributed
    from torch.utils.data import DataLoader

    torch.manual_seed(0)
    local_rank, world_size, _rank, is_distributed = maybe_setup_distributed()
    device = torch.device(local_rank)
    d2t = torch.from_numpy(np.load(d2t_path)).to(device)
    t2d = torch.from_numpy(np.load(t2d_path)).to(device)
    model = build_draft(model_dir, d2t, t2d)

    train_files, val_files = split_files(str(data_dir), ratio=0.9)

    def loader(files: list[Any], noise: bool) -> DataLoader:
        ds = Eagle3SampleFileDataset(
            file_list=files, max_len=total_seq_len, standardize_fn=standardize_data_v1,
            transform=AddUniformNoise(std=0.05, tensors=("hidden_states", "verifier_last_hidden_states"))
            if noise else None)
        sampler = MultipackDistributedBatchSamplerV2(batch_max_length=total_seq_len, lengths=ds.approx_lengths,
                                                     num_replicas=world_size, rank=local_rank)
        return DataLoader(ds, batch_sampler=sampler, num_workers=0, collate_fn=create_collate_fn(total_seq_len))

    kwargs = {"use_off_policy_tokens": False, "ttt_steps": 3, "ttt_step_loss_decay": 1.0}
    trainer = Trainer(model, TrainerConfig(
        num_epochs=epochs, save_path=str(save), lr=lr, resume_from_checkpoint=resume, is_distributed=is_distributed,
        local_rank=local_rank, train_call_kwargs=kwargs, val_call_kwargs=kwargs),
        loader(train_files, True), loader(val_files, False) if val_files else None)
    metrics = logging.getLogger("speculators.metrics")
    level = metrics.level
    if not metrics.isEnabledFor(logging.INFO):
        metrics.setLevel(logging.INFO)  # the Trainer logs its per-step metrics at INFO
    metrics.addHandler(collector)
    try:
        trainer.run_training()
    finally:
        metrics.removeHandler(collector)
        metrics.setLevel(level)


def run_demo(model: str = "llama", out: str | os.PathLike[str] | None = None, epochs: int = 24,
             seq_len: int = 1024, total_seq_len: int = 1024, draft_vocab: int = 256, lr: float = 3e-3,
             batch_size: int = 16, data: str | os.PathLike[str] | None = None, regenerate: bool = True,
             evaluate: bool = True, k: int = 3) -> DemoResult:
    """Run the pipeline; returns what it produced and measured.  Raises on any failed step.

    ``regenerate``: the assistant turns of the chat data are first rewritten by the target itself
    (greedy, vLLM), so the draft learns the target's own distribution.  ``evaluate``: the saved
    draft is served as EAGLE-3 speculator (``spec-compat evaluate``) on held-out prompts."""
    import spec_compat  # noqa: F401  (the registry is applied before speculators is imported)

    from ..fixtures import build

    fixture = {"llama": "llama", "kimi-k25": "kimi-k25", "kimi": "kimi-k25"}.get(model)
    if fixture is None:
        raise ValueError(f"unknown demo model {model!r}: use llama or kimi-k25")
    out_dir = Path(out or Path.cwd() / "spec-compat-demo" / fixture).resolve()
    jsonl = Path(data) if data else DEMO_DATA
    if not jsonl.is_file():
        raise FileNotFoundError(f"chat data not found: {jsonl}")
    res = DemoResult(out=out_dir, model_dir=out_dir / "model", data_dir=out_dir / "hidden_states",
                     draft_dir=out_dir / "draft")
    if res.data_dir.exists() and any(res.data_dir.iterdir()):
        raise FileExistsError(f"{res.data_dir} is not empty: choose a new --out (nothing is overwritten)")
    res.draft_dir.mkdir(parents=True, exist_ok=True)
    if any(res.draft_dir.iterdir()):
        raise FileExistsError(f"{res.draft_dir} is not empty: choose a new --out (nothing is overwritten)")

    p = _Progress(7 + int(regenerate) + int(evaluate))
    p.step(f"fixture {fixture}", lambda: build(fixture, res.model_dir))
    text = _verifier_text_config(res.model_dir)
    res.layer_ids = list(range(int(text.num_hidden_layers)))
    if regenerate:
        from .evaluate import regenerate_chats

        regen = out_dir / "regenerated_chat.jsonl"
        res.regenerated = p.step("regenerate the assistant turns with the target (vLLM, greedy)",
                                 lambda: regenerate_chats(res.model_dir, jsonl, regen, max_model_len=seq_len))
        jsonl = regen
    dataset = p.step("preprocess chat data (speculators.data_generation.preprocessing)",
                     lambda: _preprocess(res.model_dir, jsonl, out_dir, seq_len))
    res.samples, res.tokens = p.step(
        f"extract hidden states of layers {res.layer_ids} (stock VllmHiddenStatesGenerator)",
        lambda: _extract(res.model_dir, dataset, res.data_dir, res.layer_ids, seq_len, batch_size, jsonl))
    d2t, t2d = p.step("vocabulary mapping (speculators.train.vocab_mapping)",
                      lambda: _vocab_mapping(res.model_dir, out_dir, draft_vocab))
    collector = _MetricCollector()
    p.step(f"train the EAGLE-3 draft for {epochs} epochs (speculators.train.Trainer)",
           lambda: _train(res.model_dir, res.data_dir, d2t, t2d, res.draft_dir, epochs, total_seq_len, lr,
                          collector))
    res.losses, res.val_losses = collector.train, collector.val

    def reload() -> Any:
        from speculators.models.eagle3 import Eagle3DraftModel

        last = max((d for d in res.draft_dir.iterdir() if d.name.isdigit()), key=lambda d: int(d.name))
        draft = Eagle3DraftModel.from_pretrained(str(last))
        return last, draft.config.eagle_aux_hidden_state_layer_ids

    last, res.aux_layer_ids = p.step("reload the saved draft (Eagle3DraftModel.from_pretrained)", reload)
    res.draft_dir = last
    if evaluate:
        from .evaluate import evaluate as serve_and_measure, serving_unsupported

        res.evaluation_skipped = serving_unsupported()
    if evaluate and res.evaluation_skipped:
        print(f"[demo] serving step skipped: {res.evaluation_skipped}", file=sys.stderr, flush=True)
    elif evaluate:
        res.evaluation = p.step(f"serve the draft as EAGLE-3 speculator, k={k} (spec-compat evaluate)",
                                lambda: serve_and_measure(res.model_dir, last, k=k, max_model_len=seq_len).as_dict())

    def report() -> None:
        from . import report_data

        data = report_data()
        counts: dict[str, int] = {}
        for r in data["patches"]:
            counts[r["status"]] = counts.get(r["status"], 0) + 1
        applied = [r["id"] for r in data["patches"] if r["status"] == "applied"]
        print(f"  patches: {counts}; applied here: {', '.join(applied)}", file=sys.stderr)

    p.step("report", report)
    res.timings = p.timings
    return res


def summary(res: DemoResult) -> str:
    first = sum(res.losses[:3]) / max(1, len(res.losses[:3]))
    last = sum(res.losses[-3:]) / max(1, len(res.losses[-3:]))
    return "\n".join([
        f"model:            {res.model_dir}",
        f"hidden states:    {res.samples} samples, {res.tokens} tokens, layers {res.layer_ids} -> {res.data_dir}",
        f"training:         {len(res.losses)} steps, loss {first:.3f} (first 3) -> {last:.3f} (last 3)"
        + (f", val loss {res.val_losses[0]:.3f} -> {res.val_losses[-1]:.3f}" if res.val_losses else ""),
        f"draft:            {res.draft_dir} (eagle_aux_hidden_state_layer_ids={res.aux_layer_ids})",
        "timings (s):      " + ", ".join(f"{k.split(' (')[0]}={v}" for k, v in res.timings.items()),
    ] + ([f"regenerated:      {res.regenerated['replies']} assistant replies, {res.regenerated['tokens']} tokens "
          "(target, greedy)"] if res.regenerated else [])
      + (["", "evaluate (draft served by vLLM on held-out prompts):", _evaluation_table(res.evaluation)]
         if res.evaluation else []))


def _evaluation_table(data: dict[str, Any]) -> str:
    from .evaluate import EvalResult, table

    return table(EvalResult(**data))


def train_from_data(model_dir: str, data_dir: str, vocab_dir: str, save: str, epochs: int = 1,
                    lr: float = 1e-3, total_seq_len: int = 1024, resume: bool = False) -> dict[str, Any]:
    """Training step of the demo on data it extracted earlier (tests run it with patches disabled)."""
    import spec_compat  # noqa: F401

    collector = _MetricCollector()
    _train(Path(model_dir), Path(data_dir), Path(vocab_dir) / "d2t.npy", Path(vocab_dir) / "t2d.npy", Path(save),
           epochs, total_seq_len, lr, collector, resume=resume)
    return {"losses": collector.train, "val_losses": collector.val}


def training_targets_check(model_dir: str, data_dir: str, vocab_dir: str, total_seq_len: int = 1024) -> dict[str, Any]:
    """What the draft's frozen ``verifier_lm_head`` receives in one training forward, against the
    verifier's final RMSNorm of the last captured layer (speculators >= 0.4 / O7) and against
    the raw states (speculators 0.3.0 stock): max |difference| to each."""
    import spec_compat  # noqa: F401
    import numpy as np
    import torch
    from speculators.train.data import Eagle3SampleFileDataset, create_collate_fn, list_files, standardize_data_v1

    from ..shims.verifier import checkpoint_names, find_prefixed, rms_norm

    d2t = torch.from_numpy(np.load(Path(vocab_dir) / "d2t.npy"))
    t2d = torch.from_numpy(np.load(Path(vocab_dir) / "t2d.npy"))
    model = build_draft(Path(model_dir), d2t, t2d)
    ds = Eagle3SampleFileDataset(file_list=sorted(list_files(data_dir))[:2], max_len=total_seq_len,
                                 standardize_fn=standardize_data_v1)
    batch = create_collate_fn(total_seq_len)([ds[0], ds[1]])
    seen: list[Any] = []
    model.verifier_lm_head.register_forward_pre_hook(lambda _m, a: seen.append(a[0].detach()))
    with torch.no_grad():
        model(**batch, ttt_steps=1, use_off_policy_tokens=False, ttt_step_loss_decay=1.0)
    name = "model.norm.weight"
    stored = find_prefixed([name], checkpoint_names(model_dir, "verifier-weights-wrapper-prefix")).get(name, name)
    from safetensors import safe_open

    weight = None
    for f in sorted(Path(model_dir).glob("*.safetensors")):
        with safe_open(str(f), framework="pt") as fh:
            if stored in fh.keys():
                weight = fh.get_tensor(stored).float()
    eps = float(_verifier_text_config(Path(model_dir)).rms_norm_eps)
    raw = batch["verifier_last_hidden_states"]
    n = int(batch["lengths"].sum())
    got = seen[0][:, :n]
    normed = rms_norm(raw, weight, eps)[:, :n]
    from ..verify.compare import compare_states

    out: dict[str, Any] = {"tokens": n}
    for key, want in (("vs_final_norm", normed), ("vs_raw", raw[:, :n])):
        c = compare_states(got, want, tolerance=None, upcast=True, sides=("lm-head input", key[3:]))
        if not c.ok or c.max_abs_diff is None:  # NaN/inf, empty, shape: no figure to report
            raise RuntimeError(f"training-targets check {key}: {c.detail}")
        out[key] = c.max_abs_diff
    return out


def save_untrained_draft(model_dir: str, vocab_dir: str, out: str, aux_layer_ids: list[int] | None,
                         seed: int = 0) -> dict[str, Any]:
    """A freshly initialised draft (speculators' own init, as training starts from) saved in
    speculators' format: the untrained baseline of the serving tests."""
    import spec_compat  # noqa: F401
    import numpy as np
    import torch

    torch.manual_seed(seed)
    d2t = torch.from_numpy(np.load(Path(vocab_dir) / "d2t.npy"))
    t2d = torch.from_numpy(np.load(Path(vocab_dir) / "t2d.npy"))
    draft = build_draft(Path(model_dir), d2t, t2d)
    if aux_layer_ids is not None:
        draft.config.eagle_aux_hidden_state_layer_ids = list(aux_layer_ids)
    draft.save_pretrained(out)
    return {"path": out}


def _main(argv: list[str]) -> int:
    """``python -m spec_compat.cli.demo STEP JSON``: one step of the demo in this process (for tests)."""
    step, kwargs = argv[0], json.loads(argv[1]) if len(argv) > 1 else {}
    if step == "train":
        out: Any = train_from_data(**kwargs)
    elif step == "preprocess":
        import spec_compat  # noqa: F401

        ds = _preprocess(Path(kwargs["model_dir"]), Path(kwargs.get("data") or DEMO_DATA), Path(kwargs["out"]),
                         int(kwargs.get("seq_len", 1024)))
        out = {"samples": len(ds), "tokens": int(sum(len(x) for x in ds["input_ids"]))}
    elif step == "untrained":
        out = save_untrained_draft(**kwargs)
    elif step == "targets":
        out = training_targets_check(**kwargs)
    elif step == "reload":
        import spec_compat  # noqa: F401
        from speculators.models.eagle3 import Eagle3DraftModel

        draft = Eagle3DraftModel.from_pretrained(kwargs["path"])
        out = {"aux": draft.config.eagle_aux_hidden_state_layer_ids, "draft_vocab": int(draft.t2d.sum())}
    else:
        print(f"unknown step {step!r}", file=sys.stderr)
        return 2
    print("SPEC_COMPAT_RESULT " + json.dumps(out))
    return 0


if __name__ == "__main__":
    raise SystemExit(_main(sys.argv[1:]))
