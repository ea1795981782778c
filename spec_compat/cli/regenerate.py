"""The demo's first step: rewrite the assistant turns of a chat dataset with the target itself
(greedy, turn by turn, vLLM), as real EAGLE-3 pipelines do before extraction so the draft learns
the target's own distribution."""

from __future__ import annotations

import json
import os
from pathlib import Path

from .checkpoints import checked_target
from .engine_runs import engine_kwargs, engine_settings, shutdown
from .evaluate import EvaluateError


def regenerate_chats(target: str | os.PathLike[str], src: str | os.PathLike[str], dst: str | os.PathLike[str],
                     max_tokens: int = 96, max_model_len: int = 2048, eager: bool = True, seed: int = 0,
                     trust_remote_code: bool = False) -> dict[str, int]:
    """Rewrite every assistant turn of a chat jsonl (``conversations`` or ``messages``) with the
    target's own greedy reply to the conversation so far (earlier turns already regenerated).
    Writes ``dst`` (must not exist); returns counts.  ``trust_remote_code``: the target's own code
    may run (the demo passes it for the fixture it wrote)."""
    import spec_compat  # noqa: F401

    tdir, trust = checked_target(target, "target", trust_remote_code)
    src_p, dst_p = Path(src), Path(dst)
    if not src_p.is_file():
        raise EvaluateError(f"chat data {str(src_p)!r} not found")
    if dst_p.exists():
        raise EvaluateError(f"{str(dst_p)!r} exists: nothing is overwritten")
    rows = []
    for n, line in enumerate(src_p.read_text().splitlines(), 1):
        if line.strip():
            try:
                rows.append(json.loads(line))
            except ValueError as exc:
                raise EvaluateError(f"{src_p}:{n}: not JSON: {exc}") from None
    key = lambda r: "conversations" if "conversations" in r else "messages"  # noqa: E731
    from transformers import AutoTokenizer
    from vllm import LLM, SamplingParams

    tok = AutoTokenizer.from_pretrained(str(tdir), trust_remote_code=trust)
    with engine_settings(tdir, trust):
        llm = LLM(**dict(engine_kwargs(tdir, trust, max_model_len, eager, seed), disable_log_stats=True))
        params = SamplingParams(temperature=0.0, max_tokens=max_tokens)
        turns = replies = tokens = 0
        try:
            depth = max((len(r.get(key(r), [])) for r in rows), default=0)
            for i in range(depth):
                todo = [r for r in rows if i < len(r.get(key(r), [])) and r[key(r)][i].get("role") == "assistant"]
                if not todo:
                    continue
                prompts = [tok.apply_chat_template([{"role": t["role"], "content": t["content"]} for t in r[key(r)][:i]],
                                                   add_generation_prompt=True, tokenize=True) for r in todo]
                outs = llm.generate([{"prompt_token_ids": list(p)} for p in prompts], params, use_tqdm=False)
                for r, o in zip(todo, outs):
                    r[key(r)][i] = dict(r[key(r)][i], content=tok.decode(o.outputs[0].token_ids, skip_special_tokens=True))
                    tokens += len(o.outputs[0].token_ids)
                turns += 1
                replies += len(todo)
        finally:
            shutdown(llm)
    dst_p.parent.mkdir(parents=True, exist_ok=True)
    dst_p.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return {"conversations": len(rows), "replies": replies, "tokens": tokens, "turn_rounds": turns}
