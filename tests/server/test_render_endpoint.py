"""Chat rows through stock speculators (0.8.1 / 0.9.0) ``prepare-data --render-endpoint`` against
the extraction server: ``POST /v1/chat/completions/render`` answers ``{"token_ids": [...]}``
(vLLM >= 0.18's answer; backported on vLLM 0.15/0.16 by ``ehs-render-token-ids``), cut with
``truncate_prompt_tokens`` on ``truncation_side``.

The reference is the fixture tokenizer's own chat template (transformers
``apply_chat_template(tokenize=True)`` in this environment): each training row is the render of
the conversation through an assistant turn, masked from where the generation-prompt render of
the turns before it ends (speculators' boundary rule); a conversation longer than
``--seq-length`` keeps its head.  Then ``generate-offline-data --validate-outputs`` extracts the
rendered rows, and the stock trainer trains one epoch online on them (``--on-missing generate``:
each row's hidden states asked of the server, loaded and checked by hs-connectors' file transfer,
then deleted).  Proof of need: without the patch every chat row is skipped (the client's
"Render endpoint response missing 'token_ids'").
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from proof_runs import proof_cases  # tests/support (on sys.path: tests/conftest.py)
from spec_compat.core.versions import in_range, installed_version

from test_speculators_client import LAYER_IDS, _post, serve_args, start_extraction_server

SEQ_LENGTH = 500  # of max-model-len 512: a rendered row leaves room for the one generated token

CONVERSATIONS = [
    [{"role": "user", "content": "What is two and two?"},
     {"role": "assistant", "content": "Two and two make four."}],
    [{"role": "system", "content": "Answer briefly."},
     {"role": "user", "content": "Name a colour."},
     {"role": "assistant", "content": "Blue."},
     {"role": "user", "content": "And another one, please?"},
     {"role": "assistant", "content": "Green, then red."}],
    # longer than --seq-length once rendered: the row keeps the first SEQ_LENGTH tokens
    [{"role": "user", "content": "Count for me."},
     {"role": "assistant", "content": " ".join(f"number {i}," for i in range(400))}],
]

_DUMP = r"""
import json, sys
from datasets import load_from_disk
ds = load_from_disk(sys.argv[1])
print(json.dumps({"input_ids": [list(map(int, r)) for r in ds["input_ids"]],
                  "loss_mask": [list(map(int, r)) for r in ds["loss_mask"]]}))
"""

_RENDER = r"""
import json, sys
from speculators.data_generation.render_client import render_conversation
try:
    print("token_ids", render_conversation(sys.argv[1], json.loads(sys.argv[2]), add_generation_prompt=False,
                                           max_retries=0))
except Exception as exc:
    print(f"{type(exc).__name__}: {exc}")
"""


def _tokenizer(model: Path, trust: bool):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(model), trust_remote_code=trust)


def _render(tok, messages: list[dict], generation_prompt: bool) -> list[int]:
    ids = tok.apply_chat_template(messages, add_generation_prompt=generation_prompt, tokenize=True)
    if isinstance(ids, dict) or hasattr(ids, "input_ids"):  # a BatchEncoding in some releases
        ids = ids["input_ids"]
    return [int(t) for t in ids]


def _server_cuts_long_renders() -> bool:
    """vLLM >= 0.16 (with the patch, or natively) renders a conversation over max-model-len whole and
    cuts it; vLLM 0.15's render keeps its length check (400) before any cut."""
    from vllm.entrypoints.openai.chat_completion.protocol import ChatCompletionRequest

    return hasattr(ChatCompletionRequest, "build_tok_params")


def _client_truncates(client_python: str) -> bool:
    """speculators >= 0.9 asks the render for ``truncate_prompt_tokens`` + ``truncation_side``;
    0.8.1 asks for the whole render, which a server refuses (400) for a conversation over
    max-model-len, and prepare-data skips that conversation."""
    from packaging.version import Version

    code = "from importlib.metadata import version; print(version('speculators'))"
    out = subprocess.run([client_python, "-c", code], capture_output=True, text=True, timeout=120, check=True)
    return Version(out.stdout.strip()).release >= (0, 9)


def _expected_rows(tok, truncates: bool = True) -> list[tuple[list[int], list[int]]]:
    """speculators' rows of CONVERSATIONS: one per assistant turn after the first message (the
    conversation longer than max-model-len only from a client that asks for a cut)."""
    rows = []
    for conv in CONVERSATIONS if truncates else CONVERSATIONS[:-1]:
        for j, turn in enumerate(conv):
            if turn["role"] != "assistant" or j == 0:
                continue
            prompt = _render(tok, conv[:j], True)
            full = _render(tok, conv[:j + 1], False)
            assert full[:len(prompt)] == prompt, "the fixture's chat template is not prefix-stable"
            full = full[:SEQ_LENGTH]
            rows.append((full, [0] * len(prompt) + [1] * (len(full) - len(prompt))))
    return rows


def _scale_out_flag() -> list[str]:
    """vLLM >= 0.32 (at least) serves the render endpoints only with ``--enable-scale-out``
    (HTTP 403 "Scale-out endpoints are disabled" otherwise; speculators 0.9.0 does not know)."""
    import importlib.util

    try:
        spec = importlib.util.find_spec("vllm.entrypoints.launchers.cli_args")
    except ModuleNotFoundError:  # vLLM 0.15/0.16: no launchers package
        return []
    if spec is None or spec.origin is None:
        return []
    return ["--enable-scale-out"] if "enable_scale_out" in Path(spec.origin).read_text() else []


def _render_call(server, model: Path, messages: list[dict], **extra) -> tuple[int, dict]:
    return _post(server.url + "/v1/chat/completions/render",
                 {"model": str(model), "messages": messages, "add_generation_prompt": False, **extra})


def _completions_answered(server) -> int:
    """How many extraction requests the server has answered (its access log)."""
    server._out.flush()
    return server.log.read_text(errors="replace").count('"POST /v1/completions HTTP/1.1" 200')


def _client(client_python: str, *args: str) -> subprocess.CompletedProcess:
    """A stock ``speculators`` command in the client env under ``spec-compat run`` (as documented:
    Kimi-K2.5's tokenizer needs ``kimi-tokenizer-bytes-to-unicode`` under transformers 5)."""
    cli = str(Path(client_python).parent / "speculators")
    return subprocess.run([client_python, "-m", "spec_compat", "run", cli, *args], capture_output=True, text=True,
                          timeout=900, env=dict(os.environ, COLUMNS="200", HF_HUB_OFFLINE="1"))


@pytest.mark.parametrize("fixture", ["llama", "kimi-k25"])
def test_stock_prepare_data_renders_chat_rows(fixture_model, serve, client_python, tmp_path, fixture):
    model = fixture_model(fixture)
    trust = fixture.startswith("kimi")
    tok = _tokenizer(model, trust)
    cuts = _server_cuts_long_renders()
    truncates = _client_truncates(client_python) and cuts
    expected = _expected_rows(tok, truncates)
    assert len(expected) == (4 if truncates else 3), [len(r) for r, _ in expected]
    assert not truncates or len(expected[-1][0]) == SEQ_LENGTH, [len(r) for r, _ in expected]
    server = start_extraction_server(serve, fixture, model, tmp_path / "storage", *_scale_out_flag())

    # the route itself: ids, both truncation sides, a bad side (400), then still serving
    conv = CONVERSATIONS[1]
    whole = _render(tok, conv, False)
    status, body = _render_call(server, model, conv)
    assert status == 200 and body.get("token_ids") == whole, (status, body, whole)
    status, body = _render_call(server, model, conv, truncate_prompt_tokens=10, truncation_side="right")
    assert status == 200 and body["token_ids"] == whole[:10], (status, body)
    status, body = _render_call(server, model, conv, truncate_prompt_tokens=10, truncation_side="left")
    assert status == 200 and body["token_ids"] == whole[-10:], (status, body)
    status, body = _render_call(server, model, conv, truncate_prompt_tokens=10, truncation_side="middle")
    assert status == 400 and "truncation_side" in json.dumps(body), (status, body)
    longer = _render(tok, CONVERSATIONS[2], False)  # over max-model-len: cut after a whole render
    assert len(longer) > 512, len(longer)
    status, body = _render_call(server, model, CONVERSATIONS[2], truncate_prompt_tokens=20, truncation_side="left")
    if cuts:
        assert status == 200 and body["token_ids"] == longer[-20:], (status, body)
    else:  # vLLM 0.15.1: refused with its own length message, then still serving
        assert status == 400 and "maximum context length" in json.dumps(body), (status, body)
    status, body = _render_call(server, model, CONVERSATIONS[0])
    assert status == 200 and body["token_ids"] == _render(tok, CONVERSATIONS[0], False), (status, body)

    # stock prepare-data on chat rows, then generate-offline-data on what it wrote
    chat = tmp_path / "chat.jsonl"
    chat.write_text("".join(json.dumps({"conversations": c}) + "\n" for c in CONVERSATIONS))
    data = tmp_path / "data"
    prep = _client(client_python, "prepare-data", "--model", str(model), "--data", str(chat), "--output", str(data),
                   "--seq-length", str(SEQ_LENGTH), "--render-endpoint", server.url,
                   *(["--trust-remote-code"] if trust else []))
    assert prep.returncode == 0, (prep.stdout[-3000:], prep.stderr[-3000:], server.tail())
    dump = subprocess.run([client_python, "-c", _DUMP, str(data)], capture_output=True, text=True, timeout=300)
    assert dump.returncode == 0, dump.stderr[-3000:]
    got = json.loads(dump.stdout.strip().splitlines()[-1])
    rows = list(zip(got["input_ids"], got["loss_mask"]))
    assert sorted(rows) == sorted(expected), (
        f"prepare-data wrote {len(rows)} rows of lengths {[len(r) for r, _ in rows]}, expected "
        f"{[len(r) for r, _ in expected]}:\n{prep.stdout[-2000:]}\n{prep.stderr[-2000:]}")
    out = tmp_path / "hidden_states"
    gen = _client(client_python, "generate-offline-data", "--endpoint", server.url + "/v1", "--model", str(model),
                  "--preprocessed-data", str(data), "--output", str(out), "--concurrency", "8",
                  "--validate-outputs", "--fail-on-error", "--max-retries", "0")
    assert gen.returncode == 0, (gen.stdout[-3000:], gen.stderr[-3000:], server.tail())
    files = sorted(out.glob("hs_*.safetensors"))
    assert len(files) == len(expected), sorted(os.listdir(out))
    from safetensors.torch import load_file

    written = sorted(load_file(str(f))["token_ids"].tolist() for f in files)
    assert written == sorted(r for r, _ in expected)
    # online training on the same rows: the stock trainer asks the server for each row's hidden
    # states (--on-missing generate), loads the file it names, checks ids / rows / finiteness, deletes it
    served_before = _completions_answered(server)
    ckpt = tmp_path / "ckpt"
    train = _client(client_python, "train", "--verifier-name-or-path", str(model), "--data-path", str(data),
                    "--save-path", str(ckpt), "--log-dir", str(tmp_path / "logs"), "--target-layer-ids",
                    *map(str, LAYER_IDS[:-1]), "--total-seq-len", "512", "--num-workers", "0", "--epochs", "1",
                    "--on-missing", "generate", "--vllm-endpoint", server.url + "/v1", "--loss-implementation",
                    "eager", "--draft-attn-impl", "sdpa", "--optimizer", "adamw", "--log-freq", "1000", "--seed", "0",
                    *(["--trust-remote-code"] if trust else []))
    assert train.returncode == 0, (train.stdout[-3000:], train.stderr[-3000:], server.tail())
    generated = _completions_answered(server) - served_before
    assert generated >= len(expected), (generated, train.stderr[-2000:])
    assert "round trip failed" not in train.stdout + train.stderr, train.stderr[-3000:]
    epochs = [d for d in ckpt.iterdir() if d.is_dir() and d.name.isdigit()]
    assert len(epochs) == 1 and any(epochs[0].glob("*.safetensors")), sorted(os.listdir(ckpt))
    assert sorted(p.name for p in (tmp_path / "storage").iterdir()) == [], "the trainer leaves no file behind"
    print(f"{fixture}: {len(rows)} chat rows rendered ({[len(r) for r, _ in rows]} tokens) = the chat template's; "
          f"{len(files)} files extracted and validated; online training asked the server {generated} times")


@pytest.mark.parametrize("pid", proof_cases("test_without_the_patch_every_chat_row_is_skipped"))
def test_without_the_patch_every_chat_row_is_skipped(fixture_model, serve, client_python, tmp_path, prove, pid):
    from spec_compat.patches.hidden_states import VLLM_WITHOUT_EHS

    if not in_range(installed_version("vllm"), VLLM_WITHOUT_EHS):
        pytest.skip(f"vLLM {installed_version('vllm')} has its own render answer (outside {VLLM_WITHOUT_EHS})")
    model = fixture_model("llama")
    tok = _tokenizer(model, False)
    proof = prove(pid)
    conv = json.dumps(CONVERSATIONS[0])
    outputs, verdicts = [], []
    for disable in (proof.disable, proof.baseline):
        server = serve(serve_args(model, tmp_path / f"storage-{len(outputs)}", LAYER_IDS),
                       env={"SPEC_COMPAT_DISABLE": disable})
        server.wait_ready()
        proc = subprocess.run([client_python, "-c", _RENDER, server.url, conv], capture_output=True, text=True,
                              timeout=300)
        server.stop()
        outputs.append(proc.stdout + proc.stderr)
        verdicts.append((proc.stdout.strip().splitlines() or [""])[-1])  # the client's one line: ids or error
    proof.assert_symptom(verdicts[0], report=True)
    proof.assert_absent(outputs[1])
    assert f"token_ids {_render(tok, CONVERSATIONS[0], False)}" in outputs[1], outputs[1][-2000:]
