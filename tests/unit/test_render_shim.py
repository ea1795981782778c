"""The render answer's helpers (spec_compat/patches/hidden_states/ehs_render_token_ids.py): truncation as vLLM >= 0.18
reads ``truncate_prompt_tokens`` / ``truncation_side``, token ids out of vLLM 0.15/0.16's
``(conversation, engine_prompts)``, and the errors for what cannot be answered."""

from __future__ import annotations

import pytest

from spec_compat.patches.hidden_states.ehs_render_token_ids import (
    RenderRequestError, Truncation, rendered_token_ids, requested_truncation,
)

IDS = list(range(100, 120))


@pytest.mark.parametrize("tokens,side,default,want", [
    (None, None, "left", IDS),
    (None, "right", "left", IDS),
    (5, "right", "left", IDS[:5]),          # keeps the head (speculators' request)
    (5, "left", "right", IDS[-5:]),         # keeps the tail
    (5, None, "right", IDS[:5]),            # no side: the tokenizer's
    (5, None, "left", IDS[-5:]),
    (20, "right", "left", IDS),             # exactly the length: nothing cut
    (50, "left", "left", IDS),
    (0, "right", "left", []),
    (-1, "right", "left", IDS[:8]),         # -1: the model's limit (8 here)
])
def test_truncation(tokens, side, default, want):
    assert Truncation(tokens, side).apply(list(IDS), default, limit=8) == want


def test_minus_one_without_a_limit_keeps_all():
    assert Truncation(-1, "left").apply(list(IDS), "right", limit=None) == IDS


def test_requested_truncation_reads_the_extra_field():
    assert requested_truncation(7, {"truncation_side": "right"}) == Truncation(7, "right")
    assert requested_truncation(None, None) == Truncation(None, None)
    assert requested_truncation(3, {}) == Truncation(3, None)


@pytest.mark.parametrize("tokens,extra,message", [
    (5, {"truncation_side": "middle"}, r"truncation_side must be 'left' or 'right', got 'middle'"),
    (5, {"truncation_side": 1}, r"truncation_side must be 'left' or 'right', got 1"),
    (-2, {}, r"truncate_prompt_tokens must be an integer >= -1, got -2"),
    ("5", {}, r"truncate_prompt_tokens must be an integer >= -1, got '5'"),
    (True, {}, r"truncate_prompt_tokens must be an integer >= -1, got True"),
])
def test_bad_truncation_is_a_request_error(tokens, extra, message):
    with pytest.raises(RenderRequestError, match=r"spec_compat\[ehs-render-token-ids\]: " + message):
        requested_truncation(tokens, extra)
    assert issubclass(RenderRequestError, ValueError)


def test_token_ids_of_the_old_answer():
    conversation = [{"role": "user", "content": "hi"}]
    assert rendered_token_ids((conversation, [{"prompt_token_ids": [1, 2, 3]}])) == [1, 2, 3]
    assert rendered_token_ids([conversation, [{"prompt_token_ids": (4,), "prompt": "x"}]]) == [4]


@pytest.mark.parametrize("result,message", [
    ({"token_ids": [1]}, r"the render returned dict, not \(conversation, engine_prompts\)"),
    (([], [{"prompt_token_ids": [1]}, {"prompt_token_ids": [2]}]), r"a chat render gave 2 engine prompts, not one"),
    (([], []), r"a chat render gave 0 engine prompts, not one"),
    (([], [{"prompt": "text"}]), r"the engine prompt has no prompt_token_ids \(has \['prompt'\]\)"),
    (([], [{"prompt_token_ids": "abc"}]), r"the engine prompt's prompt_token_ids is str, not a list of ids"),
    (([], ["text"]), r"the engine prompt has no prompt_token_ids \(has str\)"),
    (([], None), r"a chat render gave NoneType engine prompts"),
])
def test_unexpected_answers_name_what_differs(result, message):
    with pytest.raises(ValueError, match=r"spec_compat\[ehs-render-token-ids\]: " + message):
        rendered_token_ids(result)
