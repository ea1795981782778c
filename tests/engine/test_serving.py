"""Serving: EAGLE-3 drafts run as speculators in the real engine of this cell.

``spec-compat evaluate`` (a fresh process, default spawned engine core: the
serving shims arrive through the vLLM plugin) serves a draft greedily with and
without speculation; outputs must be identical and the acceptance counters
consistent.  Drafts: the one the demo trained (``demo`` fixture) and freshly
initialised ones (speculators' own init) as the untrained baseline.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from spec_compat import REGISTRY
from proof_runs import proof_cases  # tests/support (on sys.path: tests/conftest.py)

ROOT = Path(__file__).resolve().parents[2]
TRAINING_STEPS = ROOT / "tests" / "support" / "training_steps.py"

pytestmark = pytest.mark.engine


@pytest.fixture(autouse=True)
def _serving_possible_here(request):
    """vLLM 0.11 (and >= 0.17) on CPU cannot serve a draft: those cells skip, with the reason
    `spec-compat evaluate` gives (test_evaluate_refuses_where_serving_is_unsupported checks it)."""
    if request.node.name != "test_evaluate_refuses_where_serving_is_unsupported":
        reason = _serving_unsupported()
        if reason:
            pytest.skip(reason)


def _serving_unsupported() -> str | None:
    try:
        from spec_compat.cli.evaluate import serving_unsupported
    except ImportError:  # no torch: the engine conftest skips these tests anyway
        return None
    return serving_unsupported()


CPU_ONLY = {"cpu-runner-speculative-config", "cpu-runner-loads-drafter", "cpu-draft-token-copy",
            "cpu-rejection-sampler", "cpu-eagle-padded-batch"}
#: the short evaluation every serving proof runs (with the patch off, and once per fixture on)
PROOF_ARGS = ("--limit", "2", "--max-tokens", "16")


def run_evaluate(target: Path, draft: Path, *extra: str, disable: str | None = None, timeout: int = 900):
    env = {k: v for k, v in os.environ.items() if k != "SPEC_COMPAT_DISABLE"}
    if disable:
        env["SPEC_COMPAT_DISABLE"] = disable
    proc = subprocess.run([sys.executable, "-m", "spec_compat", "evaluate", "--target", str(target),
                           "--draft", str(draft), "--json", "--trust-remote-code", *extra], env=env, capture_output=True, text=True,
                          timeout=timeout, cwd=str(ROOT))
    res = None
    if proc.returncode == 0:
        # vLLM logs to stdout; `evaluate --json` keeps stdout for its one JSON document (vLLM's log
        # goes to stderr)
        res = json.loads(proc.stdout)
        assert "INFO" in proc.stderr, proc.stderr[-2000:]
    return proc, res


def assert_consistent(res: dict) -> None:
    """The scheduler's spec-decode counters agree with each other (vLLM proposes k tokens per
    draft; a position is accepted only after every earlier one) and with the run seen from its
    outputs (``from_outputs``: the output processor's per-request steps and the token lists), so
    evaluate's figures are checked against counts it did not compute them from."""
    k, prompts = res["k"], res["prompts"]
    print("evaluate:", json.dumps(res, sort_keys=True))
    assert res["drafts"] > 0
    assert res["draft_tokens"] == res["drafts"] * k
    assert len(res["per_position_accepted"]) == k
    assert sum(res["per_position_accepted"]) == res["accepted_tokens"]
    pos = res["per_position_accepted"]
    assert all(a >= b for a, b in zip(pos, pos[1:])), pos
    out = res["from_outputs"]
    assert out is not None, "evaluate read no output-side metrics from this vLLM"
    steps = out["decode_steps"]
    # every decode step verifies one draft: scheduler's drafts == output processor's steps
    assert res["drafts"] == steps, (res["drafts"], out)
    assert out["generation_tokens"] == res["output_tokens"], out
    # a step delivers 1 + its accepted tokens; a request's last step drops up to k past max_tokens
    kept = res["output_tokens"] - prompts - steps
    assert (out["accepted_tokens_min"], out["accepted_tokens_max"]) == (kept, kept + k * prompts), out
    assert kept <= res["accepted_tokens"] <= kept + k * prompts, (res["accepted_tokens"], out)
    # evaluate's rates within the bounds the outputs give (tokens per decode step, incl. the bonus)
    eps = 1e-9
    assert (kept + steps) / steps - eps <= res["mean_acceptance_length"] <= (kept + k * prompts + steps) / steps + eps
    assert kept / (k * steps) - eps <= res["acceptance_rate"] <= (kept + k * prompts) / (k * steps) + eps
    assert kept / steps - eps <= sum(res["per_position"]) <= (kept + k * prompts) / steps + eps


def _save_identity_vocab(out: Path, vocab: int) -> Path:
    import numpy as np

    out.mkdir(parents=True, exist_ok=True)
    np.save(out / "d2t.npy", np.zeros(vocab, dtype=np.int64))
    np.save(out / "t2d.npy", np.ones(vocab, dtype=bool))
    return out


@pytest.fixture(scope="session")
def untrained_draft(tmp_path_factory, fixture_dir):
    """``untrained_draft(model, vocab_dir=None)``: speculators' freshly initialised EAGLE-3 draft
    for a fixture (aux layers 1, 2, 3), saved in speculators' format."""
    made: dict[tuple[str, str | None], Path] = {}

    def get(model: str, vocab_dir: str | None = None) -> Path:
        key = (model, vocab_dir)
        if key not in made:
            target = fixture_dir(model)
            out = tmp_path_factory.mktemp(f"untrained-{model}")
            vocab = vocab_dir or str(_save_identity_vocab(out / "vocab", 512))
            args = {"model_dir": str(target), "vocab_dir": vocab, "out": str(out / "draft"), "aux_layer_ids": [1, 2, 3]}
            proc = subprocess.run([sys.executable, str(TRAINING_STEPS), "untrained", json.dumps(args)],
                                  capture_output=True, text=True, timeout=600, cwd=str(ROOT))
            assert proc.returncode == 0, proc.stderr[-3000:]
            made[key] = out / "draft"
        return made[key]

    return get


def _needed(pid: str) -> bool:
    return REGISTRY.get(pid).needed()[0]


def _on_cpu() -> bool:
    import torch

    return not torch.cuda.is_available()


@pytest.mark.parametrize("model", ["llama", "kimi-k25"])
def test_demo_draft_serves_losslessly(demo, model):
    ev = demo(model)["evaluation"]
    assert ev["lossless"], ev
    assert ev["prompts"] == 16 and ev["output_tokens"] == 16 * 64
    assert_consistent(ev)


def test_trained_draft_accepts_more_than_untrained(demo, untrained_draft):
    """Same prompts, same engine settings, same vocabulary mapping: the draft the demo trained
    on target-regenerated data accepts clearly more than speculators' fresh init."""
    d = demo("llama")
    trained = d["evaluation"]
    base = untrained_draft("llama", d["vocab_dir"])
    proc, untrained = run_evaluate(Path(d["model_dir"]), base)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert untrained["lossless"]
    assert_consistent(untrained)
    print(f"accepted: trained {trained['accepted_tokens']}/{trained['draft_tokens']} "
          f"(mean acceptance length {trained['mean_acceptance_length']:.3f}), untrained "
          f"{untrained['accepted_tokens']}/{untrained['draft_tokens']} ({untrained['mean_acceptance_length']:.3f})")
    assert trained["draft_tokens"] >= 1000  # enough tokens for a stable rate
    assert trained["acceptance_rate"] >= untrained["acceptance_rate"] + 0.05
    assert trained["accepted_tokens"] >= 3 * max(1, untrained["accepted_tokens"])


@pytest.mark.vllm_only
def test_deepseek_v3_target_serves_losslessly(fixture_dir, untrained_draft):
    """S1: a plain DeepSeek-V3 target (DeepseekV3ForCausalLM) serves an EAGLE-3 draft."""
    if not _needed("eagle3-deepseek-aux-states"):
        pytest.skip("this vLLM serves EAGLE-3 for DeepSeek-V3 itself")
    proc, res = run_evaluate(fixture_dir("deepseek-v3"), untrained_draft("deepseek-v3"), "--limit", "4",
                             "--max-tokens", "24")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert res["lossless"]
    assert_consistent(res)


@pytest.fixture(scope="module")
def patched_evaluate(fixture_dir, untrained_draft):
    """``patched_evaluate(fixture)``: the proofs' evaluation with every patch on, once per fixture."""
    done: dict[str, tuple] = {}

    def get(model: str):
        if model not in done:
            done[model] = run_evaluate(fixture_dir(model), untrained_draft(model), *PROOF_ARGS)
        return done[model]

    return get


@pytest.mark.vllm_only
@pytest.mark.parametrize("pid", proof_cases("test_fails_with_only_this_serving_shim_disabled"))
def test_fails_with_only_this_serving_shim_disabled(fixture_dir, untrained_draft, patched_evaluate, prove, pid):
    proof = prove(pid)
    if not _needed(pid):
        pytest.skip(f"{pid} is not needed in this environment")
    if pid in CPU_ONLY and not _on_cpu():
        pytest.skip("a CPU-platform shim")
    model = proof.proof.using
    target, draft = fixture_dir(model), untrained_draft(model)
    proc, res = run_evaluate(target, draft, *PROOF_ARGS, disable=proof.disable)
    print(proc.stdout[-2000:], proc.stderr[-3000:])
    assert proc.returncode != 0, f"evaluate passed with {pid} disabled: {res}"
    proof.assert_symptom(proc.stdout + proc.stderr)
    on, on_res = patched_evaluate(model)
    assert on.returncode == 0 and on_res["lossless"], on.stderr[-3000:]
    proof.assert_absent(on.stdout + on.stderr)


_SERVED_FEATURES = r"""
import json, sys
import torch
import spec_compat
from vllm import LLM, SamplingParams
from vllm.v1.spec_decode.eagle import EagleProposer

seen = []
orig = EagleProposer.propose
def propose(self, target_token_ids, target_positions, target_hidden_states, *a, **kw):
    if not seen:
        seen.append((target_token_ids.clone(), target_hidden_states.float().clone()))
    return orig(self, target_token_ids, target_positions, target_hidden_states, *a, **kw)
EagleProposer.propose = propose

target, draft, sample = sys.argv[1:4]
data = torch.load(sample, weights_only=True)
ids = data["input_ids"].tolist()
llm = LLM(model=target, enforce_eager=True, max_model_len=2048, seed=0,
          speculative_config={"method": "eagle3", "model": draft, "num_speculative_tokens": 3})
llm.generate([{"prompt_token_ids": ids}], SamplingParams(temperature=0, max_tokens=2), use_tqdm=False)
tok, served = seen[0]
n = min(len(ids), tok.shape[0])  # the first prefill chunk
assert tok[:n].tolist() == ids[:n], "the drafter's first call is not the prompt's prefill"
trained = [h.float() for h in data["hidden_states"]]
width = trained[0].shape[-1]
out = {"tokens": n, "features": served.shape[-1] // width}
for name, layers in (("aligned", trained[:-1]), ("one_layer_later", trained[1:])):
    ref = torch.cat(layers, dim=-1)[:n]
    out[name] = float((served[:n] - ref).abs().max())
out["scale"] = float(torch.cat(trained[:-1], dim=-1)[:n].abs().max())
print("SPEC_COMPAT_RESULT " + json.dumps(out))
"""


def test_served_features_equal_training_features(demo, tmp_path):
    """O6 end to end: the aux hidden states vLLM hands the draft at serve time are the features
    the draft was trained on (speculators' captured layer outputs), token for token."""
    d = demo("llama")
    sample = sorted(Path(d["data_dir"]).glob("data_*.pt"))[0]
    env = dict(os.environ, VLLM_ENABLE_V1_MULTIPROCESSING="0")  # the drafter runs in this process
    env.pop("SPEC_COMPAT_DISABLE", None)
    proc = subprocess.run([sys.executable, "-c", _SERVED_FEATURES, d["model_dir"], d["draft_dir"], str(sample)],
                          env=env, capture_output=True, text=True, timeout=600, cwd=str(tmp_path))
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(next(ln for ln in proc.stdout.splitlines()
                          if ln.startswith("SPEC_COMPAT_RESULT "))[len("SPEC_COMPAT_RESULT "):])
    print(out)
    assert out["features"] == 3 and out["tokens"] > 100
    # same tokens, same engine dtype: equal up to batch-shape rounding; one layer off is far away
    assert out["aligned"] <= 0.02 * out["scale"], out
    assert out["one_layer_later"] >= 10 * max(out["aligned"], 1e-6), out


def test_evaluate_refuses_where_serving_is_unsupported(tmp_path):
    """Where vLLM cannot serve a draft on this platform, `evaluate` says so once its inputs are
    checked and before starting vLLM (exit 2, the reason in one line) instead of vLLM's
    assertion from the engine process."""
    reason = _serving_unsupported()
    if not reason:
        pytest.skip("this vLLM serves EAGLE-3 drafts on this platform")
    target, draft = tmp_path / "target", tmp_path / "draft"
    for d, cfg in ((target, {"model_type": "llama"}), (draft, {"speculators_model_type": "eagle3"})):
        d.mkdir()
        (d / "config.json").write_text(json.dumps(cfg))
    proc, _ = run_evaluate(target, draft)
    assert proc.returncode == 2, proc.stderr[-3000:]
    assert "has no speculative decoding" in proc.stderr
