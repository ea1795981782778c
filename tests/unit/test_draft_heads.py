"""Published EAGLE-3 heads (shims/draft_heads.py): the aux-id conventions and the fit check, on
the heads ``spec-compat fixture`` writes (real safetensors files; no vLLM)."""

from __future__ import annotations

import json

import pytest

from spec_compat.core import switches
from spec_compat.core.switches import SwitchError
from spec_compat.fixtures.published_heads import MLA_HEAD, build_head
from spec_compat.shims import draft_heads as dh

KIMI = dict(target_hidden=256, target_vocab=512, target_layers=4)


def _cfg(path):
    return json.loads((path / "config.json").read_text())


@pytest.mark.parametrize("raw, want", [(None, "auto"), ("", "auto"), (" Output ", "output"), ("input", "input")])
def test_convention_switch_values(raw, want):
    """Parsed in core.switches (the shim reads no environment), handed to ``served_ids``."""
    env = {} if raw is None else {dh.VAR: raw}
    assert switches.value(dh.VAR, env) == want


@pytest.mark.parametrize("raw", ["sglang", "1", "in put"])
def test_malformed_convention_switch_names_the_variable(raw):
    from spec_compat import REGISTRY

    assert dh.VAR in REGISTRY.get("eagle3-aux-ids-convention").reads  # the prefix comes from this declaration
    with pytest.raises(SwitchError, match=r"spec_compat\[eagle3-aux-ids-convention\]: SPEC_COMPAT_AUX_IDS="):
        switches.value(dh.VAR, {dh.VAR: raw})


def test_where_the_ids_are_decides_the_convention():
    nested = {"eagle_config": {dh.KEY: [0, 1, 2]}}
    top = {dh.KEY: [1, 2, 3]}
    assert dh.served_ids(nested) == ((1, 2, 3), "output", "eagle_config")
    assert dh.served_ids(top) == ((1, 2, 3), "input", "top-level")
    assert dh.served_ids({}) == (None, "default", "none")
    # the override reads whatever ids the head names
    assert dh.served_ids(nested, "input") == ((0, 1, 2), "input", "eagle_config")
    assert dh.served_ids(top, "output") == ((2, 3, 4), "output", "top-level")
    # top-level wins where a config has both (vLLM reads it)
    assert dh.served_ids({**nested, **top})[0] == (1, 2, 3)
    assert dh.aux_count(nested) == 3 and dh.aux_count({"eagle_config": {dh.KEY: [1, 2, 3, 4]}}) == 4
    assert dh.aux_count({}) == 3
    with pytest.raises(dh.DraftFitError, match=r"are not all integers"):
        dh.served_ids({dh.KEY: [1, "2", 3]})


def test_mla_fixture_names_output_convention_ids():
    assert MLA_HEAD["eagle_config"][dh.KEY] == [0, 1, 2]
    assert dh.served_ids(MLA_HEAD)[0] == (1, 2, 3)


@pytest.mark.parametrize("name", ["torchspec-eagle3", "torchspec-eagle3-mla"])
def test_fixture_heads_fit_the_kimi_fixture(tmp_path, name):
    head = build_head(name, tmp_path / name)
    shapes = dh.tensor_shapes(head)
    assert shapes["fc.weight"] == (256, 768) and shapes["lm_head.weight"] == (512, 256)
    assert "midlayer.input_layernorm.weight" in shapes and not any(k.startswith("layers.") for k in shapes)
    ids, conv, _ = dh.served_ids(_cfg(head))
    assert dh.fit_problems(_cfg(head), shapes, ids=ids, convention=conv, **KIMI) == []


#: what each exporter writes (SpecForge's export_to_sglang; ModelOpt's Hugging Face exporter, llama and
#: kimik2 decoders): weight prefix, the optional tensors kept, draft_vocab_size in config.json
EXPORTED = {
    "specforge-eagle3": ("midlayer.", {"d2t", "t2d"}, 128),
    "modelopt-eagle3": ("layers.0.", set(), 512),
    "modelopt-eagle3-mla": ("layers.0.", set(), None),
}


@pytest.mark.parametrize("name", sorted(EXPORTED))
def test_exported_heads_have_their_exporters_layout_and_fit(tmp_path, name):
    prefix, optional, draft_vocab = EXPORTED[name]
    head = build_head(name, tmp_path / name)
    cfg, shapes = _cfg(head), dh.tensor_shapes(head)
    layer = {k for k in shapes if "." in k and k.split(".")[0] in ("midlayer", "layers")}
    assert layer and all(k.startswith(prefix) for k in layer), sorted(layer)
    assert "embed_tokens.weight" not in shapes  # both exporters leave the target's embedding to the server
    assert {"d2t", "t2d"} & set(shapes) == optional
    assert cfg.get("draft_vocab_size") == draft_vocab
    assert shapes["lm_head.weight"] == (draft_vocab or 512, 256) and shapes["fc.weight"] == (256, 768)
    wide = "self_attn.q_a_proj.weight" if name.endswith("-mla") else "self_attn.q_proj.weight"
    assert shapes[prefix + wide][1] == 2 * 256  # the first layer reads [embeds, fused aux states]
    ids, conv, where = dh.served_ids(cfg)
    assert (ids, conv, where) == ((1, 2, 3), "output", "eagle_config")
    assert dh.fit_problems(cfg, shapes, ids=ids, convention=conv, **KIMI) == []


def test_same_seed_same_bytes(tmp_path):
    a = build_head("torchspec-eagle3-mla", tmp_path / "a", seed=3)
    b = build_head("torchspec-eagle3-mla", tmp_path / "b", seed=3)
    c = build_head("torchspec-eagle3-mla", tmp_path / "c", seed=4)
    read = lambda p: (p / "model.safetensors").read_bytes()  # noqa: E731
    assert read(a) == read(b) != read(c)


def test_a_wider_head_names_both_widths(tmp_path):
    head = build_head("torchspec-eagle3", tmp_path / "wide", hidden=512)
    problems = dh.fit_problems(_cfg(head), dh.tensor_shapes(head), ids=None, convention="default", **KIMI)
    assert problems == ["the draft's fc.weight reads 1536 features, the target gives 3 aux layers x hidden size "
                        "256 = 768"]


def test_pruned_vocabulary_checked_against_both_sides(tmp_path):
    head = build_head("torchspec-eagle3", tmp_path / "pruned", draft_vocab=96)
    cfg, shapes = _cfg(head), dh.tensor_shapes(head)
    assert shapes["d2t"] == (96,) and shapes["t2d"] == (512,) and shapes["lm_head.weight"] == (96, 256)
    assert dh.fit_problems(cfg, shapes, ids=None, convention="default", **KIMI) == []
    # the same head against a target with another vocabulary
    other = dict(KIMI, target_vocab=1024)
    got = dh.fit_problems(cfg, shapes, ids=None, convention="default", **other)
    assert "the draft's vocab_size is 512, the target's vocabulary is 1024" in got
    assert "the draft's t2d has shape [512], the target's vocabulary is 1024" in got
    # a config that disagrees with its own d2t
    got = dh.fit_problems(dict(cfg, draft_vocab_size=128), shapes, ids=None, convention="default", **KIMI)
    assert "the draft's d2t has shape [96], its draft_vocab_size is 128" in got
    assert "the draft's lm_head has 96 rows, its draft vocabulary is 128" in got
    # a pruned vocabulary without its mapping
    no_map = {k: v for k, v in shapes.items() if k not in ("d2t", "t2d")}
    assert any("holds no d2t mapping" in p for p in dh.fit_problems(cfg, no_map, ids=None, convention="default", **KIMI))


@pytest.mark.parametrize("name", ["torchspec-eagle3", "specforge-eagle3"])
def test_d2t_values_read_from_the_file_and_checked_against_the_target(tmp_path, name):
    """The d2t values come from the file alone (its header's offsets); every draft token must land in
    the target's vocabulary (vLLM indexes the target's logits with them)."""
    import torch
    from safetensors.torch import load_file, save_file

    head = build_head(name, tmp_path / "head", draft_vocab=96)
    written = load_file(str(head / "model.safetensors"))["d2t"]
    d2t = dh.integer_tensor(head, "d2t")
    assert d2t == written.tolist() and len(d2t) == 96
    assert dh.d2t_problems(d2t, 512) == []
    # the same head against a smaller target vocabulary: the top draft tokens land outside it
    smaller = dh.d2t_problems(d2t, 100)
    assert len(smaller) == 1 and smaller[0].startswith("the draft's d2t maps ") and "vocabulary of 100" in smaller[0]
    # a corrupted entry, written as int32 this time
    tensors = load_file(str(head / "model.safetensors"))
    tensors["d2t"] = tensors["d2t"].to(torch.int32)
    tensors["d2t"][3] = -10
    save_file(tensors, str(head / "model.safetensors"))
    assert dh.d2t_problems(dh.integer_tensor(head, "d2t"), 512) == [
        "the draft's d2t maps 1 of its 96 tokens outside the target's vocabulary of 512 (first: draft token 3 -> "
        "target token -7)"]
    assert dh.integer_tensor(head, "t2d") is None  # t2d is a bool mask: not an integer tensor
    assert dh.integer_tensor(head, "no-such-tensor") is None


def test_aux_ids_outside_the_target(tmp_path):
    head = build_head("torchspec-eagle3-mla", tmp_path / "mla")
    cfg = _cfg(head)
    cfg["eagle_config"][dh.KEY] = [1, 2, 3]  # outputs of layers 1..3 = inputs of 2..4; the fixture has 0..3
    ids, conv, _ = dh.served_ids(cfg)
    got = dh.fit_problems(cfg, dh.tensor_shapes(head), ids=ids, convention=conv, **KIMI)
    assert got == ["the draft's aux layer ids [2, 3, 4] (as served: output convention) include [4], outside 0..3: "
                   "a served head reads the inputs of the target's 4 decoder layers"]
    got = dh.fit_problems(cfg, dh.tensor_shapes(head), ids=(1, 1, 2), convention="input", **KIMI)
    assert got == ["the draft's aux layer ids [1, 1, 2] repeat a layer"]
    # four ids against a fc trained on three
    got = dh.fit_problems(cfg, dh.tensor_shapes(head), ids=(0, 1, 2, 3), convention="input", **KIMI)
    assert got == ["the draft's fc.weight reads 768 features, the target gives 4 aux layers x hidden size 256 = 1024"]


def test_target_hidden_size_is_checked_when_declared(tmp_path):
    head = build_head("torchspec-eagle3", tmp_path / "h")
    got = dh.fit_problems(dict(_cfg(head), target_hidden_size=7168), dh.tensor_shapes(head), ids=None,
                          convention="default", **KIMI)
    assert got == ["the draft's target_hidden_size is 7168, the target's hidden size is 256"]


def test_not_a_safetensors_file(tmp_path):
    (tmp_path / "model.safetensors").write_bytes(b"\xff" * 8 + b"{")
    with pytest.raises(dh.DraftFitError, match=r"declares a \d+-byte header: not a safetensors file"):
        dh.tensor_shapes(tmp_path)
    (tmp_path / "model.safetensors").write_bytes(b"\x05\x00\x00\x00\x00\x00\x00\x00{oops")
    with pytest.raises(dh.DraftFitError, match=r"unreadable safetensors header"):
        dh.tensor_shapes(tmp_path)


def test_a_head_without_ids_on_a_shallow_target(tmp_path):
    """vLLM's own default (2, N//2, N-3) repeats a layer under 7 layers: fewer features than fc reads."""
    head = build_head("torchspec-eagle3", tmp_path / "h")
    cfg, shapes = _cfg(head), dh.tensor_shapes(head)
    assert dh.vllm_default_ids(4) == (2, 2, 1) and dh.vllm_default_ids(61) == (2, 30, 58)
    got = dh.fit_problems(cfg, shapes, ids=dh.vllm_default_ids(4), convention="default", **KIMI)
    assert got == ["the draft names no aux layer ids and vLLM's default for a 4-layer target, (2, 2, 1), repeats a "
                   "layer (fewer features than the draft's fc reads): name 3 distinct ids in the draft's config "
                   "(eagle_aux_hidden_state_layer_ids, vLLM's convention)"]
    deep = dict(KIMI, target_layers=8)
    assert dh.fit_problems(cfg, shapes, ids=dh.vllm_default_ids(8), convention="default", **deep) == []
