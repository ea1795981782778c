"""The one value comparison used wherever tensor values are compared or reported.

``compare_states(got, want, tolerance=...)`` fails - never passes - on

* an empty tensor on either side (nothing compared is no evidence),
* a shape mismatch,
* a dtype mismatch, unless the caller passes ``upcast=True`` (then both sides are compared
  as float64; a mismatch never passes silently),
* any non-finite value (NaN, +inf, -inf) on either side: the detail says which side, how
  many of each kind and the first index (a NaN difference would otherwise vanish in
  Python's ``max(0.0, nan) == 0.0``),
* otherwise ``max |got - want| > tolerance`` (the difference is taken in float64).

``tolerance=None`` measures without a bound (reports): the problems above still fail.
``compare_identical(got, want)`` is the byte-identity form (``torch.equal`` on the bytes)
with the same refusals; ``allow_inf=True`` admits +-inf (attention masks), never NaN.

A :class:`Comparison` is truthy only when it passed, so ``assert compare_states(...)``
cannot pass on a failure.  torch is imported inside the functions only.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Literal

Problem = Literal["empty", "shape", "dtype", "non-finite", "tolerance", "bytes"]


@dataclass(frozen=True)
class NonFinite:
    """Non-finite values on one side: counts by kind and the first position (row-major)."""

    side: str
    nan: int
    posinf: int
    neginf: int
    first: tuple[int, ...]

    @property
    def count(self) -> int:
        return self.nan + self.posinf + self.neginf

    def describe(self) -> str:
        kinds = ", ".join(f"{n} {k}" for n, k in ((self.nan, "NaN"), (self.posinf, "+inf"), (self.neginf, "-inf"))
                          if n)
        return f"{self.side} has {self.count} non-finite ({kinds}), first at {list(self.first)}"


@dataclass(frozen=True)
class Comparison:
    """The outcome: ``ok``, the problem that failed it (``None`` when ok), a one-line detail and
    ``max_abs_diff`` (``None`` when the values were not compared: empty, shape, dtype, non-finite)."""

    ok: bool
    problem: Problem | None
    detail: str
    max_abs_diff: float | None = None
    nonfinite: tuple[NonFinite, ...] = field(default=())

    def __bool__(self) -> bool:
        return self.ok


def _fail(problem: Problem, detail: str, diff: float | None = None,
          nonfinite: tuple[NonFinite, ...] = ()) -> Comparison:
    return Comparison(False, problem, detail, diff, nonfinite)


def _first_index(mask: Any, shape: tuple[int, ...]) -> tuple[int, ...]:
    flat = int(mask.reshape(-1).to(dtype=_torch().uint8).argmax())  # argmax: the first maximum
    index = []
    for size in reversed(shape):
        index.append(flat % size)
        flat //= size
    return tuple(reversed(index))


def _torch() -> Any:
    import torch

    return torch


def count_nonfinite(t: Any, side: str, *, allow_inf: bool = False) -> NonFinite | None:
    """The non-finite values of ``t`` (NaN only with ``allow_inf``), or ``None`` when there are none."""
    torch = _torch()
    if not (t.is_floating_point() or t.is_complex()):
        return None
    bad = torch.isnan(t) if allow_inf else ~torch.isfinite(t)
    if not bool(bad.any()):
        return None
    nan = int(torch.isnan(t).sum())
    posinf = 0 if allow_inf or t.is_complex() else int(torch.isposinf(t).sum())
    neginf = 0 if allow_inf or t.is_complex() else int(torch.isneginf(t).sum())
    if t.is_complex():
        nan = int(bad.sum())  # complex: counted together
    return NonFinite(side, nan, posinf, neginf, _first_index(bad, tuple(t.shape)))


def _structure(got: Any, want: Any, upcast: bool, sides: tuple[str, str], allow_inf: bool) -> Comparison | None:
    """The refusals shared by both forms, in order: empty, shape, dtype, non-finite."""
    torch = _torch()
    for t, side in zip((got, want), sides):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"compare: {side} is a {type(t).__name__}, not a torch.Tensor")
    empty = [side for t, side in zip((got, want), sides) if t.numel() == 0]
    if empty:
        return _fail("empty", f"empty tensor: {' and '.join(empty)} "
                              f"(shapes {list(got.shape)} / {list(want.shape)}); nothing compared")
    if tuple(got.shape) != tuple(want.shape):
        return _fail("shape", f"shape {sides[0]} {list(got.shape)} != {sides[1]} {list(want.shape)}")
    if got.dtype != want.dtype and not upcast:
        return _fail("dtype", f"dtype {sides[0]} {got.dtype} != {sides[1]} {want.dtype} "
                              "(pass upcast=True to compare them as float64)")
    if got.is_complex() or want.is_complex():
        return _fail("dtype", f"complex dtype ({got.dtype} / {want.dtype}) is not supported")
    bad = tuple(x for x in (count_nonfinite(got, sides[0], allow_inf=allow_inf),
                            count_nonfinite(want, sides[1], allow_inf=allow_inf)) if x is not None)
    if bad:
        return _fail("non-finite", "non-finite values: " + "; ".join(b.describe() for b in bad), nonfinite=bad)
    return None


def _max_abs_diff(got: Any, want: Any) -> float:
    torch = _torch()
    if got.device != want.device:
        got, want = got.cpu(), want.cpu()
    return float((got.detach().to(torch.float64) - want.detach().to(torch.float64)).abs().max())


def compare_states(got: Any, want: Any, *, tolerance: float | None, upcast: bool = False,
                   sides: tuple[str, str] = ("got", "want")) -> Comparison:
    """Compare two tensors' values; see the module docstring for what fails.  ``sides`` names
    the two tensors in the detail (e.g. ``("engine", "reference")``)."""
    if tolerance is not None and not (isinstance(tolerance, (int, float)) and math.isfinite(tolerance)
                                      and tolerance >= 0):
        raise ValueError(f"compare_states: tolerance must be a finite number >= 0 or None, got {tolerance!r}")
    refused = _structure(got, want, upcast, sides, allow_inf=False)
    if refused is not None:
        return refused
    worst = _max_abs_diff(got, want)
    if tolerance is not None and not worst <= tolerance:  # 'not <=': also false for a NaN
        return _fail("tolerance", f"max|diff|={worst:.2e} > tolerance {tolerance:.1e}", worst)
    return Comparison(True, None, f"max|diff|={worst:.2e}", worst)


def compare_identical(got: Any, want: Any, *, allow_inf: bool = False,
                      sides: tuple[str, str] = ("got", "want")) -> Comparison:
    """Byte identity (same dtype, shape and bytes) with the same refusals as :func:`compare_states`
    (empty, shape, dtype, NaN; +-inf too unless ``allow_inf``)."""
    torch = _torch()
    refused = _structure(got, want, False, sides, allow_inf=allow_inf)
    if refused is not None:
        return refused
    a, b = got.detach(), want.detach()
    if a.device != b.device:
        a, b = a.cpu(), b.cpu()
    a, b = a.contiguous().reshape(-1), b.contiguous().reshape(-1)
    if a.dtype != torch.bool:
        a, b = a.view(torch.uint8), b.view(torch.uint8)
    if torch.equal(a, b):
        return Comparison(True, None, f"byte-identical ({got.numel()} values)", 0.0)
    first = _first_index(a != b, (a.numel(),))[0] // got.element_size()
    return _fail("bytes", f"not byte-identical: first difference at value {first} of {got.numel()} (flattened)")
