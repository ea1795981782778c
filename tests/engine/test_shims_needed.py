"""Each shim is what fixes its failure: with only that shim disabled
(SPEC_COMPAT_DISABLE), stock extraction fails in this environment.

Each case runs ``spec-compat selftest`` in a fresh process (the default,
spawned-worker mode: worker-side shims arrive through the vLLM plugin) on the
workload that exposes the failure."""

from __future__ import annotations

import pytest

from spec_compat import REGISTRY

pytestmark = pytest.mark.engine

#: patch id -> (fixture, selftest workloads) that expose its failure
EXPOSED_BY = {
    "scheduler-config-init-vars": ("llama", "short"),
    "async-scheduling-off": ("llama", "short"),  # the synchronous-loop check
    "kv-cache-memory-from-platform": ("llama", "short"),
    "kv-cache-config-signature": ("llama", "short"),
    "scheduler-block-size": ("llama", "short"),
    "keep-unfinished-prefill": ("llama", "chunked-8x2000"),
    "prefix-caching-off": ("llama", "batch-43-shared-prefixes"),
    "collective-rpc-single-reply": ("llama", "short"),
    "two-phase-step": ("llama", "consecutive-calls"),
    "rows-by-request-id": ("llama", "short"),
    "worker-forward-embed-input-ids": ("llama", "short"),
    "capture-per-request": ("llama", "short"),
    "mem-get-info-from-platform": ("llama", "short"),
    "results-in-input-order": ("llama", "batch-43-shared-prefixes"),
    "generate-in-fitting-batches": ("llama", "batch-43-shared-prefixes"),
    "tokenizer-trust-remote-code": ("kimi-k25", "short"),
    "decoder-stack-locator": ("kimi-k25", "short"),
    "capture-layer-hooks": ("kimi-k25+--llama-4-scaling", "many-blocks"),
    "kimi-k25-device-without-cuda": ("kimi-k25", "short"),
    "kimi-k25-load-unfused-qkv-a": ("kimi-k25", "short"),
}
#: optimisations (nothing fails without them): patch id -> the test proving the optimised path
#: gives the same bytes as the stock one
OPTIMIZATIONS = {
    "capture-handoff-shm": "test_handoff_rows_equal_the_pickled_path",
    "driver-wait-yields-cpu": "test_driver_reply_queues_do_not_spin",
    "driver-torch-threads": "test_handoff_rows_equal_the_pickled_path",
}
#: guards (nothing fails without them on good data; they turn silent loss into an error):
#: patch id -> the test that makes rows go missing and sees the guard raise
GUARDS = {
    "generator-input-checks": "test_lost_rows_raise_instead_of_passing_silently",
}
#: hardware fixes (nothing fails without them on most CPUs): patch id -> the test that runs the
#: stock path on hardware where it fails (skipped elsewhere) and the patched path against a reference
HARDWARE = {
    "cpu-attention-isa-probe": "test_amx_cpu_decodes_with_the_probe_and_dies_without",
}
#: patches that only fail once the patch superseding them is off too
ALSO_DISABLE = {
    "worker-forward-embed-input-ids": "capture-layer-hooks",
    # on vLLM 0.15 the serving patch gives Kimi's bare text model a `.model` name for the drafter,
    # which is also what speculators 0.4.x's `get_language_model().model` looks for
    "decoder-stack-locator": "eagle3-kimi-k25-aux-states",
}
#: patches whose failure only shows on some platforms: id -> (platform where it shows, why)
PLATFORM_ONLY = {
    "kv-cache-memory-from-platform": ("cpu", "needs a machine without CUDA"),
    "kimi-k25-device-without-cuda": ("cpu", "needs a machine without CUDA"),
    # vLLM's CPU platform turns async scheduling off itself (platforms/cpu.py:198);
    # test_async_scheduling_off_reaches_the_config proves the shim's effect here
    "async-scheduling-off": ("cuda", "vLLM's CPU platform disables async scheduling by itself"),
}


def _platform() -> str:
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"


def _needed_here(disabled: str | None = None) -> list[str]:
    """Ids whose version ranges hold here (and that no enabled patch supersedes)."""
    off = {disabled} if disabled else set()
    active = [p for p in REGISTRY.patches() if p.side != "platform" and p.needed()[0]]
    superseded = {s for p in active if p.id not in off for s in p.supersedes}
    return [p.id for p in active if p.id not in superseded]


def test_every_needed_patch_has_a_proof_case():
    from pathlib import Path

    from test_serving import SERVING_EXPOSED_BY
    from test_training import MEASURED_ONLY, TRAINING_PROOFS

    here = Path(__file__).parent
    sources = "".join(p.read_text() for p in here.glob("test_*.py"))
    for pid, test in TRAINING_PROOFS.items():
        assert f"def {test}(" in sources, f"{pid}: proof test {test} does not exist"
    for pid, test in {**OPTIMIZATIONS, **GUARDS, **HARDWARE}.items():
        assert f"def {test}(" in sources, f"{pid}: proof test {test} does not exist"
    assert "def test_fails_with_only_this_serving_shim_disabled(" in sources
    known = (set(EXPOSED_BY) | set(TRAINING_PROOFS) | set(MEASURED_ONLY) | set(SERVING_EXPOSED_BY)
             | set(OPTIMIZATIONS) | set(GUARDS) | set(HARDWARE))
    missing = [pid for pid in _needed_here() if pid not in known]
    assert not missing, f"patches without a disabled-shim test: {missing}"


def test_all_shims_on_passes(llama_dir, selftest):
    proc = selftest(llama_dir, "short,many-blocks,chunked-8x2000,batch-43-shared-prefixes,consecutive-calls")
    assert proc.returncode == 0, proc.stdout + proc.stderr[-3000:]
    assert "selftest: OK" in proc.stdout


@pytest.mark.parametrize("pid", sorted(EXPOSED_BY))
def test_fails_with_only_this_shim_disabled(fixture_dir, selftest, pid):
    superseding = ALSO_DISABLE.get(pid)
    needed = _needed_here(disabled=superseding)
    if pid not in needed:
        pytest.skip(f"{pid} is not needed in this environment")
    if pid in PLATFORM_ONLY and PLATFORM_ONLY[pid][0] != _platform():
        pytest.skip(PLATFORM_ONLY[pid][1])
    model, checks = EXPOSED_BY[pid]
    if superseding:
        # the shim's own failure with the better fix off: passes with it, fails without it
        good = selftest(fixture_dir(model), checks, disable=superseding)
        assert good.returncode == 0, good.stdout + good.stderr[-3000:]
    from spec_compat.shims.handoff import live_segments

    segments_before = live_segments()
    proc = selftest(fixture_dir(model), checks, disable=",".join(filter(None, (pid, superseding))))
    print(proc.stdout)
    assert proc.returncode != 0, f"selftest passed with {pid} disabled:\n{proc.stdout}"
    assert "FAIL" in proc.stdout
    if pid == "rows-by-request-id":
        # without the driver half nobody reads a hand-off descriptor: the worker must not write one
        assert live_segments() - segments_before == set(), "capture segments left in /dev/shm"


def test_f10_is_silent_without_both_halves(llama_dir, selftest):
    """Upstream's F10 is silent: without per-request attribution the chunked batch
    yields the right row counts but values of other sequences."""
    if "capture-per-request" not in _needed_here():
        pytest.skip("F10 patches not needed here")
    proc = selftest(llama_dir, "chunked-8x2000", disable="capture-per-request,rows-by-request-id")
    print(proc.stdout)
    line = next(ln for ln in proc.stdout.splitlines() if "chunked-8x2000" in ln)
    assert line.startswith("FAIL") and "max|diff|=" in line, line
    worst = float(line.split("max|diff|=")[1].split()[0].rstrip(","))
    assert worst > 1e-3, line


_ASYNC_PROBE = """
import spec_compat
from speculators.data_generation import vllm_hidden_states_generator as gen
cfg = gen.SchedulerConfig(max_num_seqs=32, max_model_len=2048, max_num_batched_tokens=8192)
print("ASYNC", cfg.async_scheduling)
"""


def test_async_scheduling_off_reaches_the_config():
    """O3: the generator's SchedulerConfig says async_scheduling=False with the shim, and
    leaves it None (which VllmConfig resolves to True for the mp/uni executors on GPU
    platforms) with only that shim disabled."""
    import os
    import subprocess
    import sys

    if "async-scheduling-off" not in _needed_here():
        pytest.skip("async-scheduling-off is not needed in this environment")
    out = {}
    for disable in ("", "async-scheduling-off"):
        env = dict(os.environ, SPEC_COMPAT_DISABLE=disable)
        proc = subprocess.run([sys.executable, "-c", _ASYNC_PROBE], capture_output=True, text=True, env=env,
                              timeout=300)
        assert proc.returncode == 0, proc.stderr[-2000:]
        out[disable] = next(ln for ln in proc.stdout.splitlines() if ln.startswith("ASYNC")).split()[1]
    assert out == {"": "False", "async-scheduling-off": "None"}, out
