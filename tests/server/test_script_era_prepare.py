"""speculators 0.5-0.7's own repo scripts, end to end from raw Kimi-K2.5 chats into the backported server.

A new user of those releases runs ``scripts/prepare_data.py`` (chat template + offset-based loss
mask, on the client) and then ``scripts/data_generation_offline.py`` against ``vllm serve`` with the
``extract_hidden_states`` method.  On the Kimi-K2.5 fixture the prepare step drops every chat
without ``slow-tokenizer-offsets`` (the tokenizer is a Python one); its proof is
tests/unit/test_chat_offsets.py.  Here, with spec-compat (``spec-compat run``), both stock scripts run
unmodified: the prepared rows are the chat template's (masked on the assistant contents), and every
file the data script keeps holds the reference rows of its prepared sample.

The scripts are not in speculators' wheel: they come from a speculators clone
(``SPEC_COMPAT_SPECULATORS_GIT``, default ``~/.cache/spec-compat/speculators.git``), at the newest tag
of the installed release's line that is not newer than it (0.7.0.2 -> ``v0.7.0.1``, 0.6.0.2 ->
``v0.6.0.1``: the later post-releases have no tag).  Without a clone the test is skipped, saying so.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from chat_rows import DEMO_CHATS, assert_rows_follow_the_template
from test_speculators_client import LAYER_IDS, _compare, start_extraction_server

SPECULATORS_GIT = Path(os.environ.get("SPEC_COMPAT_SPECULATORS_GIT",
                                      Path.home() / ".cache" / "spec-compat" / "speculators.git"))

#: the prepared dataset's rows, read in the environment under test
_READ_PREPARED = r"""
import json, sys
from datasets import load_from_disk
ds = load_from_disk(sys.argv[1])
print(json.dumps({"input_ids": [list(map(int, r)) for r in ds["input_ids"]],
                  "loss_mask": [list(map(int, r)) for r in ds["loss_mask"]]}))
"""


def _release() -> tuple[int, ...]:
    from packaging.version import Version

    from spec_compat.core.versions import installed_version

    v = installed_version("speculators")
    return Version(v).release if v else ()


def _tag_for(release: tuple[int, ...]) -> str:
    """The newest ``v*`` tag of the release's line (same major.minor) not newer than it."""
    from packaging.version import InvalidVersion, Version

    tags = subprocess.run(["git", "-C", str(SPECULATORS_GIT), "tag", "--list", "v*"], capture_output=True,
                          text=True, check=True).stdout.split()
    line = []
    for tag in tags:
        try:
            v = Version(tag[1:])
        except InvalidVersion:
            continue
        if not v.local and v.release[:2] == release[:2] and v.release <= release:
            line.append((v, tag))
    if not line:
        pytest.fail(f"{SPECULATORS_GIT} has no tag of speculators {'.'.join(map(str, release[:2]))}.x "
                    f"up to {'.'.join(map(str, release))}")
    return max(line)[1]


@pytest.fixture(scope="module")
def stock_scripts(tmp_path_factory) -> Path:
    release = _release()
    if not release or not ((0, 5) <= release < (0, 8)):
        pytest.skip("the repo scripts prepare_data.py + data_generation_offline.py are speculators 0.5-0.7's "
                    f"way (installed: {'.'.join(map(str, release)) or 'none'})")
    if not SPECULATORS_GIT.exists():
        pytest.skip(f"no speculators clone at {SPECULATORS_GIT} (git clone --bare "
                    "https://github.com/vllm-project/speculators there, or set SPEC_COMPAT_SPECULATORS_GIT)")
    tag = _tag_for(release)
    out = tmp_path_factory.mktemp("stock") / tag
    out.mkdir()
    archive = subprocess.run(["git", "-C", str(SPECULATORS_GIT), "archive", f"refs/tags/{tag}", "scripts"],
                             capture_output=True, check=True).stdout
    subprocess.run(["tar", "-x", "-C", str(out)], input=archive, check=True)
    print(f"speculators {'.'.join(map(str, release))}: stock scripts of {tag}")
    return out / "scripts"


def _spec_compat_run(script: Path, *args: str, timeout: int = 1200) -> subprocess.CompletedProcess:
    env = dict(os.environ, HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1")
    env.pop("SPEC_COMPAT_DISABLE", None)
    return subprocess.run([sys.executable, "-m", "spec_compat", "run", str(script), *args], capture_output=True,
                          text=True, timeout=timeout, env=env, cwd=str(script.parent.parent))


def _accepts(script: Path, flag: str) -> bool:
    return flag in script.read_text()


def test_stock_scripts_from_raw_kimi_chats_write_the_reference_rows(stock_scripts, fixture_model, serve, tmp_path):
    model = fixture_model("kimi-k25")
    prepare = stock_scripts / "prepare_data.py"
    prepared = tmp_path / "prepared"
    args = ["--model", str(model), "--data", str(DEMO_CHATS), "--output", str(prepared), "--seq-length", "1024"]
    if _accepts(prepare, "--trust-remote-code"):  # 0.6+ (0.5 trusts the checkpoint's code itself)
        args.append("--trust-remote-code")
    proc = _spec_compat_run(prepare, *args)
    assert proc.returncode == 0, proc.stderr[-4000:]
    read = subprocess.run([sys.executable, "-c", _READ_PREPARED, str(prepared)], capture_output=True, text=True,
                          timeout=300)
    assert read.returncode == 0, read.stderr[-3000:]
    rows = json.loads(read.stdout.splitlines()[-1])
    assert_rows_follow_the_template(model, rows, DEMO_CHATS, tmp_path / "template")

    storage = tmp_path / "hidden_states"
    # several chunked-prefill steps per chat (each ~150 tokens), 32 requests in flight
    server = start_extraction_server(serve, "kimi-k25", model, storage, "--max-num-batched-tokens", "64")
    out = tmp_path / "generated"
    data = stock_scripts / "data_generation_offline.py"
    proc = _spec_compat_run(data, "--model", str(model), "--endpoint", server.url + "/v1", "--preprocessed-data",
                            str(prepared), "--output", str(out), "--validate-outputs", "--fail-on-error")
    assert proc.returncode == 0, (proc.stderr[-4000:], server.tail())
    files = [out / f"hs_{i}.safetensors" for i in range(len(rows["input_ids"]))]
    missing = [f.name for f in files if not f.is_file()]
    assert not missing, (missing[:5], sorted(p.name for p in out.iterdir())[:5])
    worst = _compare(model, files, rows["input_ids"])
    print(f"{stock_scripts.parent.name}: {len(files)} Kimi-K2.5 chats, {sum(map(len, rows['input_ids']))} rows; "
          f"max |diff| / max |ref| per id {LAYER_IDS}: {['%.1e' % w for w in worst]}")
