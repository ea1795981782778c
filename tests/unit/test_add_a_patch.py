"""The README's "Adding a patch" walkthrough, done on a copy of the package.

A throwaway patch is declared in a new module of a copied ``spec_compat/patches/`` (found by
discovery: no list names it), with its proof test and a CHANGELOG line; after the one regenerate
command (``tools/regenerate``) it is in the manifest, in the patch table, in the failure catalog's
no-code table (it declares no ``fixes``) and in ``report --json``, and importing its target module
applies it.  Before the command, ``tools/regenerate --check`` names the three stale files and the
import does not reach the patch (``import spec_compat`` hooks only the manifest's modules).  The
files written by hand are counted: README states the count.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
REGENERATE = ROOT / "tools" / "regenerate"

PATCH_MODULE = '''\
"""A walkthrough patch (tests/unit/test_add_a_patch.py)."""

from __future__ import annotations

from ...core.proof import Proof
from ...core.registry import Patch, TargetChanged, register


@register
class WalkthroughGreeting(Patch):
    """walkthrough_target 1.0 (walkthrough_target.py greet) says 'hello' where callers
    expect 'hello, world' -> the caller's check fails."""

    id = "walkthrough-greeting"
    proof = Proof("fails", "tests/unit/test_add_a_patch.py::test_walkthrough", r"hello != hello, world")
    summary = "greet() says 'hello, world'"
    upstream = "walkthrough_target.py greet"
    target = "walkthrough_target:greet"

    def check(self, module):
        if not callable(getattr(module, "greet", None)):
            raise TargetChanged("walkthrough_target.greet is gone")

    def install(self, module, changes):
        changes.setattr(module, "greet", lambda: "hello, world")
'''

TARGET_MODULE = 'def greet():\n    return "hello"\n'


PROOF_TEST = '''\
def test_walkthrough():
    import walkthrough_target

    assert walkthrough_target.greet() == "hello, world"
'''

#: at most this many files are written by hand to add a patch (README, "Adding a patch")
HAND_WRITTEN_AT_MOST = 4


def _copy(tmp: Path) -> Path:
    root = tmp / "checkout"
    shutil.copytree(ROOT / "spec_compat", root / "spec_compat",
                    ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    (root / "docs").mkdir()
    for doc in ("patches.md", "failures.md"):
        shutil.copy(ROOT / "docs" / doc, root / "docs" / doc)
    shutil.copy(ROOT / "CHANGELOG.md", root / "CHANGELOG.md")
    (root / "tests" / "unit").mkdir(parents=True)
    (root / "walkthrough_target.py").write_text(TARGET_MODULE)
    return root


def _snapshot(root: Path) -> dict[str, bytes]:
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in sorted(root.rglob("*"))
            if p.is_file() and "__pycache__" not in p.parts}


def _changed(before: dict[str, bytes], after: dict[str, bytes]) -> set[str]:
    return {f for f in before.keys() | after.keys() if before.get(f) != after.get(f)}


def _run(root: Path, *args: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=str(root), PYTHONDONTWRITEBYTECODE="1")
    env.pop("SPEC_COMPAT_DISABLE", None)
    return subprocess.run([sys.executable, *args], capture_output=True, text=True, cwd=root, env=env, timeout=120)


def _greeting(root: Path) -> str:
    out = _run(root, "-c", "import spec_compat, walkthrough_target; print(walkthrough_target.greet())")
    assert out.returncode == 0, out.stderr
    return out.stdout.strip()


def test_walkthrough(tmp_path):
    root = _copy(tmp_path)
    start = _snapshot(root)
    # step 1, by hand: the unit (declaration and behaviour, found by discovery), its proof test, a CHANGELOG line
    (root / "spec_compat" / "patches" / "serving" / "walkthrough_greeting.py").write_text(PATCH_MODULE)  # named after its id
    (root / "tests" / "unit" / "test_add_a_patch.py").write_text(PROOF_TEST)
    changelog = root / "CHANGELOG.md"
    changelog.write_text(changelog.read_text().replace("\n\n", "\n\n- `walkthrough-greeting`: greet() says "
                                                       "'hello, world' (walkthrough).\n\n", 1))
    by_hand = _changed(start, _snapshot(root))
    assert len(by_hand) <= HAND_WRITTEN_AT_MOST, sorted(by_hand)

    stale = _run(root, str(REGENERATE), "--check", "--root", str(root))
    assert stale.returncode == 1, stale.stderr
    assert "out of date: spec_compat/core/manifest.py" in stale.stderr
    assert "out of date: docs/patches.md" in stale.stderr
    assert "out of date: docs/failures.md" in stale.stderr
    assert _greeting(root) == "hello"  # the manifest does not name walkthrough_target yet

    # step 2: the one regenerate command
    before_regenerate = _snapshot(root)
    done = _run(root, str(REGENERATE), "--root", str(root))
    assert done.returncode == 0, done.stderr
    generated = _changed(before_regenerate, _snapshot(root))
    assert generated == {"spec_compat/core/manifest.py", "docs/patches.md", "docs/failures.md"}, sorted(generated)
    assert "docs/failures.md" not in by_hand  # the catalog's patch lists and no-code table are generated
    print(f"adding a patch: {len(by_hand)} files by hand ({', '.join(sorted(by_hand))}), "
          f"{len(generated)} generated ({', '.join(sorted(generated))})")
    again = _run(root, str(REGENERATE), "--check", "--root", str(root))
    assert again.returncode == 0, again.stderr

    manifest = (root / "spec_compat" / "core" / "manifest.py").read_text()
    assert '    "walkthrough-greeting",\n' in manifest and '    "walkthrough_target",\n' in manifest
    table = (root / "docs" / "patches.md").read_text()
    assert "| `walkthrough-greeting` |  | always | driver | greet() says 'hello, world' |" in table
    catalog = (root / "docs" / "failures.md").read_text()
    no_code = catalog[catalog.index("<!-- no-code-table:start"):catalog.index("<!-- no-code-table:end -->")]
    assert ("| `walkthrough-greeting` | walkthrough_target 1.0 (walkthrough_target.py greet) says 'hello' where "
            "callers expect 'hello, world' -> the caller's check fails. | fails |\n") in no_code
    assert _greeting(root) == "hello, world"

    report = _run(root, "-m", "spec_compat", "report", "--json")
    assert report.returncode == 0, report.stderr
    records = {p["id"]: p for p in json.loads(report.stdout)["patches"]}
    assert "walkthrough-greeting" in records, sorted(records)
    # report imported the new target module itself (from the regenerated manifest): applied, not pending
    assert records["walkthrough-greeting"]["status"] == "applied", records["walkthrough-greeting"]
    # the rest of the registry is untouched: every registered id still reported
    ids = _run(root, "-c", "import spec_compat.core.manifest as m; print(len(m.PATCH_IDS))")
    assert int(ids.stdout) == len(records)


def test_check_names_a_hand_edited_catalog(tmp_path):
    """A Patches line or a no-code row that differs from the declarations makes failures.md stale."""
    root = _copy(tmp_path)
    catalog = root / "docs" / "failures.md"
    text = catalog.read_text()
    for old, new in (("- **Patches:** `capture-per-request`, `rows-by-request-id`", "- **Patches:** `rows-by-request-id`"),
                     ("| `cpu-rejection-sampler` | Serving on CPU", "| `cpu-rejection-sampler` | On CPU")):
        assert old in text, old
        catalog.write_text(text.replace(old, new))
        out = _run(root, str(REGENERATE), "--check", "--root", str(root))
        assert out.returncode == 1 and "out of date: docs/failures.md" in out.stderr, out.stderr
    catalog.write_text(text)
    assert _run(root, str(REGENERATE), "--check", "--root", str(root)).returncode == 0


def test_the_checkout_is_current():
    """This checkout's manifest and table are what tools/regenerate writes."""
    out = subprocess.run([sys.executable, str(REGENERATE), "--check"], capture_output=True, text=True, timeout=120,
                         env=dict(os.environ, PYTHONDONTWRITEBYTECODE="1"))
    assert out.returncode == 0, out.stderr


def test_report_resolves_every_target_module():
    """``report`` imports the manifest's target modules (no list of its own to keep in step)."""
    from spec_compat.cli.report import report_modules
    from spec_compat.core import manifest

    assert report_modules() == manifest.TARGET_MODULES
