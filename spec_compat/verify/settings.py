"""Helpers for tests and ``selftest``: engine settings that make values comparable."""

from __future__ import annotations

import contextlib
import importlib
import logging
from collections.abc import Iterator
from typing import Any

from ..core import bindings
from ..core.registry import Changes

log = logging.getLogger("spec_compat")

GEN = "speculators.data_generation.vllm_hidden_states_generator"


@contextlib.contextmanager
def pinned_dtype(dtype: str = "float32") -> Iterator[None]:
    """Make the generator's ModelConfig use ``dtype`` instead of ``"auto"``.

    vLLM downcasts an fp32 checkpoint to bf16 under ``"auto"`` (differences
    ~5e-2); comparisons against a reference pin fp32.  Not a compatibility
    patch: a test setting, applied to the generator's own binding only."""
    module = importlib.import_module(GEN)
    changes = Changes("testing-pinned-dtype")

    def adapt(kw: dict[str, Any]) -> dict[str, Any]:
        kw["dtype"] = dtype
        return kw

    bindings.adapt_call(changes, module, "ModelConfig", adapt)
    try:
        yield
    finally:
        changes.undo()


#: the variable that makes vLLM build MLA models with their non-MLA attention path
MLA_DISABLE = "VLLM_MLA_DISABLE"


@contextlib.contextmanager
def preferring_non_mla(text_cfg: Any) -> Iterator[None]:
    """vLLM's CPU platform has no MLA backend: MLA models run with VLLM_MLA_DISABLE=1.

    Set (where the caller has not set it) for the ``with`` block, through an undo log, and removed
    when the block ends: enclose the engine's whole life, its start and the workers it spawns
    (they inherit the variable), up to its shutdown.  A command's decision, not a compatibility
    patch: recorded in the log ``setting-prefer-non-mla`` and undone like one."""
    import os

    import torch

    changes = Changes("setting-prefer-non-mla")
    if getattr(text_cfg, "kv_lora_rank", None) and not torch.cuda.is_available():
        if MLA_DISABLE not in os.environ:
            changes.setitem(os.environ, MLA_DISABLE, "1",
                            label=f"os.environ[{MLA_DISABLE!r}] (MLA model on a machine without CUDA)")
        if os.environ[MLA_DISABLE] == "1":
            log.info("spec_compat: MLA model on a machine without CUDA: VLLM_MLA_DISABLE=1")
    try:
        yield
    finally:
        changes.undo()
