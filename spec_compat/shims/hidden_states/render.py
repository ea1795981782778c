"""The answer of ``POST /v1/chat/completions/render`` as speculators >= 0.8 reads it.

vLLM 0.15/0.16 render a chat request to ``[conversation, engine_prompts]`` and truncate on the
tokenizer's side; vLLM >= 0.18 answers one object with ``token_ids`` and takes
``truncation_side`` ("right" keeps the first N tokens, "left" the last N).  These helpers
read the request's truncation, pick the token ids out of the old answer and cut them.
Pure Python; imports nothing of vLLM.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

SIDES = ("left", "right")
ID = "ehs-render-token-ids"


class RenderRequestError(ValueError):
    """The request asks for something the render cannot do (answered with HTTP 400)."""


@dataclass(frozen=True)
class Truncation:
    """``truncate_prompt_tokens`` (None: keep all; -1: the model's input limit) and the side."""

    tokens: int | None
    side: str | None

    def apply(self, ids: list[int], default_side: str, limit: int | None) -> list[int]:
        """``ids`` cut to ``tokens`` on ``side`` (the tokenizer's ``default_side`` when the
        request names none, as vLLM >= 0.18 does); ``-1`` means ``limit``."""
        n = limit if self.tokens == -1 else self.tokens
        if n is None or n >= len(ids):
            return ids
        side = self.side or default_side
        if n == 0:
            return []
        return ids[-n:] if side == "left" else ids[:n]


def requested_truncation(tokens: Any, extra: Mapping[str, Any] | None) -> Truncation:
    """The truncation of a render request: ``truncate_prompt_tokens`` (a field of vLLM's
    request) and ``truncation_side`` (an extra field on vLLM 0.15/0.16)."""
    side = (extra or {}).get("truncation_side")
    if side is not None and side not in SIDES:
        raise RenderRequestError(f"spec_compat[ehs-render-token-ids]: truncation_side must be 'left' or 'right', got {side!r}")
    if tokens is not None and (isinstance(tokens, bool) or not isinstance(tokens, int) or tokens < -1):
        raise RenderRequestError(f"spec_compat[ehs-render-token-ids]: truncate_prompt_tokens must be an integer >= -1, "
                                 f"got {tokens!r}")
    return Truncation(tokens, side)


def rendered_token_ids(result: Any) -> list[int]:
    """The prompt token ids of vLLM 0.15/0.16's render result ``(conversation, engine_prompts)``
    (one engine prompt for a chat request); ValueError naming what differs."""
    if not isinstance(result, Sequence) or len(result) != 2:
        raise ValueError(f"spec_compat[ehs-render-token-ids]: the render returned {type(result).__name__}, "
                         "not (conversation, engine_prompts)")
    prompts = result[1]
    if not isinstance(prompts, Sequence) or len(prompts) != 1:
        n = len(prompts) if isinstance(prompts, Sequence) else type(prompts).__name__
        raise ValueError(f"spec_compat[ehs-render-token-ids]: a chat render gave {n} engine prompts, not one")
    prompt = prompts[0]
    if not isinstance(prompt, Mapping) or "prompt_token_ids" not in prompt:
        has = sorted(prompt) if isinstance(prompt, Mapping) else type(prompt).__name__
        raise ValueError(f"spec_compat[ehs-render-token-ids]: the engine prompt has no prompt_token_ids (has {has})")
    ids = prompt["prompt_token_ids"]
    if not isinstance(ids, Sequence) or isinstance(ids, (str, bytes)):
        raise ValueError(f"spec_compat[ehs-render-token-ids]: the engine prompt's prompt_token_ids is {type(ids).__name__}, "
                         "not a list of ids")
    return [int(t) for t in ids]
