"""What a doctor check returns: a :class:`Finding` (``ok`` / ``problem`` / ``skipped``), or :class:`Skip`."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from typing import Any


class Skip(Exception):
    """A check cannot run: the message says what it lacks (a file, an input)."""


@dataclass
class Finding:
    status: str  # "ok" | "problem" | "skipped"
    summary: str
    fix: str = ""
    evidence: dict[str, Any] = field(default_factory=dict)
    check: str = ""
    seconds: float = 0.0

    @classmethod
    def ok(cls, summary: str, evidence: dict[str, Any] | None = None) -> Finding:
        return cls("ok", summary, evidence=evidence or {})

    @classmethod
    def problem(cls, cause: str, fix: str, evidence: dict[str, Any] | None = None) -> Finding:
        return cls("problem", cause, fix, evidence or {})


def as_json(findings: list[Finding]) -> dict[str, Any]:
    return {"problems": sum(1 for f in findings if f.status == "problem"),
            "checks": [asdict(f) for f in findings]}


def line(f: Finding) -> str:
    """One finding as the command prints it."""
    if f.status == "skipped":
        return f"{f.check:<11} skipped ({f.summary})  [{f.seconds:.1f} s]"
    head = f"{f.check:<11} {f.status:<8} {f.summary}  [{f.seconds:.1f} s]"
    if f.status == "problem":
        head += f"\n{'':<11} fix:     {f.fix}"
        head += f"\n{'':<11} evidence: {json.dumps(f.evidence, default=str)}"
    return head
