"""Whether each patch's proof of need has a recorded pass, from what ships with the package.

``matrix/record`` keeps each cell's passed proofs in ``matrix/results/proofs/CELL.json``;
``matrix/records.py`` condenses them into the ``proofs`` key of ``spec_compat/data/tested_cells.json``
(per patch id, per proof test, the cells where it passed), which a wheel install ships.  A proof is
``recorded`` when its declared test passed in some cell, else ``unproven``.  ``spec-compat report
--json`` gives every patch's; the text report and docs/patches.md mark the ``hardware`` proofs
without a recorded pass (their hardware is in no CI cell, so no run will record them by itself;
a proof of another kind runs in the cells whenever one of its inputs changes).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from .tested_cells import TESTED_CELLS

RECORDED = "recorded"
UNPROVEN = "unproven"


def load_proof_records(path: Path = TESTED_CELLS) -> dict[str, dict[str, list[str]]]:
    """``{patch id: {proof test: [cells]}}`` as shipped; empty when missing or unreadable."""
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    proofs = data.get("proofs") if isinstance(data, dict) else None
    if not isinstance(proofs, dict):
        return {}
    return {pid: {t: [c for c in cells if isinstance(c, str)] for t, cells in tests.items() if isinstance(cells, list)}
            for pid, tests in proofs.items() if isinstance(tests, dict)}


def proof_status(proof: Any, recorded: Mapping[str, Sequence[str]] | None) -> dict[str, Any] | None:
    """``{"kind", "test", "status": "recorded" | "unproven", "recorded_in": [cells]}`` of one patch's
    proof (``recorded``: that patch's entry of :func:`load_proof_records`; a pass counts only for
    the test the proof declares now); None for a patch that declares no proof."""
    if proof is None:
        return None
    cells = sorted((recorded or {}).get(proof.test, ()))
    return {"kind": proof.kind, "test": proof.test, "status": RECORDED if cells else UNPROVEN, "recorded_in": cells}


def proof_statuses(patches: Sequence[Any], records: Mapping[str, Mapping[str, Sequence[str]]] | None = None
                   ) -> dict[str, dict[str, Any] | None]:
    """:func:`proof_status` of each patch (``records``: default the shipped ones), by patch id."""
    records = load_proof_records() if records is None else records
    return {p.id: proof_status(p.proof, records.get(p.id)) for p in patches}


def unproven(statuses: Mapping[str, Mapping[str, Any] | None], kinds: Sequence[str] = ("hardware",)) -> list[str]:
    """Ids whose proof, of one of ``kinds``, has no recorded pass."""
    return [pid for pid, s in statuses.items() if s and s["status"] == UNPROVEN and s["kind"] in kinds]
