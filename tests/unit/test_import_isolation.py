"""``import spec_compat`` imports none of the heavy packages it patches."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path


ROOT = Path(__file__).resolve().parents[2]
HEAVY = ("vllm", "torch", "transformers", "speculators")

PROBE = """
import json, sys
import spec_compat
heavy = sorted(m for m in sys.modules if m.split('.')[0] in {heavy!r})
print(json.dumps({{"file": spec_compat.__file__, "heavy": heavy,
                   "records": [r.as_dict() for r in spec_compat.records()]}}))
"""


def write_stubs(stubs: Path, marker: Path, names=HEAVY) -> None:
    """Importable stand-ins that record being imported (even inside a try/except)."""
    for name in names:
        pkg = stubs / name
        pkg.mkdir(parents=True)
        (pkg / "__init__.py").write_text(
            f"with open({str(marker)!r}, 'a') as f:\n    f.write(__name__ + '\\n')\n"
        )


def run_probe(tmp_path: Path, extra_path: list[Path] = ()) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith("SPEC_COMPAT_")}
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), *map(str, extra_path)])
    env.pop("PYTHONSTARTUP", None)
    proc = subprocess.run(
        [sys.executable, "-c", PROBE.format(heavy=set(HEAVY))],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=60,
    )
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_import_spec_compat_leaves_heavy_packages_unimported(tmp_path):
    out = run_probe(tmp_path)
    assert Path(out["file"]).resolve().is_relative_to(ROOT / "spec_compat")
    assert out["heavy"] == []
    assert out["records"], "import spec_compat decides the registry"


def test_import_spec_compat_does_not_import_even_when_importable(tmp_path):
    """With importable stand-ins for every heavy package (whether or not the real
    ones are installed here), none of them is imported."""
    stubs = tmp_path / "stubs"
    marker = tmp_path / "imported.txt"
    write_stubs(stubs, marker)
    out = run_probe(tmp_path, [stubs])
    assert out["heavy"] == []
    assert not marker.exists(), marker.read_text()


def test_stub_marker_works(tmp_path):
    """The probe above would notice an import: check the stand-ins themselves."""
    stubs = tmp_path / "stubs"
    marker = tmp_path / "imported.txt"
    write_stubs(stubs, marker, ["torch"])
    env = {k: v for k, v in os.environ.items() if not k.startswith("SPEC_COMPAT_")}
    env["PYTHONPATH"] = str(stubs)
    subprocess.run([sys.executable, "-c", "import torch"], cwd=tmp_path, env=env, check=True, timeout=60)
    assert marker.read_text() == "torch\n"
