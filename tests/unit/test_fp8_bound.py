"""The e4m3 per-token bound of spec_compat.verify.fp8 on synthetic rows, quantized the way
hs-connectors 0.9.0 documents it (scale = max|x| / 448 per token, e4m3 round to nearest, bf16
dequantization): it holds, it is not loose, and it fails a wrong scale, a NaN, a shape change."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
if not hasattr(torch, "float8_e4m3fn"):
    pytest.skip("this torch has no float8_e4m3fn", allow_module_level=True)

from spec_compat.verify.fp8 import E4M3_MAX, check_fp8_rows  # noqa: E402


def _rows(seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(64, 4, 96, generator=g, dtype=torch.float64)
    # spread of magnitudes per token (outliers, tiny values in the subnormal range of x / s)
    x *= torch.logspace(-3, 2, 64, dtype=torch.float64)[:, None, None]
    x[::7, :, :5] *= 1e-4
    x[3, 2, 7] = 0.0
    return x


def _quantize(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    x32 = x.to(torch.float32)
    scale = (x32.abs().amax(dim=(1, 2), keepdim=True) / E4M3_MAX).clamp(min=1e-12)
    return (x32 / scale).to(torch.float8_e4m3fn), scale


def _dequantize(q: torch.Tensor, scale: torch.Tensor, dtype=torch.bfloat16) -> torch.Tensor:
    return q.to(dtype) * scale.to(dtype)


def test_bound_holds_and_is_tight():
    x = _rows()
    q, s = _quantize(x)
    check = check_fp8_rows(_dequantize(q, s), x, s, slack=0.0)
    assert check, check.detail
    # the worst element uses a good part of the bound (it is not a loose cap)
    assert 0.4 < check.worst_ratio <= 1.0, check.worst_ratio
    exact = check_fp8_rows(_dequantize(q, s, torch.float64), x, s, slack=0.0, dequant_roundoff=0.0)
    assert exact and 0.5 < exact.worst_ratio <= 1.0, exact.detail


def test_engine_slack_is_added():
    x = _rows(1)
    q, s = _quantize(x)
    engine = x + 1e-6 * x.abs().amax()  # the engine's own error against the reference
    d = _dequantize(*_quantize(engine))
    assert not check_fp8_rows(d, x, _quantize(engine)[1], slack=0.0)
    assert check_fp8_rows(d, x, _quantize(engine)[1], slack=2e-6 * float(x.abs().amax()))


@pytest.mark.parametrize("factor", [1.1, 0.9, 1.02])
def test_a_planted_wrong_scale_fails(factor):
    x = _rows(2)
    q, s = _quantize(x)
    check = check_fp8_rows(_dequantize(q, s * factor), x, s * factor, slack=0.0)
    assert not check, check.detail
    assert "scale" in check.detail
    # the values alone (scale checked against the right one): 10% off exceeds the bound too
    if factor != 1.02:
        values = check_fp8_rows(_dequantize(q, s * factor), x, s, slack=0.0)
        assert not values and "bound" in values.detail, values.detail


def test_nan_inf_and_shape_fail():
    x = _rows(3)
    q, s = _quantize(x)
    d = _dequantize(q, s)
    bad = d.clone()
    bad[5, 1, 2] = float("nan")
    assert not check_fp8_rows(bad, x, s, slack=0.0)
    bad[5, 1, 2] = float("inf")
    assert not check_fp8_rows(bad, x, s, slack=0.0)
    assert "shape" in check_fp8_rows(d[:, :3], x, s, slack=0.0).detail
    assert "scales shape" in check_fp8_rows(d, x, s.reshape(-1), slack=0.0).detail
    nan_scale = s.clone()
    nan_scale[0] = float("nan")
    assert not check_fp8_rows(d, x, nan_scale, slack=0.0)
    assert not check_fp8_rows(d[:0], x[:0], s[:0], slack=0.0)
