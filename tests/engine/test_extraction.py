"""Stock speculators extraction on the real engine equals a transformers forward
of the same weights (fp32, max |diff| <= 1e-5) with exact row counts, for the
Llama fixture and the Kimi-K2.5 fixture (KimiK25ForConditionalGeneration, MLA
with VLLM_MLA_DISABLE=1 on CPU, MoE, yarn; reference DeepseekV3ForCausalLM)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from spec_compat.cli.selftest import compare, workloads

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "support"))
from extraction_rows import assert_rows_match  # noqa: E402

pytestmark = pytest.mark.engine
WORKLOADS = workloads(vocab=512, seed=0)


MODELS = ["llama", "kimi-k25"]


@pytest.fixture(scope="module", params=MODELS)
def engine(request, fixture_dir):
    from speculators.data_generation.vllm_hidden_states_generator import VllmHiddenStatesGenerator
    from transformers import AutoConfig

    from spec_compat.verify.reference import load_reference_model
    from spec_compat.verify.settings import preferring_non_mla
    from spec_compat.verify.settings import pinned_dtype

    model_dir = str(fixture_dir(request.param))
    cfg = AutoConfig.from_pretrained(model_dir, trust_remote_code=True)
    with preferring_non_mla(getattr(cfg, "text_config", cfg)):
        layer_ids = [0, 1, 2, 3]
        with pinned_dtype("float32"):
            gen = VllmHiddenStatesGenerator(model_dir, layer_ids=layer_ids, max_model_len=2048)
        ref = load_reference_model(model_dir)
        yield gen, ref, layer_ids
        gen.executor.shutdown()


@pytest.mark.parametrize("name", list(WORKLOADS))
def test_matches_transformers(engine, name):
    gen, ref, layer_ids = engine
    assert_rows_match(gen, ref, layer_ids, WORKLOADS[name], name)


def test_chunked_batch_runs_out_of_input_order(engine):
    """The 8x2000 workload must make the engine run rows out of input order (what
    exposes F10): on vLLM >= 0.11.1 a prompt continues its chunked prefill in a step
    where new prompts join; on 0.11.0 deferred prompts come back in reverse.
    (5x2000 does not.)  Values stay exact in that layout."""
    from spec_compat.verify.reference import reference_states

    gen, ref, layer_ids = engine
    steps = []
    schedule = gen.scheduler.schedule

    def recording_schedule():
        out = schedule()
        steps.append(list(out.num_scheduled_tokens))
        return out

    gen.scheduler.schedule = recording_schedule
    try:
        batch = WORKLOADS["chunked-8x2000"][0]
        results = gen.generate(batch)
    finally:
        del gen.scheduler.schedule
    executed = [rid for step in steps for rid in step]
    in_input_order = sorted(set(executed), key=lambda rid: int(rid.rsplit("_", 1)[1]))
    assert executed != in_input_order, f"rows ran in input order, F10 not exercised: {steps}"
    ok, _, detail = compare(results, batch, layer_ids, lambda ids: reference_states(ref, ids, layer_ids))
    assert ok, detail


def test_kimi_router_has_no_near_ties(engine):
    """fp32 comparisons of a MoE are only meaningful if top-k routing is stable:
    for every token of the workloads, the k-th and (k+1)-th expert scores (bias
    included) are far apart compared with fp32 noise."""
    import torch

    gen, ref, _ = engine
    cfg = ref.config
    if not getattr(cfg, "n_routed_experts", None):
        pytest.skip("not a MoE fixture")
    assert getattr(cfg, "n_group", 1) == 1, "margin below assumes no group-limited routing"
    k = cfg.num_experts_per_tok
    margins = []

    def pre_hook(gate, args):
        x = args[0].reshape(-1, args[0].shape[-1]).float()
        scores = torch.sigmoid(x @ gate.weight.float().T) + gate.e_score_correction_bias.float()
        top = scores.topk(k + 1, dim=-1).values
        margins.append((top[:, k - 1] - top[:, k]).min().item())

    handles = [m.register_forward_pre_hook(pre_hook) for n, m in ref.named_modules() if n.endswith("mlp.gate")]
    assert handles, "no MoE gates found"
    try:
        with torch.no_grad():
            for calls in WORKLOADS.values():
                for ids in calls[0]:
                    ref(torch.tensor([ids]))
    finally:
        for h in handles:
            h.remove()
    print(f"min top-{k} margin over {len(margins)} gate calls: {min(margins):.3f}")
    assert min(margins) > 1e-2
