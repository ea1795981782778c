"""Shared by the units for EAGLE-3 heads other frameworks trained and published for Kimi-K2.5
(TorchSpec, SpecForge, SGLang formats) served by vLLM 0.15/0.16 (failure S3 in docs/failures.md):
``kimi-k2-draft-config``, ``eagle3-mla-draft-head``, ``eagle3-aux-ids-convention`` and
``eagle3-draft-fits-target``."""

from __future__ import annotations

from typing import Any

VLLM_S3 = ">=0.15,<0.17"
HEADS_TEST = "tests/engine/test_published_heads.py"


def _eagle3(spec: Any) -> bool:
    return getattr(spec, "method", None) == "eagle3" and getattr(spec, "draft_model_config", None) is not None
