"""speculators 0.5-0.7's own ``scripts/launch_vllm.py`` on the Kimi-K2.5 fixture, under ``spec-compat run``.

The stock script reads the model's config (``AutoConfig.from_pretrained(args.model)``, no
``trust_remote_code``) before it ``exec``s ``vllm serve``; the fixture's config is remote code.  With
spec-compat (``launch-vllm-trust-remote-code``) the script serves the fixture when the user gives vLLM
``-- --trust-remote-code``, and still stops at transformers' prompt without it (consent is the user's);
with only that patch disabled it stops at the prompt even with the flag.  stdin is closed, as under a
job scheduler: the prompt reads EOF ("Do you wish to run the custom code? [y/N]", ``EOFError``), which
transformers turns into ``ValueError: The repository ... contains custom code ...``.

The script comes from the speculators clone at the newest tag of the installed release's line
(test_script_era_prepare.py: ``v0.5.0``, ``v0.6.0.1``, ``v0.7.0.1``); without a clone the test skips.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from proof_runs import proof_cases  # tests/support (on sys.path: tests/conftest.py)
from test_script_era_prepare import SPECULATORS_GIT, _release, _tag_for
from test_speculators_client import BLOCK, LAYER_IDS, _post, _written

PID = "launch-vllm-trust-remote-code"
PROMPT = "Do you wish to run the custom code? [y/N]"


@pytest.fixture(scope="module")
def launch_script(tmp_path_factory) -> Path:
    release = _release()
    if not release or not ((0, 5) <= release < (0, 8)):
        pytest.skip("scripts/launch_vllm.py reads the config bare in speculators 0.5-0.7 "
                    f"(installed: {'.'.join(map(str, release)) or 'none'})")
    if not SPECULATORS_GIT.exists():
        pytest.skip(f"no speculators clone at {SPECULATORS_GIT} (git clone --bare "
                    "https://github.com/vllm-project/speculators there, or set SPEC_COMPAT_SPECULATORS_GIT)")
    tag = _tag_for(release)
    out = tmp_path_factory.mktemp("stock") / tag
    out.mkdir()
    archive = subprocess.run(["git", "-C", str(SPECULATORS_GIT), "archive", f"refs/tags/{tag}", "scripts/launch_vllm.py"],
                             capture_output=True, check=True).stdout
    subprocess.run(["tar", "-x", "-C", str(out)], input=archive, check=True)
    print(f"speculators {'.'.join(map(str, release))}: stock launch_vllm.py of {tag}")
    return out / "scripts" / "launch_vllm.py"


def _port() -> int:
    from conftest import free_port  # tests/server/conftest.py

    return free_port()


def _command(script: Path, model: Path, storage: Path, port: int, *vllm: str) -> list[str]:
    """``spec-compat run launch_vllm.py MODEL ... -- VLLM_ARGS`` as speculators' docs give it."""
    return [sys.executable, "-m", "spec_compat", "run", str(script), str(model), "--hidden-states-path", str(storage),
            "--target-layer-ids", *map(str, LAYER_IDS[:-1]), "--", "--port", str(port), "--host", "127.0.0.1",
            "--max-model-len", "512", "--dtype", "float32", "--block-size", str(BLOCK), *vllm]


def _env(disable: str) -> dict[str, str]:
    env = dict(os.environ, HF_HUB_OFFLINE="1", VLLM_MLA_DISABLE="1")  # MLA as plain attention on CPU
    env.pop("SPEC_COMPAT_DISABLE", None)
    if disable:
        env["SPEC_COMPAT_DISABLE"] = disable
    return env


def _stops(script: Path, model: Path, storage: Path, disable: str, *vllm: str) -> str:
    """The launch stops before ``vllm serve`` starts: its output (stdout and stderr)."""
    proc = subprocess.run(_command(script, model, storage, _port(), *vllm), stdin=subprocess.DEVNULL,
                          capture_output=True, text=True, timeout=300, env=_env(disable), cwd=str(script.parent))
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0, out[-4000:]
    assert "Running command:" not in proc.stdout and PROMPT in out and "EOFError" in out, out[-4000:]
    return out


def _serves(script: Path, model: Path, storage: Path, log: Path) -> str:
    """The launch execs ``vllm serve``, which answers a completion and writes its hidden states: its log."""
    port = _port()
    url = f"http://127.0.0.1:{port}"
    with open(log, "w") as out:
        proc = subprocess.Popen(_command(script, model, storage, port, "--trust-remote-code"), stdin=subprocess.DEVNULL,
                                stdout=out, stderr=subprocess.STDOUT, env=_env(""), cwd=str(script.parent))
    try:
        deadline = time.time() + 420
        while True:
            assert proc.poll() is None, f"the launch exited with {proc.returncode}:\n{log.read_text()[-6000:]}"
            assert time.time() < deadline, f"vllm serve not ready after 420 s:\n{log.read_text()[-6000:]}"
            try:
                with urllib.request.urlopen(url + "/v1/models", timeout=5) as r:
                    if r.status == 200:
                        break
            except OSError:
                time.sleep(2)
        ids = list(range(5, 45))
        status, body = _post(url + "/v1/completions", {"model": str(model), "prompt": ids, "max_tokens": 1})
        assert status == 200, (body, log.read_text()[-4000:])
        deadline = time.time() + 60
        files: list[Path] = []
        while time.time() < deadline:
            files = [f for f in storage.glob("*.safetensors") if _written(str(f))]
            if files:
                break
            time.sleep(0.5)
        assert len(files) == 1, (sorted(storage.iterdir()) if storage.exists() else "no directory", body)
        from safetensors.torch import load_file

        data = load_file(str(files[0]))
        assert data["token_ids"].tolist() == ids, data["token_ids"]
        assert tuple(data["hidden_states"].shape[:2]) == (len(ids), len(LAYER_IDS)), data["hidden_states"].shape
    finally:
        if proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(60)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(30)
    return log.read_text(errors="replace")


@pytest.mark.parametrize("pid", proof_cases("test_stock_launch_script_stops_only_without_this_patch"))
def test_stock_launch_script_stops_only_without_this_patch(launch_script, fixture_model, tmp_path, prove, pid):
    proof = prove(pid)
    model = fixture_model("kimi-k25")
    storage = tmp_path / "hidden_states"
    # the user's consent, not spec-compat's: without --trust-remote-code the patched launch stops at the prompt
    refused = _stops(launch_script, model, storage, proof.baseline)
    assert f"spec_compat[{PID}]" not in refused, refused[-4000:]
    # stock (only this patch off): the same stop, the flag given to vLLM notwithstanding
    proof.assert_symptom(_stops(launch_script, model, storage, proof.disable, "--trust-remote-code"))
    # patched, with the flag: vllm serve runs, answers and writes the request's hidden states
    log = _serves(launch_script, model, storage, tmp_path / "serve.log")
    proof.assert_absent(log)
    assert "Running command:" in log and " --trust-remote-code" in log, log[-4000:]
