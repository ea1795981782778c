"""The vLLM engine as the commands run it: the keyword arguments of a checked target
(:mod:`.checkpoints`), one greedy ``generate`` with the spec-decode counters read before and after
(they are cumulative per process), and a shutdown that frees the engine before the next one starts.
Shared by ``evaluate`` (evaluate.py, compare_drafts.py) and the demo's regenerate step."""

from __future__ import annotations

import contextlib
import gc
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from .checkpoints import text_config

_METRIC = "vllm:spec_decode_"
#: counted by vLLM's output processor (the frontend), not by the scheduler's spec-decode stats:
#: one inter-token-latency observation per request output after the request's first token
#: (one per decode step that gave the request tokens), and every token delivered
_OUTPUT_STEPS = "vllm:inter_token_latency_seconds"
_OUTPUT_TOKENS = "vllm:generation_tokens"


@contextlib.contextmanager
def engine_settings(target: Path, trust: bool) -> Iterator[None]:
    """The process settings the engines of a checked target start under (VLLM_MLA_DISABLE=1 for an
    MLA model without CUDA: :func:`..verify.settings.preferring_non_mla`), reverted when the block
    ends: enclose every engine of the command, from its start to its :func:`shutdown`."""
    from ..verify.settings import preferring_non_mla

    with preferring_non_mla(text_config(target, trust)):
        yield


def engine_kwargs(target: Path, trust: bool, max_model_len: int, eager: bool, seed: int) -> dict[str, Any]:
    """``vllm.LLM`` keyword arguments for a checked target (``trust``: :func:`.checkpoints.consent`);
    the engine starts inside :func:`engine_settings`."""
    return dict(model=str(target), tokenizer=str(target), trust_remote_code=trust, max_model_len=max_model_len,
                enforce_eager=eager, seed=seed, disable_log_stats=False)


def _counters(llm: Any) -> dict[str, Any]:
    got: dict[str, Any] = {}
    for m in llm.get_metrics():
        if m.name.startswith(_METRIC):
            key = m.name[len(_METRIC):]
            got[key] = list(m.values) if hasattr(m, "values") else m.value
        elif m.name == _OUTPUT_STEPS:
            got["output_steps"] = got.get("output_steps", 0) + int(m.count)
        elif m.name == _OUTPUT_TOKENS:
            got["output_tokens"] = got.get("output_tokens", 0) + int(m.value)
    return got


def shutdown(llm: Any) -> None:
    engine = getattr(llm, "llm_engine", None)
    core = getattr(engine, "engine_core", None)
    if core is not None and hasattr(core, "shutdown"):
        core.shutdown()
    del llm
    gc.collect()


def generate(kwargs: dict[str, Any], prompts: Sequence[Sequence[int]], max_tokens: int,
              ignore_eos: bool) -> tuple[list[list[int]], dict[str, Any], dict[str, Any], float]:
    from vllm import LLM, SamplingParams

    llm = LLM(**kwargs)
    try:
        params = SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=ignore_eos)
        before = _counters(llm)
        t0 = time.perf_counter()
        outs = llm.generate([{"prompt_token_ids": list(p)} for p in prompts], params, use_tqdm=False)
        seconds = time.perf_counter() - t0
        after = _counters(llm)
        return [list(o.outputs[0].token_ids) for o in outs], before, after, seconds
    finally:
        shutdown(llm)
