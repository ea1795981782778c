"""speculators 0.5-0.7 as clients of the backported server (vLLM 0.15/0.16).

Before 0.8 speculators had no ``generate-offline-data`` command: its repository's
``scripts/data_generation_offline.py`` drives the library client
``speculators.data_generation.vllm_client.generate_hidden_states_async`` and reads each file as
soon as the request returns.  What differs from 0.9.0 and is exercised here, with the release's
own client function and its defaults:

* 0.5.0: a 15 s timeout per request, the prompt as ``token_ids``, ``hidden_states_path`` read
  without a None check, no ``.lock`` protocol: the file must be complete when the answer arrives;
* 0.6/0.7: a ``client_item`` dict, ``wait_for_lock_async`` on ``<path>.lock`` when one exists
  (the stock script does exactly that), 120 s timeout; 0.7 also ships ``check_hidden_states``,
  run on every file.

Rows are compared with a transformers forward of the same weights (every id, every row).  From
0.8 on the CLI is the client (test_speculators_client.py); this file skips there.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from test_speculators_client import LAYER_IDS, _compare, _rows, start_extraction_server

#: runs in the client environment: the release's own client, 32 requests in flight
_CLIENT = r"""
import asyncio, inspect, json, os, sys
from importlib.metadata import version
import openai
from speculators.data_generation import vllm_client as vc

url, model, rows_path, out_path = sys.argv[1:5]
rows = json.load(open(rows_path))
takes_item = "client_item" in inspect.signature(vc.generate_hidden_states_async).parameters

async def main():
    client = openai.AsyncOpenAI(base_url=url, api_key="EMPTY", max_retries=0)
    sem = asyncio.Semaphore(32)
    locks = []

    async def one(ids):
        async with sem:
            # the release's default timeout and retries
            path = await vc.generate_hidden_states_async(client, model, {"input_ids": ids} if takes_item else ids)
            lock = path + ".lock" if isinstance(path, str) else None
            if lock and os.path.exists(lock) and hasattr(vc, "wait_for_lock_async"):
                locks.append(lock)
                await vc.wait_for_lock_async(lock)
            return path

    paths = await asyncio.gather(*(one(r) for r in rows))
    checked = 0
    try:
        from speculators.data_generation.offline import check_hidden_states
    except ImportError:
        check_hidden_states = None
    if check_hidden_states is not None:
        from safetensors.torch import load_file
        for path, ids in zip(paths, rows):
            check_hidden_states(load_file(path), ids)
            checked += 1
    json.dump({"speculators": version("speculators"), "paths": paths, "item_api": takes_item,
               "timeout": vc.DEFAULT_REQUEST_TIMEOUT, "lock_waits": len(locks), "checked": checked},
              open(out_path, "w"))

asyncio.run(main())
"""


@pytest.fixture(scope="module")
def client_release(client_python) -> tuple[int, ...]:
    from packaging.version import Version

    proc = subprocess.run([client_python, "-c", "from importlib.metadata import version; print(version('speculators'))"],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return Version(proc.stdout.strip()).release


@pytest.mark.parametrize("fixture", ["llama", "kimi-k25"])
def test_script_era_client_reads_complete_reference_rows(fixture_model, serve, client_python, client_release,
                                                         tmp_path, fixture):
    if client_release >= (0, 8):
        pytest.skip(f"speculators {'.'.join(map(str, client_release))} generates data with its CLI "
                    "(test_speculators_client.py)")
    model = fixture_model(fixture)
    storage = tmp_path / "hidden_states"
    # long prompts over several chunked-prefill steps
    server = start_extraction_server(serve, fixture, model, storage, "--max-num-batched-tokens", "64")
    rows = _rows(seed=11)
    (tmp_path / "rows.json").write_text(json.dumps(rows))
    out = tmp_path / "client.json"
    proc = subprocess.run([client_python, "-c", _CLIENT, server.url + "/v1", str(model), str(tmp_path / "rows.json"),
                           str(out)], capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, (proc.stderr[-4000:], server.tail())
    res = json.loads(out.read_text())
    print({k: v for k, v in res.items() if k != "paths"})
    assert res["item_api"] == (client_release >= (0, 6))
    paths = res["paths"]
    assert all(isinstance(p, str) for p in paths), paths[:3]
    files = [Path(p) for p in paths]
    assert len(set(files)) == len(rows) and all(f.parent == storage for f in files), files[:3]
    worst = _compare(model, files, rows)
    print(f"speculators {res['speculators']}: {len(files)} files, {sum(map(len, rows))} rows; "
          f"max |diff| / max |ref| per id {LAYER_IDS}: {['%.1e' % w for w in worst]}")
    if client_release >= (0, 7):
        assert res["checked"] == len(rows)
