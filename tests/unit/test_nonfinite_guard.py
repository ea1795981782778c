"""``generator-input-checks`` counts NaN/+inf/-inf in every result's captured layers (stock
speculators 0.3/0.4 save them without a word; upstream checks them since #615): an error naming
the patch, sequence, layer and count by default, a warning with the counts under
``SPEC_COMPAT_NONFINITE=warn``, a clear error naming the switch for anything else.  The patch's
own class runs on a fake generator module in a fresh registry."""

from __future__ import annotations

import logging
import math

import pytest

from spec_compat.patches.extraction.generator_input_checks import GeneratorInputChecks
from spec_compat.core.registry import Registry, Status
from spec_compat.core.switches import NONFINITE_VAR, parse_nonfinite
from spec_compat.patches.extraction.generator_input_checks import NonFiniteStatesError, check_finite
from spec_compat.core.switches import SwitchError

torch = pytest.importorskip("torch")

PID = "generator-input-checks"
LAYER_IDS = [2, 5, 7]


class _ModelConfig:
    max_model_len = 64

    def get_vocab_size(self) -> int:
        return 100


class _VllmConfig:
    model_config = _ModelConfig()


class VllmHiddenStatesGenerator:  # the patch reads this class's source (ids[:max_len])
    """Returns exact rows per input; ``poison`` = {(sequence, layer position): [(row, col, value)]}."""

    vllm_config = _VllmConfig()
    layer_ids = LAYER_IDS
    poison: dict = {}

    def __init__(self) -> None:
        self.calls = 0

    def generate(self, token_ids):
        self.calls += 1
        max_len = self.vllm_config.model_config.max_model_len - 1
        out = []
        for j, ids in enumerate(token_ids):
            ids = ids[:max_len]
            layers = [torch.ones(len(ids), 4) for _ in self.layer_ids]
            for (s, k), cells in self.poison.items():
                for r, c, v in cells if s == j else ():
                    layers[k][r, c] = v
            out.append({"input_ids": torch.tensor(ids), "hidden_states": layers})
        return out


@pytest.fixture
def patched(fake_module):
    """A fresh registry holding the patch's own class, applied to a fake generator module."""
    mod = fake_module(VllmHiddenStatesGenerator=VllmHiddenStatesGenerator)
    cls = type("GeneratorInputChecks", (GeneratorInputChecks,),
               {"target": f"{mod.__name__}:VllmHiddenStatesGenerator", "requires": {}})
    reg = Registry()
    reg.register(cls)
    reg.apply(environ={})
    (rec,) = reg.records()
    assert rec.status is Status.APPLIED, rec.reason
    try:
        yield mod.VllmHiddenStatesGenerator
    finally:
        reg.revert()


def test_finite_states_pass(patched, monkeypatch):
    monkeypatch.delenv(NONFINITE_VAR, raising=False)
    gen = patched()
    res = gen.generate([[1, 2, 3], [4, 5]])
    assert [len(r["hidden_states"]) for r in res] == [3, 3]


def test_nonfinite_states_raise_naming_patch_sequence_layer_and_count(patched, monkeypatch):
    monkeypatch.delenv(NONFINITE_VAR, raising=False)
    gen = patched()
    gen.poison = {(1, 1): [(0, 0, math.nan), (2, 3, math.inf)], (2, 0): [(1, 1, -math.inf)]}
    with pytest.raises(NonFiniteStatesError) as exc:
        gen.generate([[1, 2, 3], [4, 5, 6], [7, 8]])
    assert str(exc.value).startswith(
        "spec_compat[generator-input-checks]: sequence 1 layer 5: 2 of 12 captured values are non-finite (NaN/inf); "
        "2 layer result(s) in 2 of 3 sequence(s), 3 values in all")
    assert f"{NONFINITE_VAR}=warn" in str(exc.value)


def test_warn_logs_the_counts_and_returns_the_states(patched, monkeypatch, caplog):
    monkeypatch.setenv(NONFINITE_VAR, "WARN")
    gen = patched()
    gen.poison = {(0, 2): [(0, 0, math.nan), (1, 0, math.nan)]}
    with caplog.at_level(logging.WARNING, logger="spec_compat"):
        res = gen.generate([[1, 2], [3]])
    assert math.isnan(float(res[0]["hidden_states"][2][0, 0]))
    (msg,) = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert msg.startswith("spec_compat[generator-input-checks]: sequence 0 layer 7: 2 of 8 captured values are "
                          "non-finite (NaN/inf)")
    assert "per sequence/layer: 0/7: 2" in msg


@pytest.mark.parametrize("raw", ["yes", "1", "raise,warn", "ignore"])
def test_malformed_switch_fails_before_the_engine_naming_it(patched, monkeypatch, raw):
    monkeypatch.setenv(NONFINITE_VAR, raw)
    gen = patched()
    with pytest.raises(SwitchError, match=f"spec_compat\\[{PID}\\]: {NONFINITE_VAR}={raw!r}: expected 'raise'"):
        gen.generate([[1, 2]])
    assert gen.calls == 0  # the engine never ran


@pytest.mark.parametrize("raw, mode", [(None, "raise"), ("", "raise"), (" Raise ", "raise"), ("warn", "warn")])
def test_switch_values(raw, mode):
    assert parse_nonfinite(raw) == mode


def test_layers_named_by_position_when_the_ids_do_not_match():
    res = [{"hidden_states": [torch.zeros(2, 2), torch.tensor([[0.0, math.nan]])]}]
    with pytest.raises(NonFiniteStatesError, match="sequence 0 layer 1: 1 of 2 captured"):
        check_finite(res, PID, "raise", layer_ids=[4])
    assert check_finite([{"hidden_states": [torch.zeros(3, dtype=torch.long)]}], PID, "raise") == 0


@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16", "float64", "complex64"])
@pytest.mark.parametrize("bad, count", [([math.nan], 1), ([math.inf], 1), ([-math.inf], 1),
                                        ([math.inf, -math.inf], 2), ([math.nan, math.inf, 7.0], 2)])
def test_every_kind_of_non_finite_value_is_counted(dtype, bad, count):
    """The check sums each layer once and counts exactly only when the sum is not finite: +inf
    and -inf in one layer (their sum is NaN), NaN next to inf, in every float dtype."""
    h = torch.ones(64, 8, dtype=getattr(torch, dtype))
    for i, v in enumerate(bad):
        h[i, 3] = v
    with pytest.raises(NonFiniteStatesError, match=f"sequence 1 layer 0: {count} of 512 captured"):
        check_finite([{"hidden_states": [torch.ones(4, 8)]}, {"hidden_states": [h]}], PID, "raise")
    assert check_finite([{"hidden_states": [h]}], PID, "warn") == count


@pytest.mark.parametrize("dtype, big", [("float32", 3e38), ("float16", 60000.0), ("bfloat16", 3e38)])
def test_finite_values_whose_sum_overflows_are_not_reported(dtype, big):
    """64 large finite values overflow a sum in their own dtype (fp16 / bf16 / fp32): no false alarm."""
    h = torch.full((16, 4), big, dtype=getattr(torch, dtype))
    assert bool(torch.isinf(h.sum())), "the case must overflow"
    assert check_finite([{"hidden_states": [h]}], PID, "raise") == 0
