"""hs-connectors 0.9.0's fp8 backend, unmodified, on the backported server (vLLM 0.15/0.16).

The server runs speculators' launch command with the ``--kv_transfer_config`` that hs-connectors'
own ``FP8Backend.build_kv_transfer_config`` builds (``FP8HiddenStatesConnector`` from
``hs_connectors.fp8_hidden_states_connector``); the client is stock speculators 0.9.0
(``prepare-data``, ``generate-offline-data`` with 32 requests in flight, ``train
--hidden-states-backend fp8``).  Rows: 40 prompts of 8-300 tokens (several chunked-prefill steps,
a shared 3-block prefix, more requests than one scheduler step takes).

Checked: each file is hs-connectors' layout (``hidden_states`` float8_e4m3fn [T, L, H],
``hidden_states_scales`` float32 [T, 1, 1], ``token_ids``); what the trainer's reader
(``FP8Transfer``) returns lies within the e4m3 per-token bound of a transformers fp32 forward
(spec_compat/verify/fp8.py derives it), every layer id; the stock trainer trains on the fp8 rows.
On vLLM 0.15/0.16 the fp8 connector needs ``ehs-connector-module``, and speculators' own file check
(``--validate-outputs``) needs ``fp8-payload-validation`` on fp8 payloads; both proofs are here.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from fixture_runs import once_per_fixture  # tests/support (on sys.path: tests/conftest.py)
from proof_runs import proof_cases  # tests/support
from test_speculators_client import BLOCK, LAYER_IDS, TOL, _rows
from test_speculators_pipeline import AUX_IDS, _client_env, _last_epoch, _speculators

ROOT = Path(__file__).resolve().parents[2]

#: hs-connectors' own server configuration of a backend, built in the client environment
_KV_CONFIG = r"""
import argparse, json, sys
from hs_connectors.transfer import HiddenStatesBackend
backend = HiddenStatesBackend.registry[sys.argv[1]]
print(json.dumps(backend.build_kv_transfer_config(argparse.Namespace(hidden_states_path=sys.argv[2]))))
"""

#: the trainer's reader of each file (hs-connectors' FP8Transfer, its default bf16), saved as fp32
_READ_FP8 = r"""
import json, sys
from pathlib import Path
import torch
from safetensors.torch import save_file
from hs_connectors.transfer import FP8Transfer
src, dst, n = Path(sys.argv[1]), Path(sys.argv[2]), int(sys.argv[3])
reader = FP8Transfer(src)
for i in range(n):
    sample = reader.get_cached(i)
    save_file({"hidden_states": sample["hidden_states"].float(), "dtype_read": torch.tensor([
        {torch.bfloat16: 16, torch.float32: 32}.get(sample["hidden_states"].dtype, 0)])}, str(dst / f"hs_{i}.safetensors"))
"""

TRAIN_ARGS = ("--target-layer-ids", *map(str, AUX_IDS), "--draft-vocab-size", "96", "--total-seq-len", "512",
              "--num-workers", "0", "--on-missing", "raise", "--loss-implementation", "eager",
              "--draft-attn-impl", "sdpa", "--optimizer", "adamw", "--lr", "3e-3", "--log-freq", "1000",
              "--seed", "0", "--epochs", "1")


@pytest.fixture(scope="module", autouse=True)
def _hs_connectors(client_python):
    from spec_compat.core.versions import installed_version

    if installed_version("hs-connectors") is None:
        pytest.skip("hs-connectors is not installed in the server environment (speculators 0.9.0 cells install it)")
    if installed_version("vllm") is None:
        pytest.skip("no vLLM in this environment")


def kv_config(client_python: str, backend: str, storage: Path) -> dict:
    proc = subprocess.run([client_python, "-c", _KV_CONFIG, backend, str(storage)], capture_output=True, text=True,
                          timeout=300, env=_client_env())
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.splitlines()[-1])


def serve_args(model: Path, kv: dict, trust: bool) -> list[str]:
    spec = {"method": "extract_hidden_states", "num_speculative_tokens": 1,
            "draft_model_config": {"hf_config": {"eagle_aux_hidden_state_layer_ids": LAYER_IDS}}}
    return [str(model), "--speculative_config", json.dumps(spec), "--kv_transfer_config", json.dumps(kv),
            "--max-model-len", "512", "--dtype", "float32", "--block-size", str(BLOCK),
            "--max-num-batched-tokens", "64", *(["--trust-remote-code"] if trust else [])]


@pytest.fixture(scope="module")
def fp8_run(fixture_model, client_python, tmp_path_factory):
    """``fp8_run(fixture)``: stock prepare-data, generate-offline-data through the fp8 server, and
    train --hidden-states-backend fp8, once per fixture."""
    def run(name: str, model: Path, trust: bool, tmp: Path) -> dict:
        from test_speculators_pipeline import _server_class

        rows = _rows(seed=11)
        raw = tmp / "rows.jsonl"
        raw.write_text("".join(json.dumps({"input_ids": r, "loss_mask": [0] + [1] * (len(r) - 1)}) + "\n"
                               for r in rows))
        data = tmp / "data"
        prep = _speculators(client_python, "prepare-data", "--model", str(model), "--data", str(raw), "--output",
                            str(data), "--seq-length", "512", "--no-skip-token-freq",
                            *(["--trust-remote-code"] if trust else []))
        assert prep.returncode == 0, (prep.stdout[-3000:], prep.stderr[-3000:])
        kv = kv_config(client_python, "fp8", tmp / "storage")
        assert kv["kv_connector"] == "FP8HiddenStatesConnector", kv
        server = _server_class()(serve_args(model, kv, trust), tmp / "server.log",
                                 {"VLLM_MLA_DISABLE": "1"} if trust else {})
        try:
            server.wait_ready()
            # --validate-outputs: speculators' check of each file (fp8 payloads: fp8-payload-validation)
            gen = _speculators(client_python, "generate-offline-data", "--endpoint", server.url + "/v1", "--model",
                               str(model), "--preprocessed-data", str(data), "--output", str(data / "hidden_states"),
                               "--concurrency", "32", "--validate-outputs", "--fail-on-error", "--max-retries", "0")
            assert gen.returncode == 0, (gen.stdout[-3000:], gen.stderr[-3000:], server.tail())
        finally:
            server.stop()
        train = _speculators(client_python, "train", "--verifier-name-or-path", str(model), "--data-path", str(data),
                             "--save-path", str(tmp / "ckpt"), "--log-dir", str(tmp / "logs"),
                             "--hidden-states-backend", "fp8", *TRAIN_ARGS, *(["--trust-remote-code"] if trust else []))
        return {"model": model, "rows": rows, "data": data, "train": train, "ckpt": tmp / "ckpt", "tmp": tmp,
                "server_log": tmp / "server.log"}

    return once_per_fixture(fixture_model, tmp_path_factory, "fp8", run)


FIXTURES = ["llama", "kimi-k25"]


@pytest.mark.parametrize("fixture", FIXTURES)
def test_fp8_rows_lie_within_the_e4m3_bound(fp8_run, client_python, fixture):
    import torch
    from safetensors.torch import load_file

    from spec_compat.verify.fp8 import check_fp8_rows
    from spec_compat.verify.hidden_states_reference import reference_rows
    from spec_compat.verify.reference import load_reference_model

    run = fp8_run(fixture)
    files = sorted((run["data"] / "hidden_states").glob("hs_*.safetensors"), key=lambda f: int(f.stem[3:]))
    assert len(files) == len(run["rows"]), (len(files), len(run["rows"]))
    raw = [load_file(str(f)) for f in files]
    ids = [r["token_ids"].tolist() for r in raw]
    assert sorted(map(tuple, ids)) == sorted(map(tuple, run["rows"]))  # every row, once
    # hs-connectors' layout, as its FP8HiddenStatesConnector writes it
    tokens = stored = 0
    for f, r, t in zip(files, raw, ids):
        assert set(r) == {"hidden_states", "hidden_states_scales", "token_ids"}, (f.name, sorted(r))
        hs, sc = r["hidden_states"], r["hidden_states_scales"]
        assert hs.dtype == torch.float8_e4m3fn and hs.shape[:2] == (len(t), len(LAYER_IDS)), (f.name, hs.dtype, hs.shape)
        assert sc.dtype == torch.float32 and tuple(sc.shape) == (len(t), 1, 1), (f.name, sc.dtype, sc.shape)
        assert r["token_ids"].dtype == torch.int64
        tokens += len(t)
        stored += sum(v.numel() * v.element_size() for v in r.values())
    hidden = raw[0]["hidden_states"].shape[2]
    # what the trainer's reader returns (FP8Transfer: dequantized to bf16)
    out = run["tmp"] / "read"
    out.mkdir(exist_ok=True)
    proc = subprocess.run([client_python, "-c", _READ_FP8, str(run["data"] / "hidden_states"), str(out), str(len(files))],
                          capture_output=True, text=True, timeout=600, env=_client_env())
    assert proc.returncode == 0, proc.stderr[-3000:]
    model = load_reference_model(run["model"], "float32")
    worst_ratio, worst_rel = 0.0, 0.0
    for i, (r, t) in enumerate(zip(raw, ids)):
        read = load_file(str(out / f"hs_{i}.safetensors"))
        assert int(read["dtype_read"]) == 16, "FP8Transfer's default dequantization is bf16"
        want = reference_rows(model, t, LAYER_IDS)
        # the engine's own error (the file backend's tolerance): TOL of each layer's max |reference|
        slack = TOL * float(want.abs().max())
        check = check_fp8_rows(read["hidden_states"], want, r["hidden_states_scales"], slack=slack)
        assert check, f"hs_{i} ({len(t)} tokens): {check.detail}"
        worst_ratio, worst_rel = max(worst_ratio, check.worst_ratio), max(worst_rel, check.max_rel)
    per_token = stored / tokens
    bf16_per_token = len(LAYER_IDS) * hidden * 2 + 8
    print(f"{fixture} fp8: {len(files)} files, {tokens} rows; max |diff|/bound {worst_ratio:.3f}, max |diff|/max|ref| "
          f"{worst_rel:.2e}; {per_token:.1f} tensor bytes per token (bf16 rows: {bf16_per_token}, ratio "
          f"{per_token / bf16_per_token:.3f})")
    assert per_token == len(LAYER_IDS) * hidden + 4 + 8  # 1 byte a value, one fp32 scale, one int64 id


@pytest.mark.parametrize("fixture", FIXTURES)
def test_stock_trainer_trains_on_fp8_rows(fp8_run, fixture):
    import torch
    from safetensors.torch import load_file

    run = fp8_run(fixture)
    train = run["train"]
    assert train.returncode == 0, (train.stdout[-4000:], train.stderr[-4000:])
    draft = _last_epoch(run["ckpt"])
    cfg = json.loads((draft / "config.json").read_text())
    assert cfg["eagle_aux_hidden_state_layer_ids"] == AUX_IDS, cfg
    weights = [f for f in draft.iterdir() if f.suffix == ".safetensors"]
    assert weights
    for f in weights:
        for name, t in load_file(str(f)).items():
            assert t.numel() and bool(torch.isfinite(t.float()).all()), (f.name, name)


@pytest.mark.parametrize("pid", proof_cases("test_fp8_backend_fails_with_only_this_patch_disabled"))
def test_fp8_backend_fails_with_only_this_patch_disabled(fixture_model, client_python, serve, tmp_path, prove, pid):
    """Stock: the server refuses the fp8 connector before any weights load -- hs-connectors imports
    its base class from a module vLLM 0.15/0.16 does not have."""
    from spec_compat import REGISTRY

    needed, why = REGISTRY.get(pid).needed()  # vLLM >= 0.17 has the module
    if not needed:
        pytest.skip(f"{pid} is not needed in this environment ({why})")
    proof = prove(pid)
    model = fixture_model("llama")
    kv = kv_config(client_python, "fp8", tmp_path / "storage")
    stock = serve(serve_args(model, kv, False), env={"SPEC_COMPAT_DISABLE": proof.disable})
    with pytest.raises(RuntimeError, match="vllm serve exited"):
        stock.wait_ready()
    proof.assert_symptom(stock.tail(20000), report=True)
    patched = serve(serve_args(model, kv, False), env={"SPEC_COMPAT_DISABLE": proof.baseline})
    patched.wait_ready()
    proof.assert_absent(patched.tail(20000))


#: speculators' own check of one file, in the client environment (the stock call of --validate-outputs)
_VALIDATE = r"""
import json, sys
import spec_compat
import torch
from safetensors.torch import load_file
from speculators.data_generation.offline import check_hidden_states
data = load_file(sys.argv[1])
if sys.argv[2] == "nan-scale":  # a broken payload must still fail the check
    data["hidden_states_scales"][1] = float("nan")
check_hidden_states(data, data["token_ids"].tolist())
print("SPEC_COMPAT_RESULT checked")
"""


def _validate(client_python: str, path: Path, variant: str, disable: str) -> subprocess.CompletedProcess:
    env = dict(_client_env(), SPEC_COMPAT_DISABLE=disable)
    return subprocess.run([client_python, "-c", _VALIDATE, str(path), variant], capture_output=True, text=True,
                          timeout=300, env=env)


@pytest.mark.parametrize("pid", proof_cases("test_fp8_validation_fails_with_only_this_patch_disabled"))
def test_fp8_validation_fails_with_only_this_patch_disabled(fp8_run, client_python, prove, pid):
    """Stock: speculators' check_hidden_states (what --validate-outputs runs on every file) raises
    on an fp8 file hs-connectors' connector wrote through this server."""
    proof = prove(pid)
    path = fp8_run("llama")["data"] / "hidden_states" / "hs_0.safetensors"
    stock = _validate(client_python, path, "as-written", proof.disable)
    assert stock.returncode != 0, stock.stdout[-2000:]
    proof.assert_symptom(stock.stderr)
    patched = _validate(client_python, path, "as-written", proof.baseline)
    assert patched.returncode == 0 and "SPEC_COMPAT_RESULT checked" in patched.stdout, patched.stderr[-3000:]
    proof.assert_absent(patched.stderr)
    broken = _validate(client_python, path, "nan-scale", proof.baseline)
    assert broken.returncode != 0 and "non-finite" in broken.stderr, broken.stderr[-3000:]


#: ehs-config's check of a --kv-transfer-config, in a server process (spec_compat applied)
_CHECK = r"""
import json, sys
import spec_compat
from types import SimpleNamespace
from spec_compat.patches.hidden_states.ehs_config import check_connector
kv = json.loads(sys.argv[1])
try:
    files = check_connector(SimpleNamespace(kv_connector=kv.get("kv_connector"),
                                            kv_connector_module_path=kv.get("kv_connector_module_path")))
    print("SPEC_COMPAT_RESULT accepted: " + ("files" if files else "cache group"))
except ValueError as exc:
    print("SPEC_COMPAT_RESULT refused: " + str(exc))
"""


def test_connectors_are_checked_before_any_weights_load(client_python, tmp_path):
    """Before any weights load: hs-connectors' three backends are accepted (file and fp8 write
    files through the backport's writer; mooncake reads the store as vLLM 0.17's hidden-states
    cache); a connector that is neither is refused naming its bases and what would work."""
    from spec_compat.core.versions import in_range, installed_version
    from spec_compat.patches.hidden_states import VLLM_WITHOUT_EHS

    if not in_range(installed_version("vllm"), VLLM_WITHOUT_EHS):
        pytest.skip("vLLM >= 0.17 has its own connector check")
    configs = {
        "mooncake": {"kv_connector": "MooncakeHiddenStatesConnector",
                     "kv_connector_module_path": "hs_connectors.mooncake_hidden_states_connector"},
        "not-a-subclass": {"kv_connector": "DecodeBenchConnector",
                           "kv_connector_module_path": "vllm.distributed.kv_transfer.kv_connector.v1"},
        "fp8": kv_config(client_python, "fp8", tmp_path / "s"),
        "file": kv_config(client_python, "file", tmp_path / "s"),
    }
    out = {}
    for name, kv in configs.items():
        proc = subprocess.run([sys.executable, "-c", _CHECK, json.dumps(kv)], capture_output=True, text=True,
                              timeout=300)
        assert proc.returncode == 0, proc.stderr[-3000:]
        out[name] = proc.stdout.split("SPEC_COMPAT_RESULT ", 1)[1].strip()
    assert out["fp8"] == "accepted: files" and out["file"] == "accepted: files", out
    assert out["mooncake"] == "accepted: cache group", out
    assert "is not a subclass of ExampleHiddenStatesConnector" in out["not-a-subclass"], out["not-a-subclass"]
    assert "KVConnectorBase_V1" in out["not-a-subclass"], out["not-a-subclass"]
    assert "MooncakeHiddenStatesConnector" in out["not-a-subclass"], out["not-a-subclass"]  # what would work
