"""Tensor parallel 2 on the real engine: captured states (TP rank 0) equal the
transformers reference exactly as TP=1 does."""

from __future__ import annotations

import os

import pytest

pytestmark = pytest.mark.engine


@pytest.mark.skipif((os.cpu_count() or 1) < 2, reason="needs 2 cores for 2 CPU workers")
@pytest.mark.parametrize("model", ["llama", "kimi-k25"])
def test_tp2_matches_reference(fixture_dir, selftest, monkeypatch, model):
    import torch

    if not torch.cuda.is_available():
        # one NUMA node here: vLLM's CPU worker cannot auto-bind 2 ranks; bind one core each
        monkeypatch.setenv("VLLM_CPU_OMP_THREADS_BIND", "0|1")
    proc = selftest(fixture_dir(model), "many-blocks,chunked-8x2000", tensor_parallel_size=2)
    print(proc.stdout)
    assert proc.returncode == 0, proc.stdout + proc.stderr[-3000:]
    assert "tensor parallel 2" in proc.stdout
