"""``spec_compat/core/manifest.py`` (what ``import spec_compat`` hooks before any patch class is
loaded) names exactly the registry's patch ids and target modules."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from spec_compat import REGISTRY
from spec_compat.core import manifest as _manifest

ROOT = Path(__file__).resolve().parents[2]


def _bytecode(root: Path = ROOT) -> dict[str, int]:
    """Every ``__pycache__`` directory and ``.pyc`` file in the source tree (dot-directories
    skipped), with its mtime: what a subprocess importing spec_compat from here could write."""
    found = {}
    for dirpath, dirs, files in os.walk(root):
        dirs[:] = [d for d in dirs if not d.startswith(".")]
        here = Path(dirpath)
        if here.name == "__pycache__":
            found[str(here)] = here.stat().st_mtime_ns
        for f in files:
            if f.endswith(".pyc"):
                try:
                    found[str(here / f)] = (here / f).stat().st_mtime_ns
                except FileNotFoundError:
                    pass
    return found


def _expected() -> tuple[tuple[str, ...], tuple[str, ...]]:
    patches = REGISTRY.patches()
    return tuple(p.id for p in patches), tuple(sorted({p.target_module for p in patches}))


def test_manifest_matches_the_registry():
    ids, modules = _expected()
    assert (_manifest.PATCH_IDS, _manifest.TARGET_MODULES) == (ids, modules), (
        "spec_compat/core/manifest.py is out of date: run tools/regenerate, which writes:\nPATCH_IDS = " + repr(ids)
        + "\nTARGET_MODULES = " + repr(modules))


def test_import_loads_no_patch_class_until_a_target_is_imported(tmp_path):
    code = (
        "import sys, spec_compat\n"
        "print('patches' in [m.rsplit('.', 1)[-1] for m in sys.modules if m.startswith('spec_compat.')])\n"
        "import json\n"  # not a target: nothing happens
        "print('spec_compat.patches' in sys.modules)\n"
        "print(len(spec_compat.REGISTRY.patches()) == len(spec_compat.core.manifest.PATCH_IDS))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=tmp_path,
                         env=dict(os.environ, PYTHONDONTWRITEBYTECODE="1"))
    assert out.stdout.split() == ["False", "False", "True"], out.stdout + out.stderr


def test_importing_a_target_loads_and_applies_the_registry(tmp_path):
    """A fake ``transformers`` (a target module) on sys.path: importing it after spec_compat
    loads the patch classes and decides them (its hook ran)."""
    pkg = tmp_path / "transformers"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("X = 1\n")
    code = (
        "import sys, spec_compat\n"
        "assert 'spec_compat.patches' not in sys.modules\n"
        "import transformers\n"
        "print('spec_compat.patches' in sys.modules)\n"
        "print(all(r.status.value != 'pending' or r.target.split(':')[0] != 'transformers'"
        " for r in spec_compat.records()))\n"
    )
    env = {"PYTHONPATH": str(tmp_path) + ":" + ":".join(p for p in sys.path if p), "PATH": "/usr/bin:/bin",
           "PYTHONDONTWRITEBYTECODE": "1"}  # spec_compat is imported from the source tree
    before = _bytecode()
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=tmp_path, env=env)
    written = {p: t for p, t in _bytecode().items() if before.get(p) != t}
    assert not written, f"bytecode written into the source tree: {sorted(written)}"
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["True", "True"], out.stdout + out.stderr
