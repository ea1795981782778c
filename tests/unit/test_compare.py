"""spec_compat.verify.compare: the one value comparison fails on NaN/+inf/-inf on either side, on shape,
dtype and empty tensors, and passes only values within the tolerance; selftest's layer compare
(which the extraction tests and ``spec-compat selftest`` use) names the sequence, layer and side.

Property tests are derandomized and bounded (the same examples in every run);
SPEC_COMPAT_HYPOTHESIS_EXAMPLES raises the count for a longer local search."""

from __future__ import annotations

import math
import os

import pytest

torch = pytest.importorskip("torch")
hypothesis = pytest.importorskip("hypothesis")
from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from spec_compat.verify.compare import compare_identical, compare_states  # noqa: E402
from spec_compat.cli.selftest import TOLERANCE, compare  # noqa: E402

EXAMPLES = int(os.environ.get("SPEC_COMPAT_HYPOTHESIS_EXAMPLES", "0"))
BAD = {"NaN": math.nan, "+inf": math.inf, "-inf": -math.inf}


def _settings(n: int):
    return settings(max_examples=EXAMPLES or n, deadline=None, derandomize=not EXAMPLES, database=None,
                    suppress_health_check=[HealthCheck.too_slow])


def test_regression_nan_in_a_layer_of_123_against_zeros_fails():
    """The bug: max(0.0, nan) == 0.0 made this pass with max|diff|=0.00e+00."""
    got = torch.full((5, 8), 123.0)
    got[3, 2] = math.nan
    want = torch.zeros(5, 8)
    c = compare_states(got, want, tolerance=TOLERANCE)
    assert not c and c.problem == "non-finite"
    assert c.detail == "non-finite values: got has 1 non-finite (1 NaN), first at [3, 2]"
    ok, worst, detail = compare([_result([1, 2, 3, 4, 5], [got])], [[1, 2, 3, 4, 5]], [0], lambda ids: [want])
    assert not ok and worst == math.inf
    assert detail == "sequence 0 layer 0: non-finite values: engine has 1 non-finite (1 NaN), first at [3, 2]"


def test_within_tolerance_passes_and_reports_the_difference():
    want = torch.randn(6, 4, generator=torch.Generator().manual_seed(0))
    got = want.clone()
    got[1, 1] += 5e-6
    c = compare_states(got, want, tolerance=1e-5)
    assert c and c.problem is None and 4e-6 < c.max_abs_diff < 6e-6
    assert not compare_states(got, want, tolerance=1e-6)
    assert compare_states(got, want, tolerance=1e-6).problem == "tolerance"
    assert compare_states(got, want, tolerance=None).max_abs_diff == c.max_abs_diff  # report only


def test_large_finite_values_do_not_overflow_into_a_pass():
    got = torch.tensor([3e38], dtype=torch.float32)
    want = torch.tensor([-3e38], dtype=torch.float32)
    c = compare_states(got, want, tolerance=1.0)
    assert not c and c.problem == "tolerance" and c.max_abs_diff == pytest.approx(6e38, rel=1e-6)


@pytest.mark.parametrize("got, want, match", [
    (torch.zeros(3, 4), torch.zeros(3, 5), "shape got [3, 4] != want [3, 5]"),
    (torch.zeros(4, 3), torch.zeros(3, 4), "shape got [4, 3] != want [3, 4]"),
    (torch.zeros(12), torch.zeros(3, 4), "shape got [12] != want [3, 4]"),
])
def test_shape_mismatch_fails(got, want, match):
    c = compare_states(got, want, tolerance=1.0)
    assert not c and c.problem == "shape" and c.detail == match and c.max_abs_diff is None


def test_dtype_mismatch_fails_unless_upcast_is_asked_for():
    want = torch.ones(2, 3)
    got = want.to(torch.bfloat16)
    c = compare_states(got, want, tolerance=1.0)
    assert not c and c.problem == "dtype"
    assert "dtype got torch.bfloat16 != want torch.float32" in c.detail
    assert compare_states(got, want, tolerance=0.0, upcast=True)  # explicit: compared as float64
    bad = got.clone()
    bad[0, 0] = math.nan
    assert compare_states(bad, want, tolerance=1.0, upcast=True).problem == "non-finite"  # upcast keeps the checks


@pytest.mark.parametrize("got, want, side", [
    (torch.zeros(0, 4), torch.zeros(0, 4), "got and want"),
    (torch.zeros(0), torch.zeros(3), "got"),
    (torch.zeros(2, 3), torch.zeros(2, 0), "want"),
])
def test_empty_tensor_fails(got, want, side):
    for c in (compare_states(got, want, tolerance=1.0), compare_identical(got, want)):
        assert not c and c.problem == "empty" and c.detail.startswith(f"empty tensor: {side} ")


def test_tolerance_must_be_a_finite_bound():
    for bad in (math.nan, math.inf, -1.0):
        with pytest.raises(ValueError, match="tolerance must be a finite number"):
            compare_states(torch.zeros(1), torch.zeros(1), tolerance=bad)


def test_a_failed_comparison_is_falsy():
    assert not bool(compare_states(torch.zeros(1), torch.ones(1), tolerance=0.5))
    with pytest.raises(TypeError, match="want is a list"):
        compare_states(torch.zeros(1), [0.0], tolerance=0.5)


def test_identical_refuses_nan_and_inf_even_when_the_bytes_match():
    a = torch.tensor([1.0, math.nan, 2.0])
    c = compare_identical(a, a.clone())  # torch.equal(uint8 views) is True here
    assert not c and c.problem == "non-finite" and "got has 1 non-finite (1 NaN), first at [1]" in c.detail
    m = torch.tensor([0.0, -math.inf])
    assert not compare_identical(m, m.clone())
    assert compare_identical(m, m.clone(), allow_inf=True)  # attention masks
    assert not compare_identical(a, a.clone(), allow_inf=True)  # NaN never


def test_identical_compares_bytes_dtype_and_shape():
    a = torch.arange(6, dtype=torch.float32).reshape(2, 3)
    assert compare_identical(a, a.clone()) and compare_identical(a.bool(), a.bool())
    b = a.clone()
    b[1, 2] = 5.5
    c = compare_identical(a, b)
    assert not c and c.problem == "bytes" and "first difference at value 5 of 6" in c.detail
    assert not compare_identical(torch.tensor([0.0]), torch.tensor([-0.0]))  # bytes, not ==
    assert compare_identical(a, a.double()).problem == "dtype"
    assert compare_identical(a, a.reshape(3, 2)).problem == "shape"


def _result(ids, layers):
    return {"input_ids": torch.tensor(ids), "hidden_states": layers}


@st.composite
def injections(draw):
    """Layers of equal values (they would pass), then NaN / +inf / -inf written at a drawn position
    of a drawn layer into the engine's states, the reference's, or both."""
    n_layers = draw(st.integers(1, 5))
    rows, hidden = draw(st.integers(1, 9)), draw(st.integers(1, 7))
    seed = draw(st.integers(0, 2 ** 16))
    layer = draw(st.integers(0, n_layers - 1))
    pos = (draw(st.integers(0, rows - 1)), draw(st.integers(0, hidden - 1)))
    kind = draw(st.sampled_from(sorted(BAD)))
    side = draw(st.sampled_from(["engine", "reference", "both"]))
    dtype = draw(st.sampled_from([torch.float32, torch.float64, torch.bfloat16]))
    scale = draw(st.sampled_from([0.0, 1.0, 123.0, 1e30]))
    return n_layers, rows, hidden, seed, layer, pos, kind, side, dtype, scale


@_settings(150)
@given(injections())
def test_injected_nonfinite_values_fail_and_are_named(case):
    n_layers, rows, hidden, seed, layer, pos, kind, side, dtype, scale = case
    g = torch.Generator().manual_seed(seed)
    want = [(torch.randn(rows, hidden, generator=g) * scale).to(dtype) for _ in range(n_layers)]
    got = [w.clone() for w in want]
    for name, states in (("engine", got), ("reference", want)):
        if side in (name, "both"):
            states[layer][pos] = BAD[kind]
    layer_ids = [10 + i for i in range(n_layers)]
    ids = list(range(1, rows + 1))
    ok, worst, detail = compare([_result(ids, got)], [ids], layer_ids, lambda _ids: want)
    assert not ok and worst == math.inf
    assert detail.startswith(f"sequence 0 layer {layer_ids[layer]}: non-finite values: ")
    sides = ["engine", "reference"] if side == "both" else [side]
    for s in sides:
        assert f"{s} has 1 non-finite (1 {kind}), first at {list(pos)}" in detail
    assert (len(sides) == 2) == ("; " in detail)
    c = compare_states(got[layer], want[layer], tolerance=1e9)
    assert not c and c.problem == "non-finite" and [x.side for x in c.nonfinite] == [
        {"engine": "got", "reference": "want"}[s] for s in sides]
    assert not compare_identical(got[layer], want[layer])
    # every other layer still passes
    assert all(compare_states(got[i], want[i], tolerance=0.0) for i in range(n_layers) if i != layer)


@_settings(60)
@given(st.integers(1, 400), st.sampled_from(sorted(BAD)), st.integers(0, 2 ** 16))
def test_nonfinite_counts_and_first_index(n_bad, kind, seed):
    g = torch.Generator().manual_seed(seed)
    t = torch.randn(20, 20, generator=g)
    flat = torch.randperm(400, generator=g)[:n_bad]
    t.view(-1)[flat] = BAD[kind]
    c = compare_states(torch.zeros(20, 20), t, tolerance=1e9)
    (nf,) = c.nonfinite
    assert nf.side == "want" and nf.count == n_bad
    assert (nf.nan, nf.posinf, nf.neginf) == tuple(n_bad if k == kind else 0 for k in ("NaN", "+inf", "-inf"))
    first = int(flat.min())
    assert nf.first == (first // 20, first % 20)
