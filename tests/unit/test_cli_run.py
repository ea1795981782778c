"""`spec-compat run`: __main__ semantics, arguments, exit codes and signals."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _run(tmp_path, body: str, *args: str) -> subprocess.CompletedProcess:
    script = tmp_path / "script.py"
    script.write_text(textwrap.dedent(body))
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    env.pop("SPEC_COMPAT_DISABLE", None)
    return subprocess.run([sys.executable, "-m", "spec_compat", "run", str(script), *args],
                          capture_output=True, text=True, env=env, cwd=str(tmp_path), timeout=60)


def test_main_guard_argv_and_registry_applied(tmp_path):
    proc = _run(tmp_path, """
        import sys
        if __name__ == "__main__":
            import spec_compat
            assert spec_compat.records(), "registry not applied"
            print("ARGV", sys.argv[1:], sys.argv[0].endswith("script.py"))
    """, "a", "--b", "c")
    assert proc.returncode == 0, proc.stderr
    assert "ARGV ['a', '--b', 'c'] True" in proc.stdout


def test_exit_code_propagates(tmp_path):
    assert _run(tmp_path, "import sys\nsys.exit(7)\n").returncode == 7
    proc = _run(tmp_path, "raise ValueError('boom')\n")
    assert proc.returncode == 1 and "ValueError: boom" in proc.stderr


def test_signal_propagates(tmp_path):
    proc = _run(tmp_path, "import os, signal\nos.kill(os.getpid(), signal.SIGTERM)\n")
    assert proc.returncode == -signal.SIGTERM


def test_missing_script_is_a_clear_error(tmp_path):
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    proc = subprocess.run([sys.executable, "-m", "spec_compat", "run", str(tmp_path / "nope.py")],
                          capture_output=True, text=True, env=env)
    assert proc.returncode == 2 and "no such script" in proc.stderr


def test_malformed_switch_is_a_clear_error(tmp_path):
    env = dict(os.environ, PYTHONPATH=str(ROOT), SPEC_COMPAT_DISABLE="no-such-patch")
    proc = subprocess.run([sys.executable, "-m", "spec_compat", "patches"], capture_output=True, text=True, env=env)
    assert proc.returncode != 0
    assert "SPEC_COMPAT_DISABLE" in proc.stderr and "no-such-patch" in proc.stderr
