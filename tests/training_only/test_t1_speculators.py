"""T1: stock speculators 0.3.x imports, builds and runs its Eagle3 draft and
round-trips the draft config under transformers >= 5.4, with spec_compat imported first
(conftest) — in this process, as a user's training script would."""

from __future__ import annotations

import json
import math

import pytest

import spec_compat
from spec_compat.core.versions import in_range, installed_version
from spec_compat.verify.compare import compare_identical
from spec_compat.core.registry import Status

pytestmark = pytest.mark.t1

T1_IDS = ("pretrained-config-annotations", "speculator-config-own-init", "speculator-config-validate")
TF_524 = in_range(installed_version("transformers"), ">=5.24")


def test_import_speculators_applies_the_t1_patches():
    import speculators
    from speculators.models.eagle3 import Eagle3DraftModel, Eagle3SpeculatorConfig  # noqa: F401
    from speculators.train.trainer import Trainer  # noqa: F401

    records = {r.id: r for r in spec_compat.records()}
    for pid in T1_IDS + (("attn-mask-utils-module",) if TF_524 else ()):
        assert records[pid].status is Status.APPLIED, records[pid]
    assert speculators.SpeculatorModelConfig.__pydantic_complete__
    # every model config speculators registered is a complete pydantic model with its own fields
    registry = speculators.SpeculatorModelConfig.registry
    assert {"eagle3", "eagle"} <= set(registry)
    for cls in registry.values():
        assert cls.__pydantic_complete__, cls
        assert "__init__" not in vars(cls) or cls.__init__.__module__.startswith("speculators"), cls


def test_removed_attn_mask_module_is_served_only_when_missing():
    import transformers.modeling_attn_mask_utils as m

    from spec_compat.patches.training.attn_mask_utils_module import prepare_4d_causal_attention_mask

    if TF_524:
        assert m.__spec__.origin == "spec-compat stand-in"
        assert m._prepare_4d_causal_attention_mask is prepare_4d_causal_attention_mask
    else:
        assert m.__spec__.origin.endswith("modeling_attn_mask_utils.py")  # transformers' own


def test_stock_train_py_config_draft_and_forward(llama_dir):
    import t1_steps
    from speculators.models.eagle3 import Eagle3DraftModel, Eagle3SpeculatorConfig
    from transformers import LlamaConfig

    config = t1_steps.build_config(llama_dir)
    assert type(config) is Eagle3SpeculatorConfig
    assert isinstance(config.transformer_layer_config, LlamaConfig)
    assert config.speculators_config.verifier.name_or_path == str(llama_dir)
    assert config.speculators_config.proposal_methods[0].speculative_tokens == 3
    assert config.draft_vocab_size == t1_steps.DRAFT_VOCAB

    model = t1_steps.build_draft(config)
    assert isinstance(model, Eagle3DraftModel)
    draft_tokens, loss, metrics = t1_steps.forward(model)
    assert len(draft_tokens) == 3
    assert all(t.shape == (1, t1_steps.SEQ_LEN) for t in draft_tokens)
    assert all(int(t.max()) < t1_steps.DRAFT_VOCAB for t in draft_tokens)
    assert math.isfinite(float(loss)) and float(loss) > 0
    assert {"loss", "full_acc_0", "cond_acc_2"} <= set(metrics)
    assert compare_identical(t1_steps.forward(model)[0][0], draft_tokens[0])  # deterministic


def test_draft_trains_a_few_steps(llama_dir):
    """Backward and optimizer steps through the draft built under transformers 5
    (on CPU through the registry's T3 attention path, on CUDA speculators' own)."""
    import t1_steps
    import torch

    model = t1_steps.build_draft(t1_steps.build_config(llama_dir)).train()
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-3)
    losses = []
    for _ in range(5):
        loss = t1_steps.forward(model, grad=True)[1]
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    assert all(math.isfinite(x) for x in losses)
    assert losses[-1] < 0.8 * losses[0], losses


def test_config_save_and_reload(llama_dir, tmp_path):
    import t1_steps
    from speculators.models.eagle3 import Eagle3SpeculatorConfig
    from transformers import LlamaConfig

    config = t1_steps.build_config(llama_dir, num_layers=2)
    assert config.validate() is None  # transformers' config validators, as save_pretrained runs them
    by_class, by_registry = t1_steps.round_trip(config, tmp_path)

    saved = json.loads((tmp_path / "config.json").read_text())
    assert saved["speculators_model_type"] == "eagle3"
    assert saved["transformer_layer_config"]["num_hidden_layers"] == 2
    assert saved["speculators_config"]["verifier"]["name_or_path"] == str(llama_dir)
    for loaded in (by_class, by_registry):
        assert type(loaded) is Eagle3SpeculatorConfig
        assert isinstance(loaded.transformer_layer_config, LlamaConfig)
        assert t1_steps.comparable(loaded) == t1_steps.comparable(config)
    # and the reloaded config builds the same draft
    assert t1_steps.build_draft(by_registry).layers[1].mlp.up_proj.weight.shape == (512, 256)


def test_pydantic_validate_stays_on_the_class():
    import pydantic
    from speculators.models.eagle3 import Eagle3SpeculatorConfig

    bound = Eagle3SpeculatorConfig.validate
    assert bound.__self__ is Eagle3SpeculatorConfig
    assert bound.__func__ is pydantic.BaseModel.__dict__["validate"].__func__
