"""How far fp8 hidden states may lie from the reference: the e4m3 per-token bound.

hs-connectors' fp8 backend stores each token's rows ``x`` (all layers) as ``q = e4m3(x / s)`` with one
fp32 scale per token ``s = max|x| / 448``; its reader (``FP8Transfer``) hands the trainer
``d = bf16(bf16(q) * bf16(s))``.  For one element, with ``y = x / s`` (so ``|y| <= 448``):

* e4m3 keeps 3 mantissa bits.  For a normal ``|y| >= 2**-6`` round-to-nearest errs by at most half a
  unit in the last place, ``|q - y| <= 2**-4 * 2**floor(log2|y|) <= 2**-4 * |y|``; below that
  (subnormals, spacing ``2**-9``) by at most ``2**-10``.  So ``|q*s - x| <= E = max(2**-4 |x|, 2**-10 s)``.
* ``q`` is exact in bf16 (3 < 7 mantissa bits, same exponent range); rounding ``s`` and the product to
  bf16 (unit roundoff ``u = 2**-8`` each) adds at most ``|q*s| * (2u + u**2) <= (|x| + E) * (2u + u**2)``.
* ``x`` itself lies within ``slack`` of the reference ``r`` (the engine's own error, e.g. ``1e-5`` of
  the layer's max |r|), so ``|x| <= |r| + slack``.

Bound: ``|d - r| <= slack + E + (|r| + slack + E) * (2u + u**2)`` with ``E = max(2**-4 (|r| + slack),
2**-10 s)``.  ``dequant_roundoff=0`` gives the bound of an exact (fp32/fp64) dequantization.  A scale
off by 10% moves large values by ~10% (> the ~7.1% the bound allows): :func:`check_fp8_rows` fails it.
torch is imported inside the functions.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

#: e4m3 (float8_e4m3fn): largest finite value, smallest normal, half the subnormal spacing
E4M3_MAX = 448.0
E4M3_MIN_NORMAL = 2.0 ** -6
E4M3_HALF_ULP = 2.0 ** -4  # relative, normal range (3 mantissa bits)
E4M3_SUBNORMAL_HALF_STEP = 2.0 ** -10
#: bf16's unit roundoff (8 significant bits): FP8Transfer's default dequantize dtype
BF16_ROUNDOFF = 2.0 ** -8


@dataclass(frozen=True)
class Fp8Check:
    ok: bool
    #: max over elements of |d - r| / bound (<= 1 passes)
    worst_ratio: float
    #: max |d - r| / max |r|, for the report
    max_rel: float
    detail: str

    def __bool__(self) -> bool:
        return self.ok


def fp8_error_bound(reference: Any, scales: Any, slack: float, dequant_roundoff: float = BF16_ROUNDOFF) -> Any:
    """Per-element bound on ``|dequantized - reference|`` (float64, the shape of ``reference``);
    ``scales`` broadcast against it ([T, 1, 1])."""
    import torch

    r = reference.detach().to(torch.float64).abs()
    s = scales.detach().to(torch.float64)
    x = r + slack
    e = torch.maximum(E4M3_HALF_ULP * x, E4M3_SUBNORMAL_HALF_STEP * s)
    u = 2 * dequant_roundoff + dequant_roundoff ** 2
    return slack + e + (x + e) * u


def check_fp8_rows(dequantized: Any, reference: Any, scales: Any, slack: float,
                   dequant_roundoff: float = BF16_ROUNDOFF) -> Fp8Check:
    """Whether every element of ``dequantized`` lies within :func:`fp8_error_bound` of ``reference``.
    Fails (never raises) on a shape mismatch, an empty tensor, or a NaN/inf on either side or in
    ``scales``, and on a scale that is not max|reference| / 448 of its token to within the slack."""
    import torch

    if tuple(dequantized.shape) != tuple(reference.shape) or dequantized.numel() == 0:
        return Fp8Check(False, float("inf"), float("inf"),
                        f"shape {tuple(dequantized.shape)} vs reference {tuple(reference.shape)}")
    if tuple(scales.shape) != (reference.shape[0],) + (1,) * (reference.dim() - 1):
        return Fp8Check(False, float("inf"), float("inf"),
                        f"scales shape {tuple(scales.shape)}, want [{reference.shape[0]}{', 1' * (reference.dim() - 1)}]")
    d = dequantized.detach().to(torch.float64)
    r = reference.detach().to(torch.float64)
    s = scales.detach().to(torch.float64)
    for name, t in (("dequantized", d), ("reference", r), ("scales", s)):
        if not bool(torch.isfinite(t).all()):
            return Fp8Check(False, float("inf"), float("inf"), f"{name} holds NaN or inf")
    # the stored scale is the token's max |x| / 448, x within slack of the reference
    want = r.abs().amax(dim=tuple(range(1, r.dim())), keepdim=True) / E4M3_MAX
    off = (s - want).abs() > slack / E4M3_MAX + 1e-6 * want
    if bool(off.any()):
        t = int(off.reshape(-1).nonzero()[0])
        return Fp8Check(False, float("inf"), float("inf"),
                        f"token {t}: scale {float(s.reshape(-1)[t]):.6e}, max|reference|/448 is "
                        f"{float(want.reshape(-1)[t]):.6e}")
    bound = fp8_error_bound(r, s, slack, dequant_roundoff)
    diff = (d - r).abs()
    ratio = float((diff / bound).max())
    max_rel = float(diff.max() / r.abs().max().clamp_min(1e-300))
    if not ratio <= 1.0:
        idx = int((diff / bound).reshape(-1).argmax())
        return Fp8Check(False, ratio, max_rel, f"element {idx}: |diff| {float(diff.reshape(-1)[idx]):.3e} > bound "
                                               f"{float(bound.reshape(-1)[idx]):.3e} (reference {float(r.reshape(-1)[idx]):.3e})")
    return Fp8Check(True, ratio, max_rel, f"max |diff|/bound {ratio:.3f}, max |diff|/max|ref| {max_rel:.2e}")
