"""What speculators 0.3.0's stock ``scripts/train.py`` does before training, step by
step: import, build the Eagle3 draft config (LlamaConfig layer config, SpeculatorsConfig,
VerifierConfig, GreedyTokenProposalConfig), build the draft model, run it, save and
reload the config.

As a script (``python t1_steps.py VERIFIER_DIR OUT_DIR``: ``import spec_compat`` first,
SPEC_COMPAT_DISABLE deciding what it applies) it prints ``T1-OK`` or
``T1-FAIL <step> <ExceptionType>: <message>`` (exit 1) after the traceback.
"""

from __future__ import annotations

import sys
import traceback
from pathlib import Path
from typing import Any

DRAFT_VOCAB = 256
SEQ_LEN = 128  # flex attention blocks: a multiple of 128


def build_config(verifier: str | Path, num_layers: int = 1) -> Any:
    """Eagle3SpeculatorConfig as scripts/train.py (v0.3.0) builds it."""
    from speculators.config import SpeculatorsConfig, VerifierConfig
    from speculators.models.eagle3 import Eagle3SpeculatorConfig
    from speculators.proposals.greedy import GreedyTokenProposalConfig
    from transformers import LlamaConfig
    from transformers.models.auto.configuration_auto import AutoConfig

    vc = AutoConfig.from_pretrained(str(verifier))
    layer_config = LlamaConfig(
        vocab_size=vc.vocab_size,
        hidden_size=vc.hidden_size,
        intermediate_size=vc.intermediate_size,
        num_hidden_layers=num_layers,
        num_attention_heads=vc.num_attention_heads,
        num_key_value_heads=vc.num_key_value_heads,
        hidden_act=vc.hidden_act,
        max_position_embeddings=vc.max_position_embeddings,
        initializer_range=vc.initializer_range,
        rms_norm_eps=vc.rms_norm_eps,
        head_dim=getattr(vc, "head_dim", None),
    )
    layer_config._attn_implementation = "simple_flex_attention"
    return Eagle3SpeculatorConfig(
        transformer_layer_config=layer_config,
        draft_vocab_size=DRAFT_VOCAB,
        norm_before_residual=True,
        speculators_config=SpeculatorsConfig(
            algorithm="eagle3",
            proposal_methods=[GreedyTokenProposalConfig(proposal_type="greedy", speculative_tokens=3)],
            default_proposal_method="greedy",
            verifier=VerifierConfig(name_or_path=str(verifier), architectures=["LlamaForCausalLM"]),
        ),
    )


def vocab_maps(verifier_vocab: int) -> tuple[Any, Any]:
    """t2d / d2t for a draft vocabulary of every other verifier token."""
    import torch

    t2d = torch.zeros(verifier_vocab, dtype=torch.bool)
    t2d[torch.arange(0, 2 * DRAFT_VOCAB, 2)] = True
    d2t = torch.nonzero(t2d).squeeze(1) - torch.arange(DRAFT_VOCAB)
    return t2d, d2t


def build_draft(config: Any) -> Any:
    from speculators.models.eagle3 import Eagle3DraftModel

    t2d, d2t = vocab_maps(config.transformer_layer_config.vocab_size)
    return Eagle3DraftModel(config=config, t2d=t2d, d2t=d2t)


def forward(model: Any, seed: int = 0, grad: bool = False) -> tuple[list[Any], Any, dict[str, Any]]:
    """One training-style forward (3 TTT steps, two packed sequences, loss)."""
    import contextlib

    import torch

    cfg = model.config.transformer_layer_config
    g = torch.Generator().manual_seed(seed)
    hidden = torch.randn(1, SEQ_LEN, 3 * cfg.hidden_size, generator=g)
    input_ids = torch.randint(0, cfg.vocab_size, (1, SEQ_LEN), generator=g)
    last = torch.randn(1, SEQ_LEN, cfg.hidden_size, generator=g)
    with contextlib.nullcontext() if grad else torch.no_grad():
        return model(
            hidden_states=hidden,
            input_ids=input_ids,
            lengths=torch.tensor([SEQ_LEN // 2, SEQ_LEN // 2]),
            loss_mask=torch.ones(1, SEQ_LEN, dtype=torch.bool),
            verifier_last_hidden_states=last,
            ttt_steps=3,
        )


def round_trip(config: Any, out: str | Path) -> tuple[Any, Any]:
    """save_pretrained, then from_pretrained through the subclass and the registry base."""
    from speculators import SpeculatorModelConfig
    from speculators.models.eagle3 import Eagle3SpeculatorConfig

    config.save_pretrained(str(out))
    return Eagle3SpeculatorConfig.from_pretrained(str(out)), SpeculatorModelConfig.from_pretrained(str(out))


def comparable(config: Any) -> dict[str, Any]:
    """to_dict() without what from_pretrained adds by itself (as on transformers 4.57)."""
    d = config.to_dict()
    d.pop("_commit_hash", None)
    return d


def main(argv: list[str]) -> int:
    verifier, out = argv[0], argv[1]
    import spec_compat  # noqa: F401  (SPEC_COMPAT_DISABLE decides what it applies)

    step = "import"
    try:
        import speculators  # noqa: F401
        from speculators.models.eagle3 import Eagle3DraftModel, Eagle3SpeculatorConfig  # noqa: F401
        from speculators.train.trainer import Trainer  # noqa: F401

        step = "build-config"
        config = build_config(verifier)
        step = "draft-model"
        model = build_draft(config)
        step = "forward"
        forward(model)
        step = "save"
        config.save_pretrained(out)
        step = "reload"
        a, b = round_trip(config, out)
        assert comparable(a) == comparable(config) == comparable(b), "reloaded config differs"
    except BaseException as exc:
        traceback.print_exc()
        print(f"T1-FAIL {step} {type(exc).__name__}: {exc}".splitlines()[0], flush=True)
        return 1
    print("T1-OK", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
