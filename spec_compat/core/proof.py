"""Proof of need, declared by each patch: which test shows the patch is needed, and how.

Every registered patch carries a :class:`Proof` (``Patch.proof``).  A proof names the test
that runs the stock path with only that patch switched off (``SPEC_COMPAT_DISABLE``) and
the symptom that run must show -- an exception type with a message fragment, or the
signature of wrong values -- and that the patched run must not show.  The kinds:

``fails``         stock run raises; ``symptom`` is a regular expression of the error
``wrong-values``  stock run returns wrong data silently; ``symptom`` matches the value check's
                  report (a row count, max |diff| above the tolerance)
``guard``         the patch turns silent loss into an error; the test makes the loss happen and
                  ``symptom`` matches the guard's error
``hardware``      ``fails`` on hardware where the failure exists (skipped elsewhere)
``optimization``  nothing fails without it: the test shows byte-identical output with and
                  without it, and ``benchmark`` names the recorded measurement of its effect
``measured``      nothing fails here (e.g. a CUDA-only effect): ``benchmark`` names the recorded
                  measurement under ``benchmarks/results/``

Both benchmark kinds declare the figures they state as :class:`Claim` s: which two measured values
of the JSON a ratio divides (both sides, so a test re-derives it) and the ratio or bound the
patch's docs state (``tests/unit/test_proofs.py`` re-derives and asserts each).

Only the declaration lives here (the patch modules import it at declaration time; pure Python, no
heavy imports).  What runs proofs is test code: ``tests/support/proof_runs.py`` (``proof_cases``,
``ProofRun``: a proof test's bookkeeping and symptom matching) and ``tests/support/proof_keys.py``
(what a recorded pass depends on, so CI re-runs a proof exactly when one of its inputs changed).
"""

from __future__ import annotations

import re
from collections.abc import Iterable

KINDS = ("fails", "wrong-values", "guard", "hardware", "optimization", "measured")
#: kinds whose test must see a symptom with the patch disabled
SYMPTOM_KINDS = ("fails", "wrong-values", "guard", "hardware")
#: kinds whose effect is recorded in a benchmark JSON
BENCHMARK_KINDS = ("optimization", "measured")


class ProofDeclarationError(ValueError):
    """A patch's proof declaration is malformed (found at import of the patch module)."""


BENCHMARK_RE = r"benchmarks/results/[\w.-]+\.json"
#: one step of a JSON path: a key, optionally picking the one element of the list under it whose
#: fields equal the given values (compared as text): ``results[mode=a,seq_len=2048]``
_STEP = r"[^.\[\]]+(?:\[[^\[\]=,]+=[^\[\],]*(?:,[^\[\]=,]+=[^\[\],]*)*\])?"

#: a parsed path: per step, (key, ((field, value), ...))
JsonPath = tuple[tuple[str, tuple[tuple[str, str], ...]], ...]


def parse_path(path: str) -> JsonPath:
    """``"a.b[k=v,k2=v2].c"`` -> ``(("a", ()), ("b", (("k", "v"), ("k2", "v2"))), ("c", ()))``
    (a key holds no ``.``, ``[`` or ``]``; a key of digits also indexes a list)."""
    if not isinstance(path, str) or not re.fullmatch(rf"{_STEP}(?:\.{_STEP})*", path):
        raise ProofDeclarationError(f"claim path {path!r} is not 'key.key[field=value,...].key'")
    return tuple((key, tuple(tuple(item.split("=", 1)) for item in sel.split(",")) if sel else ())  # type: ignore[misc]
                 for key, sel in re.findall(r"([^.\[\]]+)(?:\[([^\[\]]*)\])?", path))


def _bound(name: str, x: object) -> float | None:
    if x is None:
        return None
    if isinstance(x, bool) or not isinstance(x, (int, float)) or not 0 < x < float("inf"):
        raise ProofDeclarationError(f"claim bound {name}={x!r} is not a positive finite number")
    return float(x)


class Claim:
    """A figure a benchmark proof states: ``numerator / denominator``, two measured values read
    from the benchmark JSON by path (:func:`parse_path`), and what the patch's docs say of the
    ratio: ``value`` as written there (``"2.07"``: the ratio rounds to it at the digits given),
    and/or bounds ``at_least`` / ``at_most``.

    A side whose path holds a list of numbers (repeats) stands for the list's median; with
    ``paired`` both sides are lists of equal length, measured in pairs, and the figure is the
    median of the pairs' ratios.  ``benchmark``: another ``benchmarks/results/*.json`` this one
    figure comes from (default: the proof's)."""

    __slots__ = ("what", "numerator", "denominator", "value", "at_least", "at_most", "paired", "benchmark")

    def __init__(self, what: str, numerator: str, denominator: str, *, value: str = "",
                 at_least: float | None = None, at_most: float | None = None, paired: bool = False,
                 benchmark: str = "") -> None:
        if not isinstance(what, str) or not what.strip():
            raise ProofDeclarationError("a claim says what its figure is (what=...)")
        parse_path(numerator), parse_path(denominator)
        if numerator == denominator:
            raise ProofDeclarationError(f"claim {what!r}: numerator and denominator are the same value {numerator!r}")
        if not isinstance(value, str) or (value and not re.fullmatch(r"\d+(?:\.\d+)?", value)):
            raise ProofDeclarationError(f"claim {what!r}: value {value!r} is not the figure as written, e.g. '2.07'")
        lo, hi = _bound("at_least", at_least), _bound("at_most", at_most)
        if not value and lo is None and hi is None:
            raise ProofDeclarationError(f"claim {what!r} states no figure (value, at_least or at_most)")
        if value and float(value) <= 0:
            raise ProofDeclarationError(f"claim {what!r}: value {value!r} is not a positive ratio")
        if lo is not None and hi is not None and lo > hi:
            raise ProofDeclarationError(f"claim {what!r}: at_least {lo} > at_most {hi}")
        if not isinstance(paired, bool):
            raise ProofDeclarationError(f"claim {what!r}: paired={paired!r} is not a bool")
        if benchmark and not re.fullmatch(BENCHMARK_RE, benchmark):
            raise ProofDeclarationError(f"claim {what!r} names {benchmark!r}, not a benchmarks/results/*.json")
        self.what = what
        self.numerator = numerator
        self.denominator = denominator
        self.value = value
        self.at_least = lo
        self.at_most = hi
        self.paired = paired
        self.benchmark = benchmark

    def holds(self, figure: float) -> bool:
        """Whether a re-derived ratio is the stated figure (at its digits) and within the bounds."""
        if self.value:
            places = len(self.value.partition(".")[2])
            if abs(figure - float(self.value)) > 0.5 * 10.0 ** -places + 1e-12:
                return False
        return (self.at_least is None or figure >= self.at_least) and (self.at_most is None or figure <= self.at_most)

    def stated(self) -> str:
        """The stated figure in words: ``= 2.07``, ``>= 1.0``, ``in [0.84, 0.89]``."""
        parts = [f"= {self.value}"] if self.value else []
        if self.at_least is not None and self.at_most is not None:
            parts.append(f"in [{self.at_least:g}, {self.at_most:g}]")
        elif self.at_least is not None:
            parts.append(f">= {self.at_least:g}")
        elif self.at_most is not None:
            parts.append(f"<= {self.at_most:g}")
        return ", ".join(parts)

    def __repr__(self) -> str:
        extra = "".join(f", {k}={getattr(self, k)!r}" for k in ("value", "at_least", "at_most", "paired", "benchmark")
                        if getattr(self, k) not in ("", None, False))
        return f"Claim({self.what!r}, {self.numerator!r}, {self.denominator!r}{extra})"


class Proof:
    """How a patch is shown to be needed.  ``test`` is ``"tests/<dir>/<file>.py::<function>"``."""

    __slots__ = ("kind", "test", "symptom", "also_off", "benchmark", "using", "regex", "claims")

    def __init__(self, kind: str, test: str, symptom: str = "", *, also_off: Iterable[str] = (),
                 benchmark: str = "", using: str = "", claims: Iterable[Claim] = ()) -> None:
        if kind not in KINDS:
            raise ProofDeclarationError(f"proof kind {kind!r} is not one of {KINDS}")
        if not re.fullmatch(r"tests/[\w/]+\.py::test_\w+", test):
            raise ProofDeclarationError(f"proof test {test!r} is not 'tests/<path>.py::test_<name>'")
        if kind in SYMPTOM_KINDS and not symptom:
            raise ProofDeclarationError(f"a {kind!r} proof needs the symptom it asserts")
        if kind in BENCHMARK_KINDS and not re.fullmatch(BENCHMARK_RE, benchmark):
            raise ProofDeclarationError(f"a {kind!r} proof names its benchmarks/results/*.json, got {benchmark!r}")
        claims = tuple(claims)
        if not all(isinstance(c, Claim) for c in claims):
            raise ProofDeclarationError(f"claims must be Claim(...) declarations, got {claims!r}")
        if kind in BENCHMARK_KINDS and not claims:
            raise ProofDeclarationError(f"a {kind!r} proof declares the figures it states (claims=(Claim(...), ...))")
        if kind not in BENCHMARK_KINDS and claims:
            raise ProofDeclarationError(f"a {kind!r} proof has no benchmark to state figures of")
        self.kind = kind
        self.test = test
        self.symptom = symptom
        #: switched off in both runs: a patch that supersedes this one, or the fault a guard catches
        self.also_off = tuple(also_off)
        self.benchmark = benchmark
        #: the proof test's workload for this patch (free text the test parses, e.g. "llama short")
        self.using = using
        #: the figures a benchmark proof states, each re-derived from its JSON by the unit tests
        self.claims = claims
        try:
            self.regex = re.compile(symptom) if symptom else None
        except re.error as exc:
            raise ProofDeclarationError(f"symptom {symptom!r} is not a regular expression: {exc}") from None

    @property
    def test_file(self) -> str:
        return self.test.split("::", 1)[0]

    @property
    def test_function(self) -> str:
        return self.test.split("::", 1)[1]

    def benchmark_of(self, claim: Claim) -> str:
        """The JSON a claim's figure is read from."""
        return claim.benchmark or self.benchmark

    def disabled_ids(self, pid: str) -> tuple[str, ...]:
        """What the stock run switches off: the patch, then ``also_off``."""
        return (pid, *self.also_off)

    def __repr__(self) -> str:
        extra = "".join(f", {k}={getattr(self, k)!r}" for k in ("also_off", "benchmark", "using", "claims")
                        if getattr(self, k))
        return f"Proof({self.kind!r}, {self.test!r}, {self.symptom!r}{extra})"


# -- the proof tests patches name (one place, so a renamed test is one edit) ---------------

#: stock extraction (``spec-compat selftest``) with the patch off; ``using`` = "FIXTURE CHECKS"
SELFTEST = "tests/engine/test_shims_needed.py::test_fails_with_only_this_shim_disabled"
#: ``spec-compat evaluate`` serving an untrained draft with the patch off; ``using`` = fixture
SERVING = "tests/engine/test_serving.py::test_fails_with_only_this_serving_shim_disabled"
#: one epoch of the stock trainer on the demo's data with the patch off; ``using`` = fixture
TRAINING = "tests/engine/test_training.py::test_training_fails_without_shim"
#: the stock steps of speculators' scripts/train.py under transformers 5; ``using`` = the step
T1_STEPS = "tests/training_only/test_t1_patches_needed.py::test_step_fails_without_the_patch"
#: a claim measured only (no failure here): the unit test checks the named JSON
MEASURED = "tests/unit/test_proofs.py::test_measured_proofs_name_a_recorded_benchmark"
