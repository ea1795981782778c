"""What the compatibility matrix tested, shipped with the package.

``matrix/record`` writes ``matrix/results/CELL.json`` after each cell's suite and
condenses them into ``spec_compat/data/tested_cells.json`` (this module's input):
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
    from .registry import REGISTRY

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


# ---------------------------------------------------------------------------
# recording (used by matrix/record and the RESULTS.md freshness test)

#: key check -> predicate on a test id ("tests/engine/test_x.py::test_y[param]")
CHECKS: dict[str, Any] = {
    "import + report": lambda t: t.startswith(("tests/unit/", "tests/future/")),
    "Llama extraction exact": lambda t: t.startswith("tests/engine/test_extraction.py") and "llama" in t,
    "Kimi-K2.5 extraction exact": lambda t: t.startswith("tests/engine/test_extraction.py") and "kimi" in t,
    "training runs": lambda t: t.startswith(("tests/engine/test_training.py", "tests/training_only/")),
    # the refusal test is what passes where the platform cannot serve (vLLM 0.11 on CPU): not serving
    "serving (lossless, acceptance)": lambda t: (t.startswith("tests/engine/test_serving.py")
                                                 and "refuses_where_serving_is_unsupported" not in t),
}


def check_outcomes(tests: Mapping[str, str]) -> dict[str, str]:
    """Per key check: ``pass`` (all ran tests passed, at least one ran), ``FAIL``, ``skipped``
    (all skipped) or ``-`` (no such test in this cell)."""
    out = {}
    for name, pred in CHECKS.items():
        got = [o for t, o in tests.items() if pred(t)]
        if not got:
            out[name] = "-"
        elif any(o in ("failed", "error") for o in got):
            out[name] = "FAIL"
        elif all(o == "skipped" for o in got):
            out[name] = "skipped"
        else:
            out[name] = "pass"
    return out


def _checks(result: Mapping[str, Any]) -> dict[str, str]:
    """The key checks of a recorded result, from its per-test outcomes when it has them (so a
    change of CHECKS applies to every recorded cell)."""
    tests = result.get("tests")
    return check_outcomes(tests) if tests else dict(result.get("checks", {}))


def condense(results: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """``tested_cells.json`` from the per-cell result files."""
    cells = []
    for r in sorted(results, key=lambda r: r["cell"]):
        cells.append({"cell": r["cell"], "versions": {k: r["versions"].get(k) for k in KEYS},
                      "last_green": r.get("last_green"), "green": r.get("green", False),
                      "checks": _checks(r), "patches": r.get("patches", {})})
    return {"cells": cells}


def render_results_md(results: Sequence[Mapping[str, Any]]) -> str:
    """``matrix/RESULTS.md``: one table, cells x key checks (generated, never edited)."""
    rows = sorted(results, key=lambda r: r["cell"])
    head = ["cell", "speculators", "vllm", "transformers", "torch", *CHECKS, "suite", "patches applied",
            "last run", "last green", "build s", "disk GB (own / total)"]
    lines = [
        "# Compatibility matrix results",
        "",
        "Generated by `matrix/record` from `matrix/results/*.json` (written by `matrix/run`); do not edit.",
        "`pass`: every test of the check that ran passed; `-`: the cell has no such test.",
        "",
        "| " + " | ".join(head) + " |",
        "|" + "---|" * len(head),
    ]
    for r in rows:
        v = r["versions"]
        counts = r.get("counts", {})
        suite = f"{counts.get('passed', 0)} passed, {counts.get('failed', 0) + counts.get('error', 0)} failed, " \
                f"{counts.get('skipped', 0)} skipped"
        applied = sum(1 for s in r.get("patches", {}).values() if s == "applied")
        disk = r.get("disk", {})
        disk_s = f"{disk.get('own_bytes', 0) / 1e9:.2f} / {disk.get('total_bytes', 0) / 1e9:.2f}" if disk else "-"
        cells = [f"`{r['cell']}`", *(v.get(k) or "-" for k in KEYS),
                 *(_checks(r).get(c, "-") for c in CHECKS), suite, str(applied),
                 r.get("date", "-"), r.get("last_green") or "never", str(r.get("build_seconds", "-")), disk_s]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


# ---------------------------------------------------------------------------
# figures quoted in the READMEs: generated from the same records (between marker comments)

def _block_markers(name: str) -> tuple[str, str]:
    return (f"<!-- {name}:start (generated by `matrix/record --render` from matrix/results/*.json; "
            "a unit test keeps it in sync; do not edit) -->", f"<!-- {name}:end -->")


def replace_block(text: str, name: str, body: str) -> str:
    """``text`` with everything between the ``<!-- NAME:start … -->`` and ``<!-- NAME:end -->``
    lines replaced by ``body`` (the start line rewritten too); ValueError when a marker is
    missing or they are out of order."""
    start_prefix, end = f"<!-- {name}:start", _block_markers(name)[1]
    i, j = text.find(start_prefix), text.find(end)
    if i < 0 or j < 0 or j < i:
        raise ValueError(f"no <!-- {name}:start --> ... {end} block")
    return text[:i] + _block_markers(name)[0] + "\n" + body.rstrip("\n") + "\n" + text[j:]


def read_block(text: str, name: str) -> str:
    """The body of the ``NAME`` block in ``text`` (ValueError when absent)."""
    start_prefix, end = f"<!-- {name}:start", _block_markers(name)[1]
    i, j = text.find(start_prefix), text.find(end)
    if i < 0 or j < 0 or j < i:
        raise ValueError(f"no <!-- {name}:start --> ... {end} block")
    return text[text.index("\n", i) + 1:j]


def _counts(tests: Mapping[str, str], prefix: str = "") -> dict[str, int]:
    out = {"passed": 0, "failed": 0, "skipped": 0}
    for t, o in tests.items():
        if t.startswith(prefix):
            key = "failed" if o in ("failed", "error") else o
            out[key] = out.get(key, 0) + 1
    return out


def _pfs(c: Mapping[str, int]) -> str:
    return f"{c.get('passed', 0)} / {c.get('failed', 0)} / {c.get('skipped', 0)}"


def render_figures_md(results: Sequence[Mapping[str, Any]], in_ci: Sequence[str]) -> str:
    """README.md's ``figures`` block: per recorded cell, its last full run (test counts, the
    fault suite's share, suite and build time, disk) and the CI cells' totals."""
    rows = sorted(results, key=lambda r: r["cell"])
    lines = [
        "Each cell's last recorded full run (`matrix/results/CELL.json`; per-check outcomes in",
        "[`matrix/RESULTS.md`](matrix/RESULTS.md)). Tests: passed / failed / skipped (xfail counted as",
        "skipped); suite: seconds of the cell's `matrix/run`; build: seconds of its `matrix/env`.",
        "",
        "| cell | in CI | run | tests | of which `tests/faults` | suite s | build s | disk: own / total |",
        "|---|---|---|---|---|---|---|---|",
    ]
    ci_suite = ci_build = ci_passed = 0
    for r in rows:
        tests = r.get("tests") or {}
        counts = _counts(tests) if tests else {k: r.get("counts", {}).get(k, 0) for k in ("passed", "skipped")}
        if not tests:
            counts["failed"] = r.get("counts", {}).get("failed", 0) + r.get("counts", {}).get("error", 0)
        faults = _counts(tests, "tests/faults/")
        disk = r.get("disk") or {}
        disk_s = f"{disk.get('own_bytes', 0) / 1e6:.0f} MB / {disk.get('total_bytes', 0) / 1e9:.2f} GB" if disk else "-"
        ci = r["cell"] in in_ci
        if ci:
            ci_suite += int(r.get("suite_seconds") or 0)
            ci_build += int(round(float(r.get("build_seconds") or 0)))
            ci_passed += counts.get("passed", 0)
        lines.append(f"| `{r['cell']}` | {'yes' if ci else 'no'} | {r.get('date', '-')} | {_pfs(counts)} | "
                     f"{_pfs(faults) if sum(faults.values()) else '-'} | {r.get('suite_seconds', '-')} | "
                     f"{r.get('build_seconds', '-')} | {disk_s} |")
    n_ci = sum(1 for r in rows if r["cell"] in in_ci)
    lines += ["", f"The {n_ci} CI cells' recorded suites together: {ci_passed} tests passed in {ci_suite} s "
              f"({ci_suite / 60:.0f} min), plus {ci_build} s of environment builds from a warm uv cache (a clean "
              "clone's first build downloads the wheels too). Recorded runs are separate, not one CI run."]
    return "\n".join(lines) + "\n"


def render_fault_figures_md(results: Sequence[Mapping[str, Any]]) -> str:
    """tests/faults/README.md's ``fault-figures`` block: per fault-suite file, passed / failed /
    skipped in each recorded cell that ran the suite."""
    rows = [r for r in sorted(results, key=lambda r: r["cell"])
            if any(t.startswith("tests/faults/") for t in r.get("tests") or {})]
    files = sorted({t.split("::", 1)[0] for r in rows for t in r["tests"] if t.startswith("tests/faults/")})
    lines = [
        "Passed / failed / skipped (xfail counted as skipped) per file in each cell's last recorded",
        "full run (`matrix/results/CELL.json`; dates in [`matrix/RESULTS.md`](../../matrix/RESULTS.md)).",
        "",
        "| file | " + " | ".join(f"`{r['cell']}`" for r in rows) + " |",
        "|---|" + "---|" * len(rows),
    ]
    for f in files + ["all"]:
        prefix = f + "::" if f != "all" else "tests/faults/"
        cells = []
        for r in rows:
            c = _counts(r["tests"], prefix)
            cells.append(_pfs(c) if sum(c.values()) else "-")
        name = f"`{f.rsplit('/', 1)[-1]}`" if f != "all" else "**all**"
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"
