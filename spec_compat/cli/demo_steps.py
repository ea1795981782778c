"""The steps of ``spec-compat demo``'s pipeline, each a call into speculators' own code with the
arguments its stock scripts use (``scripts/train.py`` etc. are not part of the speculators wheel,
so the demo drives the same library calls): speculators' preprocessing (tokenise, loss masks,
token frequencies), the stock vLLM hidden-state generator writing ``data_N.pt`` files and
``data_config.json`` (the format of ``scripts/data_generation_offline.py``), the vocabulary
mapping (``d2t``/``t2d``), and the EAGLE-3 draft built and trained by ``speculators.train.Trainer``.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

log = logging.getLogger("spec_compat")

DEMO_DATA = Path(__file__).parent.parent / "data" / "demo_chat.jsonl"


class MetricCollector(logging.Handler):
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


def verifier_text_config(model_dir: Path) -> Any:
    from transformers import AutoConfig

    from ..shims.verifier import text_config

    # our own fixture: its remote code is ours
    return text_config(AutoConfig.from_pretrained(str(model_dir), trust_remote_code=True))


def preprocess(model_dir: Path, jsonl: Path, out: Path, seq_len: int) -> Any:
    from speculators.data_generation.preprocessing import load_and_preprocess_dataset

    dataset, _tok = load_and_preprocess_dataset(
        target_model_path=str(model_dir), train_data_path=str(jsonl), seq_length=seq_len,
        build_dataset_num_proc=1, seed=0, token_freq_path=str(out / "token_freq.pt"),
        cache_dir=str(out / "hf_cache"))
    if len(dataset) == 0:
        raise RuntimeError("speculators' preprocessing produced no samples (every conversation was dropped)")
    return dataset


def extract(model_dir: Path, dataset: Any, data_dir: Path, layer_ids: list[int] | None, seq_len: int,
             batch_size: int, train_data: Path = DEMO_DATA) -> tuple[int, int]:
    """``layer_ids=None``: speculators' own choice ``[2, n//2, n-3, n-1]``."""
    import torch
    from speculators.data_generation.config_generator import DataGenerationConfig
    from speculators.data_generation.vllm_hidden_states_generator import VllmHiddenStatesGenerator

    from ..verify.settings import preferring_non_mla

    with preferring_non_mla(verifier_text_config(model_dir)):
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
                log.info("extracted %d/%d samples", n, len(dataset))
            config = DataGenerationConfig.from_generator(
                generator=gen, train_data_path=str(train_data), seq_length=seq_len,
                cache_dir=str(data_dir.parent / "hf_cache"), num_samples=n, max_samples=None, seed=0)
            (data_dir / "data_config.json").write_text(json.dumps(config.to_dict(), indent=2))
        finally:
            del gen
    return n, tokens


def vocab_mapping(model_dir: Path, out: Path, draft_vocab: int) -> tuple[Path, Path]:
    import numpy as np
    import torch
    from speculators.train.vocab_mapping import build_vocab_mappings_from_distribution

    target_vocab = int(verifier_text_config(model_dir).vocab_size)
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

    v = verifier_text_config(model_dir)
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


def train(model_dir: Path, data_dir: Path, d2t_path: Path, t2d_path: Path, save: Path, epochs: int,
           total_seq_len: int, lr: float, collector: MetricCollector, resume: bool = False) -> None:
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
