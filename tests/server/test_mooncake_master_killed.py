"""hs-connectors' Mooncake backend with its master killed mid-run and started again (vLLM 0.15/0.16 +
spec-compat, a real ``mooncake_master``: ``mooncake-answer-after-put``).

The connector answers a request with its sample's handle and puts the sample afterwards.  With the
master dead the put fails and so does the error marker: stock, the request was answered HTTP 200
with the handle of a sample no store holds.  Patched, the answer waits for the sample: HTTP 503
naming the store's master, the server keeps serving, and once the master is back (every Mooncake
client finds a restarted master within seconds; what the dead one held is gone) the same request
is answered and its sample read back.

End to end: rows over one server with the client's round trips (speculators' request with its
backoff, hs-connectors' reader, a round trip made again when its sample was lost with the master);
the master is killed once a third of the rows are back and started again on its port 10 s later:
every row arrives exactly once and equals a transformers fp32 forward.
"""

from __future__ import annotations

import json
import random
import re
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from mooncake_client import ROUND_TRIPS  # tests/support (on sys.path: tests/conftest.py)
from proof_runs import proof_cases  # tests/support
from test_mooncake import SIZES, _mooncake_dir, _server, kv_config
from test_speculators_client import _compare, _post, _rows
from test_speculators_pipeline import _client_env

PID = "mooncake-answer-after-put"
#: how long the master stays down in the end-to-end run
DOWN_S = 10.0

#: whether the store holds each handle (a client of the server environment's Mooncake, no segment)
_HOLDS = r"""
import json, sys
from mooncake.store import MooncakeDistributedStore
store = MooncakeDistributedStore()
assert store.setup("127.0.0.1", "P2PHANDSHAKE", 0, 16 << 20, "tcp", "", sys.argv[1]) == 0
print("SPEC_COMPAT_RESULT " + json.dumps([store.is_exist(h) for h in sys.argv[2:]]))
"""


class Master:
    """A real ``mooncake_master`` on one port, killed (SIGKILL) and started again on it."""

    def __init__(self, log: Path) -> None:
        from conftest import free_port  # tests/server/conftest.py

        self.port, self.metrics, self.log = free_port(), free_port(), log
        self.address = f"127.0.0.1:{self.port}"
        self.proc: subprocess.Popen | None = None

    def start(self) -> Master:
        with open(self.log, "a") as out:
            self.proc = subprocess.Popen([str(_mooncake_dir() / "mooncake_master"), f"--rpc_port={self.port}",
                                          "--rpc_address=127.0.0.1", f"--metrics_port={self.metrics}"],
                                         stdout=out, stderr=subprocess.STDOUT)
        deadline = time.time() + 60
        while True:
            assert self.proc.poll() is None, f"mooncake_master exited:\n{self.log.read_text()[-3000:]}"
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=1).close()
                return self
            except OSError:
                assert time.time() < deadline, f"mooncake_master does not listen:\n{self.log.read_text()[-3000:]}"
                time.sleep(0.2)

    def capacity(self) -> int:
        """``master_total_capacity_bytes`` of the master's metrics: the segments its clients mounted."""
        import urllib.request

        with urllib.request.urlopen(f"http://127.0.0.1:{self.metrics}/metrics", timeout=5) as r:
            text = r.read().decode()
        return int(next(ln.split()[1] for ln in text.splitlines() if ln.startswith("master_total_capacity_bytes ")))

    def wait_mounted(self, timeout: float = 60) -> float:
        """Seconds until a client mounted a segment on this master (a restarted one starts with none)."""
        t0 = time.time()
        while self.capacity() == 0:
            assert time.time() < t0 + timeout, f"no segment mounted on the master {timeout:g} s after its start"
            time.sleep(0.2)
        return time.time() - t0

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(30)


@pytest.fixture
def master(tmp_path, monkeypatch):
    from spec_compat import REGISTRY
    from spec_compat.core.versions import installed_version

    if installed_version("hs-connectors") is None:
        pytest.skip("hs-connectors is not installed in the server environment (speculators 0.9.0 cells install it)")
    needed, why = REGISTRY.get(PID).needed()
    if not needed:
        pytest.skip(f"{PID} is not needed here ({why})")
    # hs-connectors names the host a client registers its segment under from this variable
    monkeypatch.setenv("MOONCAKE_LOCAL_HOSTNAME", "127.0.0.1")
    m = Master(tmp_path / "master.log").start()
    yield m
    m.kill()


def _own_lines(text: str) -> str:
    """``text`` without Mooncake's glog lines (``I1206 12:00:00.000 ...``), which drown a client's own."""
    return "\n".join(ln for ln in text.splitlines() if not re.match(r"[IWEF]\d{4} \d\d:\d\d:\d\d", ln))


def _request(server, model: Path, ids: list[int]) -> tuple[int, dict]:
    return _post(server.url + "/v1/completions", {"model": str(model), "prompt": ids, "max_tokens": 1,
                                                  "return_token_ids": True}, timeout=300)


def _holds(address: str, handles: list[str]) -> list[int]:
    proc = subprocess.run([sys.executable, "-c", _HOLDS, address, *handles], capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.split("SPEC_COMPAT_RESULT ", 1)[1])


def _wait_held(master: Master, handle: str, timeout: float = 120) -> None:
    deadline = time.time() + timeout
    while _holds(master.address, [handle]) != [1]:
        assert time.time() < deadline, f"sample {handle} not in the store {timeout:g} s after its answer"
        time.sleep(1)


def _after_restart(master: Master, server, model: Path, ids: list[int]) -> tuple[int, dict, list[int]]:
    """One good request, the master killed, the same request again; then the master started again.
    Returns the second answer and whether the restarted store holds the handle it names."""
    status, body = _request(server, model, ids[:20])
    assert status == 200 and "handle" in body.get("kv_transfer_params", {}), (status, body)
    _wait_held(master, body["kv_transfer_params"]["handle"])  # the worker has joined the store: mid-run
    master.kill()
    status, body = _request(server, model, ids)
    master.start()
    handle = (body.get("kv_transfer_params") or {}).get("handle")
    return status, body, (_holds(master.address, [handle]) if handle else [])


def _report(status: int, body: dict, held: list[int]) -> str:
    kv = body.get("kv_transfer_params") or {}
    if status == 200 and kv.get("handle") and held == [0]:
        return f"HTTP 200 with the handle of a sample the store does not hold: {kv['handle']}"
    return f"HTTP {status}: {json.dumps(body)[:600]} (held {held})"


@pytest.mark.parametrize("pid", proof_cases("test_answers_unstored_samples_only_without_this_patch"))
def test_answers_unstored_samples_only_without_this_patch(fixture_model, client_python, master, tmp_path, prove, pid):
    model = fixture_model("llama")
    ids = [random.Random(7).randrange(1, 250) for _ in range(70)]
    kv = kv_config(client_python, master.address)
    proof = prove(pid)

    stock = _server(model, kv, False, tmp_path / "stock.log", proof.disable)
    try:
        stock.wait_ready()
        report = _report(*_after_restart(master, stock, model, ids))
    finally:
        stock.stop()
    proof.assert_symptom(report, report=True)

    server = _server(model, kv, False, tmp_path / "patched.log", proof.baseline)
    try:
        server.wait_ready()
        status, body, _ = _after_restart(master, server, model, ids)
        report = _report(status, body, [])
        proof.assert_absent(report, report=True)
        message = body.get("error", {}).get("message", "")
        assert status == 503 and body["error"]["type"] == "ServiceUnavailableError", report
        assert f"spec_compat[{PID}]: the Mooncake store (master {master.address})" in message, report
        # the server kept serving; once it has found the restarted master again, the same request is
        # answered and stored
        master.wait_mounted()
        status, body = _request(server, model, ids)
        assert status == 200, (status, body, server.tail(3000))
        assert _holds(master.address, [body["kv_transfer_params"]["handle"]]) == [1]
    finally:
        server.stop()


def test_every_sample_arrives_once_when_the_master_dies_and_comes_back(fixture_model, client_python, master,
                                                                      tmp_path):
    model = fixture_model("llama")
    kv = kv_config(client_python, master.address)
    rows = _rows(seed=23) + _rows(seed=29)  # 80 rows
    server = _server(model, kv, False, tmp_path / "server.log")
    try:
        server.wait_ready()
        out = tmp_path / "read"
        out.mkdir()
        job = tmp_path / "job.json"
        job.write_text(json.dumps({"rows": rows, "endpoints": [server.url + "/v1"], "out": str(out),
                                   "train_args": ["--mooncake-master", master.address, *SIZES]}))
        client = subprocess.Popen([client_python, "-c", ROUND_TRIPS, str(job)], stdout=subprocess.PIPE,
                                  stderr=subprocess.PIPE, text=True, env=_client_env())
        deadline = time.time() + 600
        while len(list(out.glob("hs_*.safetensors"))) < len(rows) // 3:
            assert client.poll() is None, client.communicate()[1][-4000:]
            assert time.time() < deadline, "the client made no progress"
            time.sleep(0.2)
        master.kill()
        killed_at = time.time()
        time.sleep(DOWN_S)
        master.start()
        back_at = time.time()
        remount_s = master.wait_mounted()
        stdout, stderr = client.communicate(timeout=900)
        (tmp_path / "client.log").write_text(stderr)
        assert client.returncode == 0, (_own_lines(stderr)[-4000:], server.tail(3000))
        assert server.proc.poll() is None, server.tail(3000)  # the server kept serving
        log = server.tail(200000)
    finally:
        server.stop()
    done = json.loads(stdout.split("SPEC_COMPAT_RESULT ", 1)[1])
    assert sorted(d["row"] for d in done) == list(range(len(rows)))  # each row once
    assert len({d["handle"] for d in done}) == len(rows)
    named = stderr.count(f"the Mooncake store (master {master.address})")
    answered = {code: log.count(f'HTTP/1.1" {code} ') for code in (503, 504)}
    after = [d for d in done if d["at"] > back_at]
    retried = [d for d in done if d["round_trips"] > 1]
    print(f"master killed after {len(rows) // 3}+ of {len(rows)} rows, down {back_at - killed_at:.1f} s: "
          f"{named} answers named the store, {stderr.count('Retrying in')} request retries, {len(retried)} rows "
          f"needed another round trip, {len(after)} rows served after the master came back (a segment mounted on it "
          f"{remount_s:.1f} s after its start); server log: "
          f"{answered[503]} x HTTP 503, {answered[504]} x HTTP 504")
    assert named, ("no answer named the store: no request met the dead master", _own_lines(stderr)[-3000:])
    assert after, "no row was served after the master came back"
    _compare(model, [out / f"hs_{d['row']}.safetensors" for d in sorted(done, key=lambda d: d["row"])], rows)


#: the smallest segment Mooncake mounts; the only segment of the store in this test
FULL_SEGMENT = 16 << 20

#: remove samples from the store (a client of the server environment's Mooncake, no segment)
_REMOVE = r"""
import sys
from mooncake.store import MooncakeDistributedStore
store = MooncakeDistributedStore()
assert store.setup("127.0.0.1", "P2PHANDSHAKE", 0, 16 << 20, "tcp", "", sys.argv[1]) == 0
for h in sys.argv[2:]:
    assert store.remove(h, force=True) == 0, h
"""


def test_a_full_store_answers_an_error_and_no_partial_sample(fixture_model, client_python, master, tmp_path):
    """The server's segment is the whole store (16 MiB; a 400-token Llama sample in fp32 is ~2 MB):
    requests are answered 200 until it is full, then HTTP 500 naming the store and why (the worker's
    error marker, or -- where the full store refused the marker too -- the API server's probe), with
    no object under the handle; once a client removes what it read, the server stores again."""
    model = fixture_model("llama")
    kv = kv_config(client_python, master.address)
    kv["kv_connector_extra_config"]["mooncake"]["global_segment_size"] = FULL_SEGMENT
    rng = random.Random(31)
    server = _server(model, kv, False, tmp_path / "server.log")
    try:
        server.wait_ready()
        stored, answers = [], []
        for _ in range(16):
            status, body = _request(server, model, [rng.randrange(1, 250) for _ in range(400)])
            answers.append((status, body))
            if status != 200:
                break
            stored.append(body["kv_transfer_params"]["handle"])
        status, body = answers[-1]
        message = body.get("error", {}).get("message", "")
        assert stored and status == 500, (len(stored), status, body)
        # the worker's marker names the refused put; where the full store refused the marker too, the
        # API server's 1-byte probe says the store has no room
        assert f"spec_compat[{PID}]: " in message, message
        assert f"the Mooncake store (master {master.address})" in message, message
        assert "no space left in the store's mounted segments (the store is full" in message, message
        by_marker = "could not put sample " in message
        assert by_marker or "the store has no room for a 1-byte object" in message, message
        if by_marker:
            assert "put_from failed" in message and "status=-200" in message, message
        failed = message.split("could not put sample " if by_marker else ": sample ", 1)[1].split(" ", 1)[0]
        assert _holds(master.address, [failed, *stored]) == [0] + [1] * len(stored)  # nothing partial
        proc = subprocess.run([sys.executable, "-c", _REMOVE, master.address, *stored[:3]], capture_output=True,
                              text=True, timeout=300)
        assert proc.returncode == 0, proc.stderr[-3000:]
        status, body = _request(server, model, [rng.randrange(1, 250) for _ in range(400)])
        assert status == 200, (status, body)
        assert _holds(master.address, [body["kv_transfer_params"]["handle"]]) == [1]
        print(f"store full after {len(stored)} samples of 400 tokens in a {FULL_SEGMENT >> 20} MiB segment: "
              f"{message}")
    finally:
        server.stop()
