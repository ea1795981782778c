"""``cpu-attention-isa-probe``: the patch's own class on a fake ``cpu_attn`` module in a fresh
registry (the probe's answer and the CPU's AMX support are set by the test).  The real kernels
and the real engine are tests/engine/test_amx_attention_engine.py's."""

from __future__ import annotations

import pytest

from spec_compat.patches.extraction import cpu_attention_isa_probe as platform
from spec_compat.core.registry import Registry, Status

torch = pytest.importorskip("torch")


def _get_attn_isa(dtype, block_size, head_size=None):  # vLLM 0.16's rule, enough of it
    if head_size is not None and head_size % 32 != 0 and head_size % 16 == 0:
        return "vec16"
    if dtype == torch.bfloat16 and block_size % 32 == 0:
        return "amx"
    return "vec" if block_size % 32 == 0 else "vec16"


def _setup(fake_module, monkeypatch, *, amx_cpu: bool | None, kernels: set[int], fn=_get_attn_isa):
    mod = fake_module(_get_attn_isa=fn)
    cls = type("CpuAttentionIsaProbe", (platform.CpuAttentionIsaProbe,),
               {"target": f"{mod.__name__}:_get_attn_isa", "requires": {}})
    monkeypatch.setattr(platform, "amx_tiles", lambda: amx_cpu)
    asked: list[int] = []
    monkeypatch.setattr(platform, "amx_attention_works", lambda h: asked.append(h) or h in kernels)
    reg = Registry()
    reg.register(cls)
    reg.apply(environ={})
    (rec,) = reg.records()
    return reg, mod, rec, asked


def test_amx_without_kernels_falls_back_to_vec(fake_module, monkeypatch):
    reg, mod, rec, asked = _setup(fake_module, monkeypatch, amx_cpu=True, kernels=set())
    try:
        assert rec.status is Status.APPLIED
        assert mod._get_attn_isa(torch.bfloat16, 128, 64) == "vec"
        assert mod._get_attn_isa(torch.bfloat16, 128, None) == "vec"
        assert mod._get_attn_isa(torch.float32, 128, 64) == "vec"  # not amx: vLLM's own answer
        assert mod._get_attn_isa(torch.bfloat16, 16, 64) == "vec16"
        assert mod._get_attn_isa(torch.bfloat16, 128, 80) == "vec16"
        assert 64 in asked
    finally:
        reg.revert()
    assert mod._get_attn_isa is _get_attn_isa


def test_kernels_for_some_head_sizes_keep_amx_there(fake_module, monkeypatch):
    reg, mod, rec, _ = _setup(fake_module, monkeypatch, amx_cpu=True, kernels={32})
    try:
        assert rec.status is Status.APPLIED  # 128 (the check's probe) is missing
        assert mod._get_attn_isa(torch.bfloat16, 128, 32) == "amx"
        assert mod._get_attn_isa(torch.bfloat16, 128, 64) == "vec"
    finally:
        reg.revert()


@pytest.mark.parametrize("amx_cpu, kernels, reason", [
    (False, set(), "no AMX tiles"),
    (True, {128}, "runs the 'amx' attention kernels"),
])
def test_not_needed(fake_module, monkeypatch, amx_cpu, kernels, reason):
    reg, mod, rec, _ = _setup(fake_module, monkeypatch, amx_cpu=amx_cpu, kernels=kernels)
    assert rec.status is Status.NOT_NEEDED and reason in rec.reason
    assert mod._get_attn_isa is _get_attn_isa


def test_drifted_signature_is_target_changed(fake_module, monkeypatch):
    def drifted(dtype, block_size):
        return "vec"

    reg, mod, rec, _ = _setup(fake_module, monkeypatch, amx_cpu=True, kernels=set(), fn=drifted)
    assert rec.status is Status.TARGET_CHANGED and "head_size" in rec.reason
    assert mod._get_attn_isa is drifted


def test_torch_that_cannot_tell_is_target_changed(fake_module, monkeypatch):
    reg, mod, rec, _ = _setup(fake_module, monkeypatch, amx_cpu=None, kernels=set())
    assert rec.status is Status.TARGET_CHANGED and "_is_amx_tile_supported" in rec.reason
    assert mod._get_attn_isa is _get_attn_isa
