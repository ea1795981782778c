"""One of two extraction servers killed mid-run and restarted, with hs-connectors' Mooncake backend
(vLLM 0.15/0.16 + spec-compat, a real ``mooncake_master``).

The client sends the rows over both servers, four in flight, each a full round trip as
``speculators train --on-missing generate`` makes it: speculators' request (``generate_hidden_states``,
retried with its backoff) and hs-connectors' reader (``MooncakeTransfer.get_generated``); a round
trip that fails after its answer (the sample lived in the dead server's segment) is made again; a
sample read, then not removed because the store went away, counts as read.
Once a third of the rows are back, the second server's process tree is killed (SIGKILL) and the
server is started again on the same port.

Checked: every row arrives exactly once (one sample per row, its token ids, no row twice), equal
to a transformers fp32 forward within the file backend's tolerance; requests were in flight when
the server died (some took more than one attempt) and the restarted server served rows again.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path

from mooncake_client import ROUND_TRIPS  # tests/support
from test_mooncake import SIZES, _server, kv_config, mooncake_master  # noqa: F401 (a fixture)
from test_speculators_client import _compare, _rows
from test_speculators_pipeline import _client_env

def _kill_tree(pid: int) -> None:
    """SIGKILL ``pid`` and every process below it (the API server, its engine core, workers)."""
    children = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                stat = Path(f"/proc/{entry}/stat").read_text()
            except OSError:
                continue
            if int(stat.rsplit(")", 1)[1].split()[1]) == pid:
                children.append(int(entry))
    os.kill(pid, signal.SIGKILL)
    for child in children:
        _kill_tree(child)


def test_every_sample_arrives_once_when_a_server_dies_and_comes_back(fixture_model, client_python, mooncake_master,  # noqa: F811
                                                                      tmp_path):
    import sys

    model = fixture_model("llama")
    kv = kv_config(client_python, mooncake_master)
    rows = _rows(seed=17) + _rows(seed=19)  # 80 rows: long enough to be cut in the middle
    first = _server(model, kv, False, tmp_path / "server-a.log")
    second = _server(model, kv, False, tmp_path / "server-b.log")
    restarted = None
    try:
        first.wait_ready()
        second.wait_ready()
        out = tmp_path / "read"
        out.mkdir()
        job = tmp_path / "job.json"
        job.write_text(json.dumps({"rows": rows, "endpoints": [first.url + "/v1", second.url + "/v1"], "out": str(out),
                                   "train_args": ["--mooncake-master", mooncake_master, *SIZES]}))
        client = subprocess.Popen([client_python, "-c", ROUND_TRIPS, str(job)], stdout=subprocess.PIPE,
                                  stderr=subprocess.PIPE, text=True, env=_client_env())
        deadline = time.time() + 600
        while len(list(out.glob("hs_*.safetensors"))) < len(rows) // 3:
            assert client.poll() is None, client.communicate()[1][-4000:]
            assert time.time() < deadline, "the client made no progress"
            time.sleep(0.2)
        killed_at = time.time()
        _kill_tree(second.proc.pid)
        second.stop()
        # the same port: the client's endpoint list does not change
        module = sys.modules[type(second).__module__]
        original = module.free_port
        module.free_port = lambda: second.port
        try:
            restarted = _server(model, kv, False, tmp_path / "server-b-restarted.log")
        finally:
            module.free_port = original
        restarted.wait_ready()
        back_at = time.time()
        stdout, stderr = client.communicate(timeout=900)
        assert client.returncode == 0, (stderr[-4000:], restarted.tail(3000))
    finally:
        for s in (first, second, restarted):
            if s is not None:
                s.stop()
    done = json.loads(stdout.split("SPEC_COMPAT_RESULT ", 1)[1])
    assert sorted(d["row"] for d in done) == list(range(len(rows)))  # each row once
    assert len({d["handle"] for d in done}) == len(rows)
    retried = [d for d in done if d["round_trips"] > 1]
    after = [d for d in done if d["endpoint"] == 1 and d["at"] > back_at]
    print(f"restart: {len(rows)} rows, killed at {len(rows) // 3}+ done; {len(retried)} rows needed another round "
          f"trip, stderr retries {stderr.count('Retrying in')}; restarted server served {len(after)} rows "
          f"({back_at - killed_at:.0f} s down)")
    assert after, "the restarted server served no row"
    assert retried or "Retrying in" in stderr, "no request was in flight when the server died"
    _compare(model, [out / f"hs_{d['row']}.safetensors" for d in sorted(done, key=lambda d: d["row"])], rows)
