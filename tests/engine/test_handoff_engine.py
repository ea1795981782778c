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
from spec_compat.shims.handoff import live_segments as _segments

pytestmark = pytest.mark.engine

ROOT = Path(__file__).resolve().parents[2]
LAYERS = [0, 1, 2, 3]

#: runs the generator on the workloads and saves every result (one file per call)
SCRIPT = r"""
import json, sys, torch
import spec_compat  # before speculators
from speculators.data_generation.vllm_hidden_states_generator import VllmHiddenStatesGenerator
from spec_compat.selftest import workloads
from spec_compat.testing import pinned_dtype
from spec_compat.shims import handoff

calls, mapped, reused, seen = [], [], [], set()
orig = handoff.materialize
def counting(desc, order, *a, **k):
    out = orig(desc, order, *a, **k)
    calls.append(len(order))
    reused.append(len(set(desc.segments) & seen))  # segments an earlier call wrote (recycled)
    seen.update(desc.segments)
    with open("/proc/self/maps") as f:  # segments the returned layers view (mapped, not copied)
        maps = f.read()
    mapped.append(sum(("/dev/shm/" + name) in maps for name in desc.segments))
    return out
handoff.materialize = counting

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


def test_handoff_rows_equal_the_pickled_path(llama_dir, tmp_path):
    """Both performance patches on vs both off (the stock path): the same bytes."""
    if not REGISTRY.get("capture-handoff-shm").needed()[0]:
        pytest.skip("capture-handoff-shm is not needed with these versions (speculators 0.3.x only)")
    import torch

    names = "chunked-8x2000,batch-43-shared-prefixes,consecutive-calls"
    before = _segments()
    shm = _extract(llama_dir, tmp_path / "shm", names, disable=None, pool_mb="512")  # recycling opted in
    default = _extract(llama_dir, tmp_path / "default", names, disable=None)  # no pool: fresh segments
    assert default["reused"] == [0] * 4 and default["mapped"][1:] == [len(LAYERS)] * 3, default
    # the stock path: rows pickled, the driver at the caller's torch threads
    pickled = _extract(llama_dir, tmp_path / "pickled", names, disable="capture-handoff-shm,driver-torch-threads")
    # the hand-off path was taken for every call, and only with the patch on
    assert shm["calls"] == pickled["calls"] == 4
    assert len(shm["materialized"]) == 4 and pickled["materialized"] == []
    # the 43-sequence call runs in two steps (32 sequences at most per step), the other two in
    # one, requests in input order: each layer's rows lie in one piece of its own segment and
    # the driver maps them.  The chunked call is copied (vLLM 0.16 schedules the split request's
    # remainder after the requests behind it); its bytes are compared below all the same
    assert shm["mapped"][1:] == [len(LAYERS)] * 3, shm
    # every later call writes into the segments of the call before it (read, or mapped and
    # released when generate() dropped them): the pages are recycled, the bytes still equal
    assert shm["reused"] == [0] + [len(LAYERS)] * 3, shm
    assert shm["threads_after"] == pickled["threads_after"] == pickled["threads_inside"] == [2]
    if REGISTRY.get("driver-torch-threads").needed()[0]:
        assert shm["threads_inside"] == [1]
    rows = 0
    for i in range(shm["calls"]):
        a = torch.load(tmp_path / "shm" / f"call_{i}.pt", weights_only=True)
        b = torch.load(tmp_path / "pickled" / f"call_{i}.pt", weights_only=True)
        c = torch.load(tmp_path / "default" / f"call_{i}.pt", weights_only=True)
        assert all(torch.equal(x.view(torch.uint8), y.view(torch.uint8))
                   for sx, sy in zip(c, b) for x, y in zip(sx, sy)) and len(c) == len(b)
        assert len(a) == len(b)
        for seq_a, seq_b in zip(a, b):
            assert len(seq_a) == len(seq_b) == len(LAYERS)
            for ha, hb in zip(seq_a, seq_b):
                assert ha.dtype == hb.dtype and ha.shape == hb.shape
                assert torch.equal(ha.view(torch.uint8), hb.view(torch.uint8))  # byte-identical
                rows += ha.shape[0]
    assert rows > 8 * 1950 * len(LAYERS)
    assert _segments() - before == set(), "shared-memory segments left in /dev/shm"


def test_driver_reply_queues_do_not_spin(llama_dir):
    """driver-wait-yields-cpu (CPU platform, opt-in with SPEC_COMPAT_DRIVER_WAIT=sleep): the
    generator's reply queues poll through the yielding timer and the rows come back whole; without
    the switch vLLM's own SpinTimer stays."""
    if not REGISTRY.get("driver-wait-yields-cpu").needed()[0]:
        pytest.skip("driver-wait-yields-cpu is not needed with these versions")
    code = (
        "import spec_compat\n"
        "from speculators.data_generation.vllm_hidden_states_generator import VllmHiddenStatesGenerator\n"
        "from spec_compat.shims.polling import YieldingTimer\n"
        "if __name__ == '__main__':\n"
        f"    gen = VllmHiddenStatesGenerator({str(llama_dir)!r}, layer_ids=[1, 2, 3], max_model_len=1024)\n"
        "    from spec_compat.patches.generator import reply_queues\n"
        "    timers = [type(mq._read_spin_timer).__name__ for mq in reply_queues(gen.executor)]\n"
        "    res = gen.generate([[5] * 700, [7] * 300])\n"
        "    print('TIMERS', timers, [int(r['hidden_states'][0].shape[0]) for r in res])\n"
        "    gen.executor.shutdown()\n"
    )
    script = Path(llama_dir).parent / "driver_wait_probe.py"
    script.write_text(code)
    env = {k: v for k, v in os.environ.items() if k not in ("SPEC_COMPAT_DISABLE", "SPEC_COMPAT_DRIVER_WAIT")}
    for mode, timer in (("sleep", "YieldingTimer"), (None, "SpinTimer")):
        run_env = dict(env, SPEC_COMPAT_DRIVER_WAIT=mode) if mode else env
        proc = subprocess.run([sys.executable, str(script)], env=run_env, capture_output=True, text=True,
                              timeout=600, cwd=str(ROOT))
        assert proc.returncode == 0, proc.stderr[-3000:]
        line = next(ln for ln in proc.stdout.splitlines() if ln.startswith("TIMERS"))
        assert line == f"TIMERS [{timer!r}] [700, 300]", (mode, line)
