"""The Kimi-K2.5 fixture behaves like the released checkpoint where it matters."""

from __future__ import annotations

import json

import pytest

pytestmark = pytest.mark.engine


def test_tokenizer_is_remote_code(fixture_dir):
    from transformers import AutoTokenizer

    path = str(fixture_dir("kimi-k25"))
    with pytest.raises(ValueError, match="trust_remote_code"):
        AutoTokenizer.from_pretrained(path)
    tok = AutoTokenizer.from_pretrained(path, trust_remote_code=True)
    ids = tok.encode("héllo wörld")
    assert tok.decode(ids) == "héllo wörld"


def test_config_shape(fixture_dir):
    cfg = json.loads((fixture_dir("kimi-k25") / "config.json").read_text())
    assert cfg["architectures"] == ["KimiK25ForConditionalGeneration"] and cfg["model_type"] == "kimi_k25"
    text = cfg["text_config"]
    assert text["model_type"] == "deepseek_v3"
    assert text["first_k_dense_replace"] >= 1 and text["num_hidden_layers"] - text["first_k_dense_replace"] >= 2
    assert text["topk_method"] == "noaux_tc" and text["scoring_func"] == "sigmoid"
    assert text["rope_scaling"]["type"] in ("yarn",) or text["rope_scaling"].get("rope_type") == "yarn"
    assert (text["qk_nope_head_dim"] + text["qk_rope_head_dim"]) == 96
    assert "hidden_size" in cfg["vision_config"]
    index = json.loads((fixture_dir("kimi-k25") / "model.safetensors.index.json").read_text())
    names = set(index["weight_map"])
    assert "language_model.model.layers.1.mlp.gate.e_score_correction_bias" in names
    assert "language_model.lm_head.weight" in names
    assert any(n.startswith("vision_tower.") for n in names) and any(n.startswith("mm_projector.") for n in names)
    assert len(set(index["weight_map"].values())) >= 2
