"""Serve a draft and measure it: the one-draft run of ``spec-compat evaluate`` (the command and its
several-draft table: compare_drafts.py).

:func:`evaluate` runs vLLM on the same prompts twice - without speculation and
with the EAGLE-3 draft - greedily, checks the two outputs are token-for-token
identical (speculative decoding must be lossless) and reads the engine's
speculative-decoding counters (``LLM.get_metrics()``; counters are cumulative
per process, so each run reads them before and after its ``generate``).

Runs on vLLM's CPU platform (spec-compat's serving patches) and on a GPU
install unchanged.
"""

from __future__ import annotations

import json
import logging
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any


from .checkpoints import CheckpointError, checked_target, eagle3_draft, model_dir
from .engine_runs import engine_kwargs, engine_settings, generate

log = logging.getLogger("spec_compat")

EVAL_PROMPTS = Path(__file__).parent.parent / "data" / "eval_prompts.jsonl"


class EvaluateError(CheckpointError):
    """Bad input to evaluate/regenerate (path, prompts file, arguments)."""


@dataclass
class EvalResult:
    lossless: bool
    drafts: int
    draft_tokens: int
    accepted_tokens: int
    acceptance_rate: float
    mean_acceptance_length: float
    per_position: list[float]
    per_position_accepted: list[int]
    k: int
    prompts: int
    output_tokens: int
    first_mismatch: dict[str, int] | None = None
    seconds: dict[str, float] = field(default_factory=dict)
    #: the same run seen from the outputs, independently of the spec-decode counters above:
    #: ``decode_steps`` (per-request outputs after the first token, counted by vLLM's output
    #: processor; each verifies one draft), ``generation_tokens`` (tokens it delivered) and the
    #: accepted tokens they imply: every decode step delivers 1 + its accepted tokens, except
    #: that a request's last step drops what passes max_tokens (at most k), so
    #: ``accepted_tokens_min`` = output tokens - prompts - decode steps and
    #: ``accepted_tokens_max`` = that + k x prompts.  None where the engine lacks those metrics.
    from_outputs: dict[str, int] | None = None

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def load_prompts(path: str | os.PathLike[str] | None, tokenizer: Any, limit: int | None = None) -> list[list[int]]:
    """Token ids of each prompt.  ``.jsonl``: one object per line with ``prompt_token_ids``,
    ``prompt`` (raw text), or ``messages`` / ``conversations`` (chat; the turns up to the first
    assistant turn, rendered with the tokenizer's chat template).  Other files: one raw-text
    prompt per non-empty line."""
    p = Path(path) if path else EVAL_PROMPTS
    if not p.is_file():
        raise EvaluateError(f"prompts file {str(p)!r} not found")
    out: list[list[int]] = []
    lines = p.read_text().splitlines()
    for n, line in enumerate(lines, 1):
        if not line.strip():
            continue
        if p.suffix == ".jsonl":
            try:
                obj = json.loads(line)
            except ValueError as exc:
                raise EvaluateError(f"{p}:{n}: not JSON: {exc}") from None
            out.append(_prompt_ids(obj, tokenizer, f"{p}:{n}"))
        else:
            out.append(list(tokenizer(line, add_special_tokens=True)["input_ids"]))
        if limit is not None and len(out) >= limit:
            break
    if not out:
        raise EvaluateError(f"prompts file {str(p)!r} holds no prompt")
    return out


def _prompt_ids(obj: Any, tokenizer: Any, where: str) -> list[int]:
    if not isinstance(obj, dict):
        raise EvaluateError(f"{where}: expected a JSON object")
    if "prompt_token_ids" in obj:
        ids = obj["prompt_token_ids"]
        if not (isinstance(ids, list) and ids and all(isinstance(i, int) and i >= 0 for i in ids)):
            raise EvaluateError(f"{where}: prompt_token_ids must be a non-empty list of non-negative ints")
        return ids
    if isinstance(obj.get("prompt"), str):
        return list(tokenizer(obj["prompt"], add_special_tokens=True)["input_ids"])
    turns = obj.get("messages", obj.get("conversations"))
    if isinstance(turns, list) and turns:
        upto = []
        for t in turns:
            if not isinstance(t, dict) or "role" not in t:
                raise EvaluateError(f"{where}: each turn needs a role and content")
            if t["role"] == "assistant":
                break
            upto.append({"role": t["role"], "content": t.get("content", "")})
        if not upto:
            raise EvaluateError(f"{where}: the conversation starts with an assistant turn")
        return list(tokenizer.apply_chat_template(upto, add_generation_prompt=True, tokenize=True))
    raise EvaluateError(f"{where}: needs prompt_token_ids, prompt or messages/conversations")


def serving_unsupported() -> str | None:
    """Why an EAGLE-3 draft cannot be served by the installed vLLM here (None when it can):
    without CUDA, vLLM's CPU runner refuses speculative decoding and spec-compat's CPU
    serving patches cover vLLM >=0.15,<0.17 only."""
    import torch

    if torch.cuda.is_available():
        return None
    from .. import REGISTRY
    from ..core.versions import installed_version

    needed, why = REGISTRY.get("cpu-runner-speculative-config").needed()
    if needed:
        return None
    return (f"vLLM {installed_version('vllm')}'s CPU platform has no speculative decoding and spec-compat's "
            f"CPU serving patches do not cover it ({why}); serve on a GPU, or on CPU with vLLM 0.15/0.16")


def evaluate(target: str | os.PathLike[str], draft: str | os.PathLike[str], prompts: str | None = None,
             k: int = 3, max_tokens: int = 64, max_model_len: int = 2048, limit: int | None = None,
             eager: bool = True, seed: int = 0, ignore_eos: bool = True,
             trust_remote_code: bool = False) -> EvalResult:
    """Greedy outputs with and without the draft; lossless check and acceptance counters."""
    import spec_compat  # noqa: F401  (registry applied in this process; the plugin does the engine's)

    if k < 1:
        raise EvaluateError(f"--k must be at least 1, got {k}")
    if max_tokens < 1:
        raise EvaluateError(f"--max-tokens must be at least 1, got {max_tokens}")
    model_dir(target, "target")
    ddir = model_dir(draft, "draft")
    eagle3_draft(ddir)
    tdir, trust = checked_target(target, "target", trust_remote_code)
    unsupported = serving_unsupported()
    if unsupported:
        raise EvaluateError(unsupported)
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(tdir), trust_remote_code=trust)
    ids = load_prompts(prompts, tok, limit)
    too_long = [i for i, p in enumerate(ids) if len(p) + max_tokens > max_model_len]
    if too_long:
        raise EvaluateError(f"{len(too_long)} prompts do not fit max_model_len {max_model_len} with "
                            f"{max_tokens} new tokens (first: prompt {too_long[0]}, {len(ids[too_long[0]])} tokens)")
    base_kw = engine_kwargs(tdir, trust, max_model_len, eager, seed)
    spec_kw = dict(base_kw, speculative_config={"method": "eagle3", "model": str(ddir),
                                                "num_speculative_tokens": int(k)})
    with engine_settings(tdir, trust):
        # speculative run first: a draft or engine that cannot serve fails before the reference run
        spec, before, after, t_spec = generate(spec_kw, ids, max_tokens, ignore_eos)
        base, _, _, t_base = generate(base_kw, ids, max_tokens, ignore_eos)
    return summarise(base, spec, before, after, k, {"no_spec": round(t_base, 3), "spec": round(t_spec, 3)})


def summarise(base: list[list[int]], spec: list[list[int]], before: dict[str, Any], after: dict[str, Any],
              k: int, seconds: dict[str, float] | None = None) -> EvalResult:
    """Counters (after - before) and the lossless comparison as an :class:`EvalResult`."""
    def delta(name: str) -> int:
        return int(after.get(name, 0)) - int(before.get(name, 0))

    drafts, draft_tokens, accepted = delta("num_drafts"), delta("num_draft_tokens"), delta("num_accepted_tokens")
    pos_after = list(after.get("num_accepted_tokens_per_pos") or [0] * k)
    pos_before = list(before.get("num_accepted_tokens_per_pos") or [0] * len(pos_after))
    per_pos = [int(a) - int(b) for a, b in zip(pos_after, pos_before)]
    mismatch = None
    for i, (a, b) in enumerate(zip(base, spec)):
        if a != b:
            j = next((n for n, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
            mismatch = {"prompt": i, "position": j}
            break
    output_tokens = sum(len(s) for s in spec)
    from_outputs = None
    if "output_steps" in after and "output_tokens" in after:
        steps = delta("output_steps")
        kept = output_tokens - len(spec) - steps
        from_outputs = {"decode_steps": steps, "generation_tokens": delta("output_tokens"),
                        "accepted_tokens_min": kept, "accepted_tokens_max": kept + k * len(spec)}
    return EvalResult(
        lossless=mismatch is None and len(base) == len(spec),
        drafts=drafts, draft_tokens=draft_tokens, accepted_tokens=accepted,
        acceptance_rate=accepted / draft_tokens if draft_tokens else 0.0,
        mean_acceptance_length=1.0 + accepted / drafts if drafts else 1.0,
        per_position=[n / drafts if drafts else 0.0 for n in per_pos],
        per_position_accepted=per_pos, k=k, prompts=len(base),
        output_tokens=output_tokens, first_mismatch=mismatch, seconds=seconds or {}, from_outputs=from_outputs)


def table(res: EvalResult) -> str:
    pos = "  ".join(f"{i + 1}: {r:.3f} ({n})" for i, (r, n) in
                    enumerate(zip(res.per_position, res.per_position_accepted)))
    lossless = "yes (greedy outputs identical with and without the draft)" if res.lossless else \
        f"NO - outputs differ (first at prompt {res.first_mismatch['prompt']}, token {res.first_mismatch['position']})" \
        if res.first_mismatch else "NO"
    rows = [
        ("prompts", f"{res.prompts} ({res.output_tokens} output tokens), k = {res.k}"),
        ("lossless", lossless),
        ("drafts", str(res.drafts)),
        ("draft tokens", str(res.draft_tokens)),
        ("accepted tokens", str(res.accepted_tokens)),
        ("acceptance rate", f"{res.acceptance_rate:.3f}"),
        ("mean acceptance length", f"{res.mean_acceptance_length:.3f}"),
        ("per position", pos),
    ]
    if res.from_outputs:
        f = res.from_outputs
        rows.append(("decode steps (outputs)", f"{f['decode_steps']} ({f['generation_tokens']} tokens delivered; "
                     f"accepted tokens implied {f['accepted_tokens_min']}..{f['accepted_tokens_max']})"))
    if res.seconds:
        rows.append(("generate wall time (s)", ", ".join(f"{k} {v}" for k, v in res.seconds.items())))
    return "\n".join(f"{a:<24}{b}" for a, b in rows)
