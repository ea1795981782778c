"""vLLM's hidden-states extraction API on vLLM 0.15/0.16 (patches ehs-*): every requested layer
id, every row, against a transformers forward of the same weights.

Workload per engine: a long prompt (several KV blocks, over the chunk budget), then in a second
``generate`` call prompts sharing its 3-block prefix (prefix-cache hits, asserted), and a batch
larger than one scheduler step.  Two engines: prefix caching + chunked prefill on (budget 64
tokens), and both off.  ids 0..N of the 4-layer Llama fixture: id 0 (embedding) and id N (before
the final norm) included.
"""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tests" / "support"))
from ehs_engine import engine_settings, run_engine  # noqa: E402

pytestmark = pytest.mark.skipif(
    not any(p.id == "ehs-config" and p.needed()[0] for p in __import__("spec_compat").REGISTRY.patches()),
    reason="vLLM has its own extract_hidden_states (or this is not a vLLM 0.15/0.16 cell)")

BLOCK = 16
LAYER_IDS = [0, 1, 2, 3, 4]
#: fp32 on both sides: max |diff| <= TOL * max |reference| per request and layer
TOL = 1e-5


def _prompts(seed: int, block: int = BLOCK) -> list[list[list[int]]]:
    rng = random.Random(seed)
    tok = lambda n: [rng.randrange(1, 250) for _ in range(n)]  # noqa: E731
    long = tok(max(300, 5 * block))  # 19 blocks of 16 (5 of 64), over 4x the chunk budget of 64
    shared = [long[:3 * block + 5] + tok(40 + 7 * k) for k in range(3)]  # 3 full blocks shared
    batch = [tok(20 + 9 * k) for k in range(12)]  # 12 prompts, 834 tokens: many steps of 64
    return [[long], shared + batch]


def _engine(prefix: bool, chunked: bool) -> dict:
    return engine_settings(prefix, chunked, BLOCK)


def _check_files(model_dir: Path, result: list[dict], layer_ids: list[int] = LAYER_IDS) -> list[str]:
    """Each request's file against the reference; returns one line per request (max diffs)."""
    import torch
    from safetensors.torch import load_file

    from spec_compat.verify.compare import compare_states
    from spec_compat.verify.hidden_states_reference import reference_rows
    from spec_compat.verify.reference import load_reference_model

    model = load_reference_model(str(model_dir), "float32")
    lines = []
    for k, r in enumerate(result):
        params = r["kv_transfer_params"]
        assert params and params.get("hidden_states_path"), f"request {k}: no hidden_states_path in {params}"
        path = params["hidden_states_path"]
        assert os.path.isfile(path), path
        assert not os.path.exists(path + ".error")
        data = load_file(path)
        assert set(data) == {"hidden_states", "token_ids"}, sorted(data)
        ids = r["prompt_token_ids"]
        assert data["token_ids"].dtype == torch.int64 and data["token_ids"].tolist() == ids
        want = reference_rows(model, ids, layer_ids)
        got = data["hidden_states"]
        assert got.shape == (len(ids), len(layer_ids), want.shape[-1]), (got.shape, want.shape)
        diffs = []
        for c, layer in enumerate(layer_ids):
            scale = float(want[:, c].abs().max())
            cmp = compare_states(got[:, c], want[:, c], tolerance=TOL * scale, sides=("engine", "reference"))
            assert cmp, f"request {k} ({len(ids)} tokens) layer id {layer}: {cmp.detail}"
            diffs.append(cmp.max_abs_diff / scale)
        lines.append(f"request {k}: {len(ids)} rows, cached {r['num_cached_tokens']}, "
                     f"max |diff|/max|ref| per id {['%.1e' % d for d in diffs]}")
    return lines


CASES = [("llama", True, True), ("llama", False, False)]


@pytest.mark.vllm_only  # vLLM-side only: once per vLLM version in a matrix/test run
@pytest.mark.parametrize("fixture,prefix,chunked", CASES, ids=["llama-prefix+chunked", "llama-plain"])
def test_rows_equal_reference(fixture_dir, tmp_path, fixture, prefix, chunked):
    """(Kimi-K2.5 goes through the same path in tests/server/test_speculators_client.py; the
    engine path without HTTP ran it too: max rel 1.2e-6 on 0.16.0 and 0.15.1, session 13.)"""
    model_dir = fixture_dir(fixture)
    storage = tmp_path / "hs"
    waves = _prompts(seed=1)
    engine = _engine(prefix, chunked)
    env = {}
    if fixture.startswith("kimi"):
        engine["trust_remote_code"] = True
        env["VLLM_MLA_DISABLE"] = "1"
    spec = {"model": str(model_dir), "layer_ids": LAYER_IDS, "storage": str(storage),
            "engine": engine, "waves": waves}
    proc, result = run_engine(spec, tmp_path, **env)
    assert proc.returncode == 0 and result is not None, proc.stderr[-4000:]
    assert len(result) == sum(len(w) for w in waves)
    for r, ids in zip(result, [ids for w in waves for ids in w]):
        assert r["prompt_token_ids"] == ids
    cached = [r["num_cached_tokens"] or 0 for r in result[1:4]]
    if prefix:
        assert all(c >= 3 * BLOCK for c in cached), f"no prefix-cache hit on the shared prefix: {cached}"
    else:
        assert cached == [0, 0, 0], cached
    lines = _check_files(model_dir, result)
    print("\n".join(lines))
    assert sorted(p.name for p in storage.iterdir()) == sorted(
        os.path.basename(r["kv_transfer_params"]["hidden_states_path"]) for r in result), "stray files"


#: the Kimi-K2.5 deployment's shapes that reach this path (issue #22 items 1 and 3): CUDA's MLA
#: backends run 64-token KV blocks (vllm/platforms/cuda.py forces 64 for FlashMLA), and the
#: deployment is tensor parallel; on CPU both are set directly (TP=2: one core per rank)
GPU_SHAPES = [("llama", 64, 2), ("kimi-k25", 64, 2)]


@pytest.mark.vllm_only
@pytest.mark.parametrize("fixture,block,tp", GPU_SHAPES, ids=["llama-block64-tp2", "kimi-k25-block64-tp2"])
def test_rows_equal_reference_with_gpu_shapes(fixture_dir, tmp_path, fixture, block, tp):
    """64-token blocks and two tensor-parallel ranks, prefix caching and chunked prefill on: one
    complete file per request, every row equal to the reference, and exactly one rank capturing."""
    model_dir = fixture_dir(fixture)
    storage = tmp_path / "hs"
    waves = _prompts(seed=4, block=block)
    engine = engine_settings(True, True, block)
    engine["tensor_parallel_size"] = tp
    env = {"VLLM_CPU_OMP_THREADS_BIND": "0|1"}  # one NUMA node here: vLLM cannot auto-bind 2 ranks
    if fixture.startswith("kimi"):
        engine["trust_remote_code"] = True
        env["VLLM_MLA_DISABLE"] = "1"
    spec = {"model": str(model_dir), "layer_ids": LAYER_IDS, "storage": str(storage),
            "engine": engine, "waves": waves}
    proc, result = run_engine(spec, tmp_path, timeout=900, **env)
    assert proc.returncode == 0 and result is not None, proc.stderr[-4000:]
    assert len(result) == sum(len(w) for w in waves)
    for r, ids in zip(result, [ids for w in waves for ids in w]):
        assert r["prompt_token_ids"] == ids
    cached = [r["num_cached_tokens"] or 0 for r in result[1:4]]
    assert all(c >= 3 * block for c in cached), f"no prefix-cache hit on the shared {block}-token blocks: {cached}"
    capturing = [ln for ln in proc.stderr.splitlines() if "extract_hidden_states: capturing ids" in ln]
    assert len(capturing) == 1, capturing  # rank 0 only, once
    assert f"x {block} tokens" in capturing[0], capturing[0]  # the store follows the engine's block size
    lines = _check_files(model_dir, result)
    print(capturing[0])
    print("\n".join(lines))
    assert sorted(p.name for p in storage.iterdir()) == sorted(
        os.path.basename(r["kv_transfer_params"]["hidden_states_path"]) for r in result), "stray files"


def _small_spec(model_dir: Path, storage: Path) -> dict:
    rng = random.Random(2)
    return {"model": str(model_dir), "layer_ids": LAYER_IDS, "storage": str(storage),
            "engine": _engine(True, True), "waves": [[[rng.randrange(1, 250) for _ in range(70)]]]}


BAD_CONFIGS = [
    ({"layer_ids": [0, 9]}, r"spec_compat\[ehs-config\]: .*out of range \[9\].*N = num_hidden_layers = 4"),
    ({"layer_ids": [-1, 2]}, r"spec_compat\[ehs-config\]: .*out of range \[-1\]"),
    ({"layer_ids": [2, 2, 4]}, r"spec_compat\[ehs-config\]: .*repeated \[2\]"),
    ({"layer_ids": []}, r"spec_compat\[ehs-config\]: .*empty"),
    ({"storage": "/proc/version/hs"}, r"spec_compat\[ehs-config\]: the hidden-states directory '/proc/version/hs' "
                                      r"is not writable"),
]


_REFUSALS = r"""
import json, sys
import spec_compat
from vllm import LLM

out = []
for spec in json.loads(sys.argv[1]):
    try:
        LLM(model=spec["model"], speculative_config={"method": "extract_hidden_states", "num_speculative_tokens": 1,
            "draft_model_config": {"hf_config": {"eagle_aux_hidden_state_layer_ids": spec["layer_ids"]}}},
            kv_transfer_config={"kv_connector": "ExampleHiddenStatesConnector", "kv_role": "kv_producer",
                                "kv_connector_extra_config": {"shared_storage_path": spec["storage"]}},
            **spec["engine"])
        out.append(None)
    except Exception as exc:
        out.append({"value_error": isinstance(exc, ValueError), "message": f"{type(exc).__name__}: {exc}"})
print("SPEC_COMPAT_RESULT " + json.dumps(out))
"""


@pytest.mark.vllm_only
def test_bad_configuration_is_refused_before_the_engine_starts(llama_dir, tmp_path):
    """Each bad layer-id list or storage directory: a ValueError naming the problem, raised while
    the configuration is built (no engine process was started; one interpreter for all)."""
    import re

    specs = []
    for change, _ in BAD_CONFIGS:
        spec = _small_spec(llama_dir, tmp_path / "hs")
        spec.update(change)
        specs.append(spec)
    env = dict(os.environ)
    env.pop("SPEC_COMPAT_DISABLE", None)
    proc = subprocess.run([sys.executable, "-c", _REFUSALS, json.dumps(specs)], env=env, capture_output=True,
                          text=True, timeout=300, cwd=str(tmp_path))
    assert proc.returncode == 0, proc.stderr[-3000:]
    errors = json.loads(proc.stdout.split("SPEC_COMPAT_RESULT ", 1)[1])
    for (change, message), error in zip(BAD_CONFIGS, errors):
        assert error is not None and error["value_error"] and re.search(message, error["message"]), (change, error)
    assert "EngineCore" not in proc.stderr, "refused only after an engine process started"


@pytest.mark.vllm_only
def test_a_failed_write_is_reported_and_the_engine_keeps_serving(llama_dir, tmp_path):
    """The storage directory becomes a plain file between two requests: the request in between
    answers an error (no path), no partial file is left, and the next request (directory back)
    gets its complete file."""
    storage = tmp_path / "hs"
    rng = random.Random(3)
    waves = [[[rng.randrange(1, 250) for _ in range(40)]] for _ in range(3)]
    spec = {"model": str(llama_dir), "layer_ids": LAYER_IDS, "storage": str(storage),
            "engine": _engine(True, True), "waves": waves,
            "before": {"1": "break-storage", "2": "restore-storage"}}
    proc, result = run_engine(spec, tmp_path)
    assert proc.returncode == 0 and result is not None, proc.stderr[-4000:]
    broken = result[1]["kv_transfer_params"]
    assert broken["hidden_states_path"] is None, broken
    assert "spec_compat[ehs-capture]" in broken["error"] and "not written" in broken["error"], broken
    assert "writing hidden states to" in proc.stderr and "failed" in proc.stderr
    assert [p.name for p in storage.iterdir()] == [os.path.basename(result[2]["kv_transfer_params"]["hidden_states_path"])]
    print(_check_files(llama_dir, [result[2]])[0])
