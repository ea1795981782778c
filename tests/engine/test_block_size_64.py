"""The GPU's KV block size on the CPU engine (issue #22 item 1).

On a CUDA machine vLLM's platform raises an MLA model's cache block size to 64 after the caller
chose its own (vllm/platforms/cuda.py ``check_and_update_config``: "Forcing kv cache block size to
64 for FlashMLA backend."), so speculators 0.4.0.1's generator, which hard-codes 16 for both its
``CacheConfig`` and its ``Scheduler``, runs a 64-token KV cache under a 16-token scheduler; 0.3.0
(with F4, ``scheduler-block-size``) gives its scheduler the cache's size.  On CPU nothing raises
it (MLA is off there), so this test does what CUDA does, in the CPU platform's hook, and checks
that every extraction row still equals the transformers reference, with the long, shared-prefix
and chunked workloads."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from spec_compat.cli.selftest import workloads

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "support"))
from extraction_rows import assert_rows_match  # noqa: E402

pytestmark = pytest.mark.engine
WORKLOADS = {k: v for k, v in workloads(vocab=512, seed=0).items()
             if k in ("many-blocks", "batch-43-shared-prefixes", "chunked-8x2000")}
GPU_BLOCK = 64


@pytest.fixture(scope="module", params=["llama", "kimi-k25"])
def engine64(request, fixture_dir):
    from speculators.data_generation.vllm_hidden_states_generator import VllmHiddenStatesGenerator
    from transformers import AutoConfig
    from vllm.platforms.cpu import CpuPlatform

    from spec_compat.verify.reference import load_reference_model
    from spec_compat.verify.settings import pinned_dtype, preferring_non_mla

    model_dir = str(fixture_dir(request.param))
    cfg = AutoConfig.from_pretrained(model_dir, trust_remote_code=True)
    with preferring_non_mla(getattr(cfg, "text_config", cfg)):
        platform_hook = CpuPlatform.check_and_update_config  # bound to the class (a classmethod)

        def as_on_cuda(cls, vllm_config):
            platform_hook(vllm_config)
            if vllm_config.cache_config.block_size % GPU_BLOCK:
                vllm_config.cache_config.block_size = GPU_BLOCK

        mp = pytest.MonkeyPatch()
        mp.setattr(CpuPlatform, "check_and_update_config", classmethod(as_on_cuda))
        layer_ids = [0, 1, 2, 3]
        try:
            with pinned_dtype("float32"):
                gen = VllmHiddenStatesGenerator(model_dir, layer_ids=layer_ids, max_model_len=2048)
        finally:
            mp.undo()
        ref = load_reference_model(model_dir)
        yield gen, ref, layer_ids
        gen.executor.shutdown()


def _kv_spec_block_sizes(gen) -> set[int]:
    groups = gen.scheduler.kv_cache_config.kv_cache_groups
    return {g.kv_cache_spec.block_size for g in groups}


def test_the_engine_runs_the_gpu_block_size(engine64):
    gen, _, _ = engine64
    from importlib.metadata import version

    cache = gen.vllm_config.cache_config.block_size
    kv = _kv_spec_block_sizes(gen)
    sched = gen.scheduler.block_size
    print(f"speculators {version('speculators')}: cache {cache}, kv spec {sorted(kv)}, scheduler {sched}")
    assert cache == GPU_BLOCK and kv == {GPU_BLOCK}
    assert sched in (16, GPU_BLOCK)  # 0.4.0.1 keeps its 16; 0.3.0 (F4) takes the cache's


@pytest.mark.parametrize("name", list(WORKLOADS))
def test_rows_equal_the_reference_with_64_token_blocks(engine64, name):
    gen, ref, layer_ids = engine64
    assert_rows_match(gen, ref, layer_ids, WORKLOADS[name], name)
