"""The performance patches on the real engine.  ``capture-handoff-shm``: the worker hands
captured rows over through /dev/shm segments (a descriptor in the reply, not pickled tensors), the
driver's rows are byte-identical to the pickled path's (the patch disabled), calls over several
steps are mapped rather than copied, and no segment is left behind.  ``driver-torch-threads``: the driver runs generate() with one torch thread and gives the
caller's count back after each call (the stock run keeps the caller's count throughout)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from spec_compat import REGISTRY
from proof_runs import proof_cases  # tests/support (on sys.path: tests/conftest.py)
from spec_compat.shims.handoff import live_segments as _segments

pytestmark = pytest.mark.engine

ROOT = Path(__file__).resolve().parents[2]
LAYERS = [0, 1, 2, 3]

#: runs the generator on the workloads and saves every result (one file per call)
SCRIPT = r"""
import json, sys, torch
import spec_compat  # before speculators
from speculators.data_generation.vllm_hidden_states_generator import VllmHiddenStatesGenerator
from spec_compat.cli.selftest import workloads
from spec_compat.verify.settings import pinned_dtype
from spec_compat.shims import handoff

calls, mapped, reused, seen = [], [], [], set()
orig = handoff.driver.materialize
def counting(desc, order, *a, **k):
    out = orig(desc, order, *a, **k)
    calls.append(len(order))
    reused.append(len(set(desc.segments) & seen))  # segments an earlier call wrote (recycled)
    seen.update(desc.segments)
    with open("/proc/self/maps") as f:  # segments the returned layers view (mapped, not copied)
        maps = f.read()
    mapped.append(sum(("/dev/shm/" + name) in maps for name in desc.segments))
    return out
handoff.driver.materialize = counting  # what the driver side calls

model, out, names = sys.argv[1], sys.argv[2], sys.argv[3].split(",")
with pinned_dtype("float32"):
    gen = VllmHiddenStatesGenerator(model, layer_ids=json.loads(sys.argv[4]), max_model_len=2048)
# torch threads of the driver inside generate() (seen at each RPC) and after each call
torch.set_num_threads(2)
inside, after = set(), set()
rpc = gen.executor.collective_rpc
def observed_rpc(*a, **k):
    inside.add(torch.get_num_threads())
    return rpc(*a, **k)
gen.executor.collective_rpc = observed_rpc
w = workloads(vocab=512, seed=0)
n = 0
for name in names:
    for batch in w[name]:
        res = gen.generate(batch)
        after.add(torch.get_num_threads())
        torch.save([r["hidden_states"] for r in res], f"{out}/call_{n}.pt")
        n += 1
print("SPEC_COMPAT_RESULT " + json.dumps({"calls": n, "materialized": calls, "mapped": mapped, "reused": reused, "threads_inside": sorted(inside),
                                          "threads_after": sorted(after)}), flush=True)
gen.executor.shutdown()
"""


def _extract(model: Path, out: Path, names: str, disable: str | None, pool_mb: str | None = None) -> dict:
    out.mkdir(parents=True)
    env = dict(os.environ)
    env.pop("SPEC_COMPAT_DISABLE", None)
    env.pop("SPEC_COMPAT_DRIVER_THREADS", None)
    env.pop("SPEC_COMPAT_SHM_POOL_MB", None)
    if disable:
        env["SPEC_COMPAT_DISABLE"] = disable
    if pool_mb is not None:
        env["SPEC_COMPAT_SHM_POOL_MB"] = pool_mb
    proc = subprocess.run([sys.executable, "-c", SCRIPT, str(model), str(out), names, json.dumps(LAYERS)],
                          env=env, capture_output=True, text=True, timeout=900, cwd=str(ROOT))
    line = next((ln for ln in proc.stdout.splitlines() if ln.startswith("SPEC_COMPAT_RESULT ")), None)
    assert proc.returncode == 0 and line, proc.stderr[-4000:]
    return json.loads(line[len("SPEC_COMPAT_RESULT "):])


NAMES = "chunked-8x2000,batch-43-shared-prefixes,consecutive-calls"


@pytest.fixture(scope="module")
def extraction(llama_dir, tmp_path_factory):
    """``extraction(disable, pool_mb=None)`` -> (result, out dir), run once per module and switch."""
    done: dict[tuple, tuple[dict, Path]] = {}

    def get(disable: str, pool_mb: str | None = None) -> tuple[dict, Path]:
        if (disable, pool_mb) not in done:
            out = tmp_path_factory.mktemp(f"extract-{disable or 'shipped'}-{pool_mb or 'nopool'}")
            done[disable, pool_mb] = (_extract(llama_dir, out / "rows", NAMES, disable=disable or None,
                                               pool_mb=pool_mb), out / "rows")
        return done[disable, pool_mb]

    return get


def _same_bytes(a_dir: Path, b_dir: Path, calls: int) -> int:
    """Rows of every call saved in two runs are byte-identical (dtype, shape, bytes): the row count."""
    import torch

    rows = 0
    for i in range(calls):
        a = torch.load(a_dir / f"call_{i}.pt", weights_only=True)
        b = torch.load(b_dir / f"call_{i}.pt", weights_only=True)
        assert len(a) == len(b) > 0, (i, len(a), len(b))
        for seq_a, seq_b in zip(a, b):
            assert len(seq_a) == len(seq_b) == len(LAYERS)
            for ha, hb in zip(seq_a, seq_b):
                assert ha.dtype == hb.dtype and ha.shape == hb.shape and ha.numel() > 0, (ha.shape, hb.shape)
                assert torch.isfinite(ha).all() and torch.isfinite(hb).all()
                assert torch.equal(ha.view(torch.uint8), hb.view(torch.uint8))  # byte-identical
                rows += ha.shape[0]
    return rows


@pytest.mark.parametrize("pid", proof_cases("test_handoff_rows_equal_the_pickled_path"))
def test_handoff_rows_equal_the_pickled_path(extraction, prove, pid):
    """Each performance patch on (the shipped path) vs only it off: the same bytes, and the
    patch's own effect seen (segments mapped and recycled / the driver's torch threads)."""
    proof = prove(pid)
    if not REGISTRY.get(pid).needed()[0]:
        pytest.skip(f"{pid} is not needed with these versions")
    before = _segments()
    shipped, shipped_dir = extraction(proof.baseline)  # no pool: fresh segments
    stock, stock_dir = extraction(proof.disable)
    assert shipped["calls"] == stock["calls"] == 4
    rows = _same_bytes(shipped_dir, stock_dir, shipped["calls"])
    assert rows > 8 * 1950 * len(LAYERS)
    proof.assert_identical(True, f"{rows} rows of {shipped['calls']} calls")
    if pid == "capture-handoff-shm":
        # the hand-off path was taken for every call, and only with the patch on
        assert len(shipped["materialized"]) == 4 and stock["materialized"] == []
        assert shipped["reused"] == [0] * 4, shipped
        # the 43-sequence call runs in two steps (32 sequences at most per step), the other two in
        # one, requests in input order: each layer's rows lie in one piece of its own segment and
        # the driver maps them.  The chunked call is copied (vLLM 0.16 schedules the split request's
        # remainder after the requests behind it); its bytes are compared all the same
        assert shipped["mapped"][1:] == [len(LAYERS)] * 3, shipped
        # recycling opted in: every later call writes into the segments of the call before it
        # (read, or mapped and released when generate() dropped them); the bytes still equal
        pooled, pooled_dir = extraction(proof.baseline, "512")
        assert pooled["reused"] == [0] + [len(LAYERS)] * 3, pooled
        assert pooled["mapped"][1:] == [len(LAYERS)] * 3, pooled
        _same_bytes(pooled_dir, stock_dir, pooled["calls"])
    if pid == "driver-torch-threads":
        # the driver at one torch thread inside generate(), the caller's count (2) after each call;
        # the stock run keeps the caller's count throughout
        assert shipped["threads_inside"] == [1] and shipped["threads_after"] == [2], shipped
        assert stock["threads_inside"] == stock["threads_after"] == [2], stock
    assert _segments() - before == set(), "shared-memory segments left in /dev/shm"


@pytest.mark.parametrize("pid", proof_cases("test_driver_reply_queues_do_not_spin"))
def test_driver_reply_queues_do_not_spin(llama_dir, prove, pid):
    """driver-wait-yields-cpu (CPU platform, opt-in with SPEC_COMPAT_DRIVER_WAIT=sleep): the
    generator's reply queues poll through the yielding timer and the rows come back byte-identical
    to the run with the patch disabled (the switch set all the same), where vLLM's SpinTimer stays."""
    proof = prove(pid)
    if not REGISTRY.get(pid).needed()[0]:
        pytest.skip(f"{pid} is not needed with these versions")
    code = (
        "import hashlib, spec_compat\n"
        "from speculators.data_generation.vllm_hidden_states_generator import VllmHiddenStatesGenerator\n"
        "from spec_compat.verify.settings import pinned_dtype\n"
        "if __name__ == '__main__':\n"
        "    with pinned_dtype('float32'):\n"
        f"        gen = VllmHiddenStatesGenerator({str(llama_dir)!r}, layer_ids=[1, 2, 3], max_model_len=1024)\n"
        "    from spec_compat.patches.extraction.driver_wait_yields_cpu import reply_queues\n"
        "    timers = [type(mq._read_spin_timer).__name__ for mq in reply_queues(gen.executor)]\n"
        "    res = gen.generate([[5] * 700, [7] * 300])\n"
        "    h = hashlib.sha256()\n"
        "    for r in res:\n"
        "        for t in r['hidden_states']:\n"
        "            assert t.numel() and t.isfinite().all()\n"
        "            h.update(str((t.dtype, tuple(t.shape))).encode() + t.contiguous().view(-1).view(torch.uint8).numpy().tobytes())\n"
        "    print('TIMERS', timers, [int(r['hidden_states'][0].shape[0]) for r in res], h.hexdigest())\n"
        "    gen.executor.shutdown()\n"
    ).replace("import hashlib, spec_compat", "import hashlib, spec_compat, torch")
    script = Path(llama_dir).parent / "driver_wait_probe.py"
    script.write_text(code)
    env = {k: v for k, v in os.environ.items() if k not in ("SPEC_COMPAT_DISABLE", "SPEC_COMPAT_DRIVER_WAIT")}
    lines = {}
    for disable, timer in ((proof.baseline, "YieldingTimer"), (proof.disable, "SpinTimer")):
        run_env = dict(env, SPEC_COMPAT_DRIVER_WAIT="sleep", SPEC_COMPAT_DISABLE=disable)
        proc = subprocess.run([sys.executable, str(script)], env=run_env, capture_output=True, text=True,
                              timeout=600, cwd=str(ROOT))
        assert proc.returncode == 0, proc.stderr[-3000:]
        line = next(ln for ln in proc.stdout.splitlines() if ln.startswith("TIMERS"))
        assert line.startswith(f"TIMERS [{timer!r}] [700, 300] "), (disable, line)
        lines[disable] = line.split()[-1]
    proof.assert_identical(lines[proof.baseline] == lines[proof.disable], "sha256 of the captured rows")
