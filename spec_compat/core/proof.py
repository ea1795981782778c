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


class Proof:
    """How a patch is shown to be needed.  ``test`` is ``"tests/<dir>/<file>.py::<function>"``."""

    __slots__ = ("kind", "test", "symptom", "also_off", "benchmark", "using", "regex")

    def __init__(self, kind: str, test: str, symptom: str = "", *, also_off: Iterable[str] = (),
                 benchmark: str = "", using: str = "") -> None:
        if kind not in KINDS:
            raise ProofDeclarationError(f"proof kind {kind!r} is not one of {KINDS}")
        if not re.fullmatch(r"tests/[\w/]+\.py::test_\w+", test):
            raise ProofDeclarationError(f"proof test {test!r} is not 'tests/<path>.py::test_<name>'")
        if kind in SYMPTOM_KINDS and not symptom:
            raise ProofDeclarationError(f"a {kind!r} proof needs the symptom it asserts")
        if kind in BENCHMARK_KINDS and not re.fullmatch(r"benchmarks/results/[\w.-]+\.json", benchmark):
            raise ProofDeclarationError(f"a {kind!r} proof names its benchmarks/results/*.json, got {benchmark!r}")
        self.kind = kind
        self.test = test
        self.symptom = symptom
        #: switched off in both runs: a patch that supersedes this one, or the fault a guard catches
        self.also_off = tuple(also_off)
        self.benchmark = benchmark
        #: the proof test's workload for this patch (free text the test parses, e.g. "llama short")
        self.using = using
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

    def disabled_ids(self, pid: str) -> tuple[str, ...]:
        """What the stock run switches off: the patch, then ``also_off``."""
        return (pid, *self.also_off)

    def __repr__(self) -> str:
        extra = "".join(f", {k}={getattr(self, k)!r}" for k in ("also_off", "benchmark", "using") if getattr(self, k))
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
