"""What the compatibility matrix tested, shipped with the package (read by ``spec-compat report``).

``matrix/record`` (with ``matrix/records.py``) writes ``matrix/results/CELL.json`` after each cell's
suite and condenses them into ``spec_compat/data/tested_cells.json`` (this module's input):
per cell, the installed versions, when the suite last passed, the key checks and
each patch's status.  :func:`tested_status` tells ``spec-compat report`` whether
the installed combination is a tested cell, and if not, which tested cell is
nearest and which applied patches run at versions no green cell covered.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

TESTED_CELLS = Path(__file__).parent.parent / "data" / "tested_cells.json"
#: the distributions that identify a cell
KEYS = ("speculators", "vllm", "transformers", "torch")


def load_cells(path: Path = TESTED_CELLS) -> list[dict[str, Any]]:
    """The recorded cells; an empty list when the file is missing or unreadable."""
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return []
    cells = data.get("cells") if isinstance(data, dict) else None
    return [c for c in cells or [] if isinstance(c, dict) and isinstance(c.get("versions"), dict)]


def _release(version: str | None) -> tuple[int, ...]:
    from packaging.version import InvalidVersion, Version

    if not version:
        return ()
    try:
        return Version(version).release
    except InvalidVersion:
        return ()


def _distance(a: Mapping[str, str | None], b: Mapping[str, str | None]) -> tuple[int, ...]:
    """Order cells by closeness: differing speculators/vllm releases weigh most (major, minor,
    patch differences in that order), then transformers, then torch."""
    key = []
    for dist in KEYS:
        ra, rb = _release(a.get(dist)), _release(b.get(dist))
        if a.get(dist) == b.get(dist):
            key += [0, 0, 0]
            continue
        if not ra or not rb:
            key += [1000, 0, 0]
            continue
        parts = [abs(x - y) for x, y in zip((ra + (0, 0, 0))[:3], (rb + (0, 0, 0))[:3])]
        key += parts
    return tuple(key)


def tested_status(versions: Mapping[str, str | None], records: Sequence[Mapping[str, Any]],
                  cells: Sequence[Mapping[str, Any]] | None = None) -> dict[str, Any]:
    """``{"tested": bool, "cell", "last_green", "nearest", "extrapolated": [patch ids], "message"}``.

    ``records``: this environment's patch records (``id``, ``status``).  A patch is
    *extrapolated* when it is applied here but no green recorded cell applied it at the
    installed versions of the distributions its ranges name."""
    from ..core.registry import REGISTRY

    cells = list(load_cells() if cells is None else cells)
    here = {k: versions.get(k) for k in KEYS}
    if not cells:
        return {"tested": False, "cell": None, "last_green": None, "nearest": None, "extrapolated": [],
                "message": "no recorded matrix results ship with this installation"}
    exact = [c for c in cells if all(c["versions"].get(k) == here[k] for k in KEYS)]
    green = [c for c in cells if c.get("last_green")]
    applied = [r["id"] for r in records if r.get("status") == "applied"]
    if exact and exact[0].get("last_green"):
        c = exact[0]
        # patches applied now that the recorded run did not apply (a newer spec-compat than the run)
        unrecorded = [pid for pid in applied if c.get("patches", {}).get(pid) != "applied"]
        msg = f"tested cell {c['cell']}, last green {c['last_green']}"
        if unrecorded:
            msg += (f"; {len(unrecorded)} applied patches were not in that run (added since): "
                    f"{', '.join(unrecorded)}")
        return {"tested": True, "cell": c["cell"], "last_green": c["last_green"], "nearest": c["cell"],
                "extrapolated": [], "unrecorded": unrecorded, "message": msg}
    nearest = min(green or cells, key=lambda c: _distance(here, c["versions"]))
    extrapolated = []
    for pid in applied:
        try:
            patch = REGISTRY.get(pid)
        except KeyError:
            continue
        dists = {d for combo in patch.alternatives() for d in combo}
        covered = any(c.get("patches", {}).get(pid) == "applied"
                      and all(c["versions"].get(d) == versions.get(d) for d in dists) for c in green)
        if not covered:
            extrapolated.append(pid)
    if exact:
        msg = f"cell {exact[0]['cell']} was recorded but has not passed"
    else:
        msg = ("untested combination (" + ", ".join(f"{k} {here[k] or '-'}" for k in KEYS) + "); nearest tested "
               f"cell {nearest['cell']}" + (f", last green {nearest['last_green']}" if nearest.get("last_green") else ""))
    if extrapolated:
        msg += f"; {len(extrapolated)} applied patches run at versions no green cell covered: {', '.join(extrapolated)}"
    return {"tested": False, "cell": exact[0]["cell"] if exact else None, "last_green": None,
            "nearest": nearest["cell"], "extrapolated": extrapolated, "message": msg}
