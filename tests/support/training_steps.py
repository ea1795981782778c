"""Steps of ``spec-compat demo`` run one at a time in a fresh process, for the engine tests
(training with a patch disabled, the training targets, an untrained draft, reload) and the
benchmarks: ``python tests/support/training_steps.py STEP JSON`` prints
``SPEC_COMPAT_RESULT <json>``.  STEP: train, preprocess, untrained, targets, reload.
Runs as a script by path (also under ``torch.distributed.run``); spec_compat must be importable.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

from spec_compat.cli.demo_steps import DEMO_DATA, MetricCollector, build_draft, preprocess, train, verifier_text_config

#: this file, for the tests and benchmarks that run it
SCRIPT = Path(__file__).resolve()


def train_from_data(model_dir: str, data_dir: str, vocab_dir: str, save: str, epochs: int = 1,
                    lr: float = 1e-3, total_seq_len: int = 1024, resume: bool = False) -> dict[str, Any]:
    """Training step of the demo on data it extracted earlier (tests run it with patches disabled)."""
    import spec_compat  # noqa: F401

    collector = MetricCollector()
    train(Path(model_dir), Path(data_dir), Path(vocab_dir) / "d2t.npy", Path(vocab_dir) / "t2d.npy", Path(save),
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

    from spec_compat.shims.verifier import checkpoint_names, find_prefixed, rms_norm

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
    eps = float(verifier_text_config(Path(model_dir)).rms_norm_eps)
    raw = batch["verifier_last_hidden_states"]
    n = int(batch["lengths"].sum())
    got = seen[0][:, :n]
    normed = rms_norm(raw, weight, eps)[:, :n]
    from spec_compat.verify.compare import compare_states

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


def main(argv: list[str]) -> int:
    """``python tests/support/training_steps.py STEP JSON``: one step in this process."""
    step, kwargs = argv[0], json.loads(argv[1]) if len(argv) > 1 else {}
    if step == "train":
        out: Any = train_from_data(**kwargs)
    elif step == "preprocess":
        import spec_compat  # noqa: F401

        ds = preprocess(Path(kwargs["model_dir"]), Path(kwargs.get("data") or DEMO_DATA), Path(kwargs["out"]),
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
    raise SystemExit(main(sys.argv[1:]))
