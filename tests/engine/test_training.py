"""Training on CPU with the stock speculators trainer, on data the stock generator
extracted from each fixture (``spec-compat demo``), and proof that each training
shim is what makes it work (the same step in a fresh process with only that shim
disabled fails, or trains on the wrong thing).
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

MODELS = ("llama", "kimi-k25")

def _run(args: list[str], disable: str | None = None, timeout: int = 1200) -> subprocess.CompletedProcess:
    env = dict(os.environ)
    env.pop("SPEC_COMPAT_DISABLE", None)
    if disable:
        env["SPEC_COMPAT_DISABLE"] = disable
    return subprocess.run([sys.executable, *args], env=env, capture_output=True, text=True, timeout=timeout,
                          cwd=str(ROOT))


def _result(proc: subprocess.CompletedProcess) -> dict:
    for line in reversed(proc.stdout.splitlines()):
        if line.startswith("SPEC_COMPAT_RESULT "):
            return json.loads(line.split(" ", 1)[1])
    raise AssertionError(f"no result (rc={proc.returncode}):\n{proc.stderr[-3000:]}")


def _step(step: str, disable: str | None = None, **kwargs) -> subprocess.CompletedProcess:
    return _run([str(TRAINING_STEPS), step, json.dumps({k: str(v) if isinstance(v, Path) else v
                                                            for k, v in kwargs.items()})], disable=disable)


def _needed(pid: str) -> None:
    import spec_compat

    spec_compat.apply()
    patch = REGISTRY.get(pid)
    ok, why = patch.needed()
    if not ok:
        pytest.skip(f"{pid} is not needed in this environment ({why})")


@pytest.mark.parametrize("model", MODELS)
def test_demo_trains_draft_whose_loss_drops(demo, model):
    res = demo(model)
    losses = res["losses"]
    assert len(losses) >= 10, losses
    first, last = sum(losses[:3]) / 3, sum(losses[-3:]) / 3
    # a clear margin: the draft learns the repetitive chat data
    assert last < 0.8 * first, f"loss {first:.3f} -> {last:.3f}"
    assert res["val_losses"] and res["val_losses"][-1] < res["val_losses"][0], res["val_losses"]
    assert res["samples"] == 64 and res["tokens"] > 5000


@pytest.mark.parametrize("model", MODELS)
def test_saved_draft_reloads_and_names_its_aux_layers(demo, model):
    res = demo(model)
    # captured outputs of layers 0,1,2 (+ target 3) = inputs of layers 1,2,3 in vLLM's convention
    assert res["layer_ids"] == [0, 1, 2, 3]
    assert res["aux_layer_ids"] == [1, 2, 3]
    cfg = json.loads((Path(res["draft_dir"]) / "config.json").read_text())
    assert cfg["eagle_aux_hidden_state_layer_ids"] == [1, 2, 3]
    reload = _result(_step("reload", path=res["draft_dir"]))
    assert reload["aux"] == [1, 2, 3]
    assert reload["draft_vocab"] == cfg["draft_vocab_size"]


@pytest.mark.parametrize("model", MODELS)
def test_vllm_reads_the_aux_layers_from_the_saved_draft(demo, model):
    """What vLLM's EAGLE-3 path reads (``hf_config.eagle_aux_hidden_state_layer_ids``,
    gpu_model_runner) after its speculators-format config parser loaded the draft."""
    pytest.importorskip("vllm")
    from vllm.transformers_utils.config import get_config

    from spec_compat import installed_versions
    from spec_compat.core.versions import in_range

    if in_range(installed_versions()["vllm"], "<0.15"):
        # checked on vLLM 0.11.0: its SpeculatorsConfig has no eagle_aux_hidden_state_layer_ids
        # (None), so vLLM there would serve the draft with its default aux layers
        pytest.xfail("vLLM < 0.15's speculators config parser drops eagle_aux_hidden_state_layer_ids")
    res = demo(model)
    hf = get_config(res["draft_dir"], trust_remote_code=False)
    assert list(hf.eagle_aux_hidden_state_layer_ids) == [1, 2, 3]


def test_kimi_draft_layer_is_sized_from_the_text_model(demo, fixture_dir):
    res = demo("kimi-k25")
    layer = json.loads((Path(res["draft_dir"]) / "config.json").read_text())["transformer_layer_config"]
    text = json.loads((fixture_dir("kimi-k25") / "config.json").read_text())["text_config"]
    assert layer["hidden_size"] == text["hidden_size"]
    assert layer["vocab_size"] == text["vocab_size"]
    # hidden / heads, not DeepseekV3Config.head_dim (= qk_rope_head_dim)
    assert layer["head_dim"] == text["hidden_size"] // text["num_attention_heads"] != text["qk_rope_head_dim"]


# -- each shim is what fixes its failure --------------------------------------------------

@pytest.mark.parametrize("pid", proof_cases("test_training_fails_without_shim"))
def test_training_fails_without_shim(demo, tmp_path, prove, pid):
    proof = prove(pid)
    _needed(pid)
    res = demo(proof.proof.using)
    args = dict(model_dir=res["model_dir"], data_dir=res["data_dir"], vocab_dir=res["vocab_dir"], epochs=1)
    off = _step("train", disable=proof.disable, save=tmp_path / "off", **args)
    assert off.returncode != 0, f"training succeeded with {pid} disabled"
    proof.assert_symptom(off.stderr)
    on = _step("train", disable=proof.baseline, save=tmp_path / "on", **args)
    assert on.returncode == 0, on.stderr[-3000:]
    proof.assert_absent(on.stderr)
    assert len(_result(on)["losses"]) > 0


@pytest.mark.parametrize("pid", proof_cases("test_draft_names_no_aux_layers_without_shim"))
def test_draft_names_no_aux_layers_without_shim(demo, tmp_path, prove, pid):
    proof = prove(pid)
    _needed(pid)
    res = demo("llama")
    off = _step("train", disable=proof.disable, model_dir=res["model_dir"], data_dir=res["data_dir"],
                vocab_dir=res["vocab_dir"], save=tmp_path / "off", epochs=1)
    assert off.returncode == 0, off.stderr[-3000:]

    def named(config: Path) -> str:
        value = json.loads(config.read_text()).get("eagle_aux_hidden_state_layer_ids")
        return f"eagle_aux_hidden_state_layer_ids: {value}"

    # vLLM would fall back to its default aux layers (2, n//2, n-3) for the stock draft
    proof.assert_symptom(named(tmp_path / "off" / "0" / "config.json"), report=True)
    on = named(Path(res["draft_dir"]) / "config.json")  # the demo's draft, every patch on
    proof.assert_absent(on, report=True)
    assert on == "eagle_aux_hidden_state_layer_ids: [1, 2, 3]", on


def _targets_signature(r: dict) -> str:
    """What the verifier_lm_head targets were computed from (distances from the step's JSON)."""
    if r["vs_raw"] < 1e-6 and r["vs_final_norm"] > 0.1:
        return "targets equal verifier_lm_head(last layer) without the final norm"
    if r["vs_final_norm"] < 1e-5 and r["vs_raw"] > 0.1:
        return "targets equal verifier_lm_head(final_norm(last layer))"
    return f"targets match neither: {r}"  # NaN compares False: lands here


@pytest.mark.parametrize("pid", proof_cases("test_targets_use_the_final_norm"))
def test_targets_use_the_final_norm(demo, prove, pid):
    """O7: the frozen verifier_lm_head must see norm(last layer), as the verifier's own lm_head does."""
    proof = prove(pid)
    res = demo("llama")
    args = dict(model_dir=res["model_dir"], data_dir=res["data_dir"], vocab_dir=res["vocab_dir"])
    on = _targets_signature(_result(_step("targets", disable=proof.baseline, **args)))
    assert on == "targets equal verifier_lm_head(final_norm(last layer))", on
    proof.assert_absent(on, report=True)
    _needed(pid)
    off = _targets_signature(_result(_step("targets", disable=proof.disable, **args)))  # speculators 0.3.0 stock
    proof.assert_symptom(off, report=True)


@pytest.mark.parametrize("pid", proof_cases("test_resume_without_cuda_needs_shim"))
def test_resume_without_cuda_needs_shim(demo, tmp_path, prove, pid):
    proof = prove(pid)
    _needed(pid)
    res = demo("llama")
    args = dict(model_dir=res["model_dir"], data_dir=res["data_dir"], vocab_dir=res["vocab_dir"])
    first = _step("train", save=tmp_path / "ck", epochs=1, **args)
    assert first.returncode == 0, first.stderr[-3000:]
    off = _step("train", disable=proof.disable, save=tmp_path / "ck", epochs=2, resume=True, **args)
    assert off.returncode != 0
    proof.assert_symptom(off.stderr)
    on = _step("train", disable=proof.baseline, save=tmp_path / "ck", epochs=2, resume=True, **args)
    assert on.returncode == 0, on.stderr[-3000:]
    proof.assert_absent(on.stderr)
    assert (tmp_path / "ck" / "1" / "model.safetensors").is_file()
    # resumed at epoch 1 from the saved weights: one epoch of steps (the sampler packs each epoch
    # differently, so +-1 step), starting near where the first run ended, not at the untrained loss
    before, after = _result(first)["losses"], _result(on)["losses"]
    assert 0.5 * len(before) < len(after) < 1.5 * len(before), (len(before), len(after))
    assert after[0] < 0.6 * before[0], (before[0], before[-1], after[0])


@pytest.mark.parametrize("pid", proof_cases("test_reload_needs_shim"))
def test_reload_needs_shim(demo, prove, pid):
    proof = prove(pid)
    _needed(pid)
    res = demo("llama")
    off = _step("reload", disable=proof.disable, path=res["draft_dir"])
    assert off.returncode != 0, "speculators' loader reloaded the draft without the shim"
    proof.assert_symptom(off.stderr)
    on = _step("reload", disable=proof.baseline, path=res["draft_dir"])
    assert on.returncode == 0, on.stderr[-3000:]
    proof.assert_absent(on.stderr)
    assert _result(on)["aux"] == [1, 2, 3]


@pytest.mark.parametrize("pid", proof_cases("test_torchrun_two_cpu_ranks_fsdp"))
def test_torchrun_two_cpu_ranks_fsdp(demo, tmp_path, prove, pid):
    """The FSDP path (torchrun, 2 ranks, gloo) on CPU; without fsdp-without-cuda it cannot start."""
    proof = prove(pid)
    _needed(pid)
    res = demo("llama")
    args = json.dumps({"model_dir": res["model_dir"], "data_dir": res["data_dir"], "vocab_dir": res["vocab_dir"],
                       "save": str(tmp_path / "fsdp"), "epochs": 1})
    cmd = ["-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_port", "29517",
           str(TRAINING_STEPS), "train", args]
    on = _run(cmd, disable=proof.baseline)
    assert on.returncode == 0, on.stderr[-4000:]
    proof.assert_absent(on.stderr)
    assert (tmp_path / "fsdp" / "0" / "model.safetensors").is_file()
    assert json.loads((tmp_path / "fsdp" / "0" / "config.json").read_text())["eagle_aux_hidden_state_layer_ids"] == [1, 2, 3]
    off = _run(cmd[:-1] + [args.replace("fsdp", "fsdp-off")], disable=proof.disable)
    assert off.returncode != 0
    proof.assert_symptom(off.stderr)


@pytest.mark.parametrize("pid", proof_cases("test_data_config_metadata_without_accelerator_needs_shim"))
def test_data_config_metadata_without_accelerator_needs_shim(prove, pid):
    """speculators 0.4.x names the GPU in data_config.json through torch.accelerator, which a CUDA
    build of torch reports without a GPU: the stock step after extraction raises."""
    proof = prove(pid)
    _needed(pid)
    code = ("import spec_compat; from speculators.data_generation import config_generator as c; "
            "print('SPEC_COMPAT_RESULT ' + __import__('json').dumps(c._get_gpu_info()))")
    on = _run(["-c", code], disable=proof.baseline)
    assert _result(on) == "CPU ONLY"
    proof.assert_absent(on.stderr)
    off = _run(["-c", code], disable=proof.disable)
    assert off.returncode != 0
    proof.assert_symptom(off.stderr)
