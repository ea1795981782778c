"""What the compatibility matrix tested, shipped with the package (read by ``spec-compat report``).

``matrix/record`` (with ``matrix/records.py``) writes ``matrix/results/CELL.json`` after each cell's
suite and condenses them into ``spec_compat/data/tested_cells.json`` (this module's input):
per cell, the installed versions, when the suite last passed, the key checks and
each patch's status.  :func:`tested_status` tells ``spec-compat report`` whether
the installed combination is a tested cell, and if not, which tested cell is
nearest and which applied patches run at versions no green cell covered, and names the commit at
which that cell was last green and how far the installed build is from it (:func:`installed_build`:
git facts of the checkout the package lies in, found with a few short ``git`` calls; a wheel install
has no commit to name).  Only this package (``spec_compat.cli``) runs git, and only when called.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

TESTED_CELLS = Path(__file__).parent.parent / "data" / "tested_cells.json"
#: the installed spec_compat package's directory (a git checkout's ``spec_compat/`` or an installed wheel's)
PACKAGE_DIR = Path(__file__).resolve().parent.parent
#: the distributions that identify a cell
KEYS = ("speculators", "vllm", "transformers", "torch")
#: seconds one git call may take before the installed build's commit is called unknown
GIT_TIMEOUT = 3.0
_HASH = re.compile(r"[0-9a-f]{7,40}")
#: the git facts of a build whose commit is unknown, with why (``installed_commit_note``)
NO_BUILD: dict[str, Any] = {"installed_commit": None, "installed_commit_note": None, "commits_since": None,
                            "package_changed_since": None, "package_modified": None}


class _GitError(Exception):
    pass


def _git(cwd: Path, *args: str, ok: tuple[int, ...] = (0,)) -> subprocess.CompletedProcess:
    """``git -C cwd ARGS``; _GitError (with why) when git is missing, slow or exits outside ``ok``.
    No optional locks: a report never touches the checkout's index while others use it."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("GIT_")}
    try:
        proc = subprocess.run(["git", "--no-optional-locks", "-C", str(cwd), *args], capture_output=True,
                              text=True, timeout=GIT_TIMEOUT, env=env, stdin=subprocess.DEVNULL)
    except FileNotFoundError:
        raise _GitError("git not found") from None
    except subprocess.TimeoutExpired:
        raise _GitError(f"git took over {GIT_TIMEOUT:g} s") from None
    except OSError as exc:
        raise _GitError(f"git: {exc}") from None
    if proc.returncode not in ok:
        raise _GitError(proc.stderr.strip().splitlines()[-1] if proc.stderr.strip() else f"git exit {proc.returncode}")
    return proc


def installed_build(since: str | None, package_dir: Path = PACKAGE_DIR) -> dict[str, Any]:
    """Git facts of the installed build (run by ``report``; nothing at import time).

    When ``package_dir`` is tracked in a git checkout: ``installed_commit`` (its HEAD),
    ``package_modified`` (the package's files differ from HEAD in the work tree, untracked files
    included) and, for a recorded commit ``since``, ``commits_since`` (``git rev-list --count
    since..HEAD``; None when ``since`` is not an ancestor of HEAD or not in the checkout) and
    ``package_changed_since`` (``git diff --quiet since HEAD -- <package>``).  Otherwise every fact
    is None and ``installed_commit_note`` says why (not a git checkout, e.g. a wheel; git missing)."""
    facts = dict(NO_BUILD)
    try:
        # the package itself must be tracked there: a virtualenv that happens to sit inside a checkout is not
        if not _git(package_dir, "ls-files", "--", "__init__.py").stdout.strip():
            facts["installed_commit_note"] = "not a git checkout"
            return facts
        facts["installed_commit"] = _git(package_dir, "rev-parse", "HEAD").stdout.strip()
        facts["package_modified"] = bool(_git(package_dir, "status", "--porcelain", "--", ".").stdout.strip())
        if since and _HASH.fullmatch(since):
            # left: commits of `since` not in HEAD (0: an ancestor); right: commits since
            try:
                left, right = _git(package_dir, "rev-list", "--left-right", "--count",
                                   f"{since}...HEAD").stdout.split()
            except _GitError:
                return facts  # `since` is not in this checkout
            if int(left) == 0:
                facts["commits_since"] = int(right)
                diff = _git(package_dir, "diff", "--quiet", since, "HEAD", "--", ".", ok=(0, 1))
                facts["package_changed_since"] = diff.returncode == 1
    except _GitError as exc:
        if facts["installed_commit"] is None:
            why = str(exc)
            facts["installed_commit_note"] = "not a git checkout" if "not a git repository" in why else why
    return facts


def commit_text(last_green_commit: str | None, build: Mapping[str, Any]) -> str:
    """What the matrix line says after "last green DATE": the commit and the installed build's
    distance from it (``build``: :func:`installed_build`'s facts)."""
    if not last_green_commit:
        return ", commit not recorded (recorded before records named commits)"
    text = f" at commit {last_green_commit[:12]}"
    head = build.get("installed_commit")
    if not head:
        return text + f" (installed build's commit unknown: {build.get('installed_commit_note') or 'not a git checkout'})"
    modified = "; package files modified in the work tree" if build.get("package_modified") else ""
    if build.get("commits_since") is None:
        return text + f" (installed build {head[:12]} does not contain that commit{modified})"
    if build["commits_since"] == 0:
        return text + f" (the installed build's commit{modified})"
    changed = "changed" if build.get("package_changed_since") else "unchanged"
    n = build["commits_since"]
    return text + f" (installed build {head[:12]}: {n} commit{'s' if n != 1 else ''} later, package files {changed} since{modified})"


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
                  cells: Sequence[Mapping[str, Any]] | None = None,
                  build: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """``{"tested": bool, "cell", "last_green", "nearest", "extrapolated": [patch ids], "message"}``
    plus ``last_green_commit`` (the commit at which the matching, else the nearest, cell was last
    green; None when its record predates records naming commits) and the installed build's git
    facts (:func:`installed_build`: ``installed_commit``, ``installed_commit_note``,
    ``commits_since``, ``package_changed_since``, ``package_modified``).

    ``records``: this environment's patch records (``id``, ``status``).  A patch is
    *extrapolated* when it is applied here but no green recorded cell applied it at the
    installed versions of the distributions its ranges name.  ``build``: the git facts to use
    instead of asking git (tests); they are taken as found for that cell's ``last_green_commit``."""
    from ..core.registry import REGISTRY

    cells = list(load_cells() if cells is None else cells)
    here = {k: versions.get(k) for k in KEYS}

    def facts(cell: Mapping[str, Any] | None) -> dict[str, Any]:
        since = cell.get("last_green_commit") if cell and cell.get("last_green") else None
        found = installed_build(since) if build is None else build
        return {"last_green_commit": since, **{k: found.get(k) for k in NO_BUILD}}

    if not cells:
        return {"tested": False, "cell": None, "last_green": None, "nearest": None, "extrapolated": [],
                "message": "no recorded matrix results ship with this installation", **facts(None)}
    exact = [c for c in cells if all(c["versions"].get(k) == here[k] for k in KEYS)]
    green = [c for c in cells if c.get("last_green")]
    applied = [r["id"] for r in records if r.get("status") == "applied"]
    if exact and exact[0].get("last_green"):
        c = exact[0]
        # patches applied now that the recorded run did not apply (a newer spec-compat than the run)
        unrecorded = [pid for pid in applied if c.get("patches", {}).get(pid) != "applied"]
        git = facts(c)
        msg = f"tested cell {c['cell']}, last green {c['last_green']}{commit_text(git['last_green_commit'], git)}"
        if unrecorded:
            msg += (f"; {len(unrecorded)} applied patches were not in that run (added since): "
                    f"{', '.join(unrecorded)}")
        return {"tested": True, "cell": c["cell"], "last_green": c["last_green"], "nearest": c["cell"],
                "extrapolated": [], "unrecorded": unrecorded, "message": msg, **git}
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
    git = facts(nearest)
    if exact:
        msg = f"cell {exact[0]['cell']} was recorded but has not passed"
    else:
        msg = ("untested combination (" + ", ".join(f"{k} {here[k] or '-'}" for k in KEYS) + "); nearest tested "
               f"cell {nearest['cell']}" + (f", last green {nearest['last_green']}"
                                            f"{commit_text(git['last_green_commit'], git)}"
                                            if nearest.get("last_green") else ""))
    if extrapolated:
        msg += f"; {len(extrapolated)} applied patches run at versions no green cell covered: {', '.join(extrapolated)}"
    return {"tested": False, "cell": exact[0]["cell"] if exact else None, "last_green": None,
            "nearest": nearest["cell"], "extrapolated": extrapolated, "message": msg, **git}
