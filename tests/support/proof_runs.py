"""Running a patch's proof of need (test code; the declaration is ``spec_compat.core.proof.Proof``).

* :func:`proof_cases` -- the ids whose proof is a given test function (its ``pid`` parameter list),
  so every declared proof is a collected test item;
* :class:`ProofRun` -- one proof test's bookkeeping, handed out by the ``prove`` fixture
  (``tests/conftest.py``): which ids the stock run disabled, whether the declared symptom was seen
  with them off and was absent with the patch on; checked after the test passed.
"""

from __future__ import annotations

from spec_compat.core.proof import SYMPTOM_KINDS, Proof


def proof_cases(test_function: str) -> list[str]:
    """Ids of the registered patches whose proof is ``test_function`` (a test's parameter list)."""
    from spec_compat import REGISTRY
    from spec_compat import patches  # noqa: F401  (registers every patch)

    return sorted(p.id for p in REGISTRY.patches()
                  if p.proof is not None and p.proof.test_function == test_function)


def find_symptom(proof: Proof, output: str) -> str | None:
    """The first line of ``output`` showing the symptom, or None."""
    if proof.regex is None:
        return None
    for line in output.splitlines():
        if proof.regex.search(line):
            return line
    m = proof.regex.search(output)  # a symptom spanning lines
    return m.group(0) if m else None


class ProofRun:
    """One proof test's bookkeeping: which ids it disabled, whether it saw the symptom."""

    def __init__(self, pid: str, proof: Proof) -> None:
        self.pid = pid
        self.proof = proof
        self.disabled: list[str] = []
        self.symptom_seen: str | None = None
        self.absent_checked = False
        self.identical_checked = False

    @property
    def disable(self) -> str:
        """The ``SPEC_COMPAT_DISABLE`` value of the stock run (recorded as used)."""
        value = ",".join(self.proof.disabled_ids(self.pid))
        self.disabled.append(value)
        return value

    @property
    def baseline(self) -> str:
        """The ``SPEC_COMPAT_DISABLE`` value of the patched run: ``also_off`` only (may be empty)."""
        return ",".join(self.proof.also_off)

    def assert_symptom(self, output: str) -> str:
        """The stock run's output shows the declared symptom (returns the line)."""
        line = find_symptom(self.proof, output)
        assert line is not None, (f"{self.pid}: the run with {self.proof.disabled_ids(self.pid)} disabled does not "
                                  f"show the declared symptom /{self.proof.symptom}/:\n{output[-4000:]}")
        self.symptom_seen = line
        return line

    def assert_absent(self, output: str) -> None:
        """The patched run does not show the symptom."""
        line = find_symptom(self.proof, output)
        assert line is None, f"{self.pid}: the patched run shows the symptom too: {line}"
        self.absent_checked = True

    def assert_identical(self, identical: bool, what: str) -> None:
        """An optimisation: output with and without the patch is byte-identical."""
        assert identical, f"{self.pid}: {what} differs with the patch disabled"
        self.identical_checked = True

    def problems(self) -> list[str]:
        """What the test did not do that its proof requires (checked after the test passed)."""
        if self.proof.kind == "measured":  # nothing is run disabled: the benchmark JSON is the proof
            return []
        want = ",".join(self.proof.disabled_ids(self.pid))
        out = []
        if not self.disabled:
            out.append(f"never ran with {want} disabled (use prove(pid).disable)")
        elif any(d != want for d in self.disabled):
            out.append(f"disabled {self.disabled}, declared {want!r}")
        if self.proof.kind in SYMPTOM_KINDS:
            if self.symptom_seen is None:
                out.append(f"did not assert the declared symptom /{self.proof.symptom}/")
            if not self.absent_checked:
                out.append("did not check the symptom's absence with the patch on")
        if self.proof.kind == "optimization" and not self.identical_checked:
            out.append("did not compare output with and without the patch")
        return out
