"""Stock speculators 0.3.0 extraction on the real engine equals a transformers
forward of the same weights (fp32, max |diff| <= 1e-5) with exact row counts."""

from __future__ import annotations

import pytest

from spec_compat.selftest import TOLERANCE, compare, workloads

pytestmark = pytest.mark.engine
WORKLOADS = workloads(vocab=512, seed=0)


@pytest.fixture(scope="module")
def engine(llama_dir):
    from speculators.data_generation.vllm_hidden_states_generator import VllmHiddenStatesGenerator

    from spec_compat.reference import load_reference_model
    from spec_compat.testing import pinned_dtype

    layer_ids = [0, 1, 2, 3]
    with pinned_dtype("float32"):
        gen = VllmHiddenStatesGenerator(str(llama_dir), layer_ids=layer_ids, max_model_len=2048)
    ref = load_reference_model(str(llama_dir))
    yield gen, ref, layer_ids
    gen.executor.shutdown()


@pytest.mark.parametrize("name", list(WORKLOADS))
def test_matches_transformers(engine, name):
    from spec_compat.reference import reference_states

    gen, ref, layer_ids = engine
    for batch in WORKLOADS[name]:
        results = gen.generate(batch)
        ok, worst, detail = compare(results, batch, layer_ids, lambda ids: reference_states(ref, ids, layer_ids))
        print(f"{name}: {detail}")
        assert ok, detail
        assert worst <= TOLERANCE
        for res, ids in zip(results, batch):
            assert [h.shape[0] for h in res["hidden_states"]] == [len(ids)] * len(layer_ids)


def test_chunked_batch_splits_a_prompt_while_new_ones_join(engine):
    """The 8x2000 workload must produce the step layout that exposes F10: a prompt
    continues its chunked prefill in a step where new prompts are scheduled too.
    (5x2000 does not.)  Values stay exact in that layout."""
    from spec_compat.reference import reference_states

    gen, ref, layer_ids = engine
    steps = []
    schedule = gen.scheduler.schedule

    def recording_schedule():
        out = schedule()
        steps.append((dict(out.num_scheduled_tokens), {r.req_id for r in out.scheduled_new_reqs}))
        return out

    gen.scheduler.schedule = recording_schedule
    try:
        batch = WORKLOADS["chunked-8x2000"][0]
        results = gen.generate(batch)
    finally:
        del gen.scheduler.schedule
    mixed = [s for s, new in steps if new and set(s) - new]
    assert mixed, f"no step mixed a continuing prompt with new ones: {steps}"
    ok, _, detail = compare(results, batch, layer_ids, lambda ids: reference_states(ref, ids, layer_ids))
    assert ok, detail
