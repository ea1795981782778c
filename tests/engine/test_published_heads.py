"""EAGLE-3 heads in the formats others publish for Kimi-K2.5 (TorchSpec's Llama-style and MLA heads,
the same after stock ``speculators convert``), served by this cell's vLLM on the kimi-k25 fixture
through ``spec-compat evaluate`` (a fresh process: the serving patches arrive through the plugin).

The heads are ``spec-compat fixture torchspec-eagle3[-mla]`` etc. (random weights, published config keys
and weight names at the fixture's size); a random head accepts next to nothing, so what these tests
show is that each format loads and serves losslessly, that spec-compat serves the layers the head
names in its own convention, that the MLA head computes the contract's function, and that a head
that does not fit is refused naming both sides before any weight loads.  Acceptance of trained
heads in each convention: tests/server/test_head_conventions.py.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from proof_runs import proof_cases  # tests/support (on sys.path: tests/conftest.py)
from test_serving import PROOF_ARGS, assert_consistent, run_evaluate

# the heads' builder runs as a command (head_dir); imported here as well, so that it is an input of every
# proof in this file (tests/support/proof_keys.py follows imports), not only of the one that built a head
from spec_compat.fixtures.published_heads import FORMATS

ROOT = Path(__file__).resolve().parents[2]
MLA = "torchspec-eagle3-mla"
LLAMA_HEAD = "torchspec-eagle3"
PRUNED = "torchspec-eagle3+--draft-vocab+96"
#: heads as SpecForge's and NVIDIA ModelOpt's exporters write them (spec_compat/fixtures/published_heads.py)
EXPORTED = ("specforge-eagle3", "modelopt-eagle3", "modelopt-eagle3-mla")
WIDE = "torchspec-eagle3+--hidden+512"

pytestmark = pytest.mark.engine


@pytest.fixture(autouse=True)
def _serving_here():
    from spec_compat.cli.evaluate import serving_unsupported

    reason = serving_unsupported()
    if reason:
        pytest.skip(reason)
    from spec_compat import REGISTRY

    needed, why = REGISTRY.get("eagle3-mla-draft-head").needed()
    if not needed:
        pytest.skip(f"spec-compat's published-head patches are not needed here: {why}")


@pytest.fixture(scope="session")
def head_dir(tmp_path_factory):
    """``head_dir("name[+--opt+value...]")``: a head written once per session by its fixture CLI."""
    root = tmp_path_factory.mktemp("heads")
    built: dict[str, Path] = {}

    def get(name: str) -> Path:
        if name not in built:
            out = root / name.replace("+", "_")
            subprocess.run([sys.executable, "-m", "spec_compat", "fixture", *name.split("+")[:1], str(out),
                            *name.split("+")[1:]], check=True, stdout=subprocess.DEVNULL, cwd=str(ROOT))
            built[name] = out
        return built[name]

    return get


def _compare(target: Path, *drafts: Path, extra: tuple[str, ...] = ()) -> tuple[subprocess.CompletedProcess, dict | None]:
    env = {k: v for k, v in os.environ.items() if k != "SPEC_COMPAT_DISABLE"}
    args = [a for d in drafts for a in ("--draft", str(d))]
    proc = subprocess.run([sys.executable, "-m", "spec_compat", "evaluate", "--target", str(target), *args,
                           "--json", "--trust-remote-code", *extra], env=env, capture_output=True, text=True, timeout=1500, cwd=str(ROOT))
    return proc, (json.loads(proc.stdout) if proc.returncode == 0 else None)


def _assert_all_lossless(proc: subprocess.CompletedProcess, res: dict | None, drafts: list[Path]) -> None:
    """One evaluate run of several drafts: exit 0, a row per draft in order, each lossless with
    consistent counters and drafting at all."""
    assert proc.returncode == 0, proc.stderr[-4000:]
    got = res["drafts"]
    assert [d["draft"] for d in got] == [str(d) for d in drafts]
    for d in got:
        print(d["draft"], d["lossless"], d["mean_acceptance_length"], d["per_position"])
        assert d["lossless"], d
        assert_consistent(d)
        assert d["draft_tokens"] > 0, d


def test_published_heads_serve_losslessly(fixture_dir, head_dir):
    """One comparison on the same prompts: TorchSpec's MLA head as published and its Llama-style head as
    published with a pruned vocabulary (d2t / t2d).  Each lossless, its counters consistent; the MLA
    head's output-convention ids (outputs of layers 0, 1, 2) served as the inputs of 1, 2, 3, said so."""
    kimi = fixture_dir("kimi-k25")
    drafts = [head_dir(MLA), head_dir(PRUNED)]
    proc, res = _compare(kimi, *drafts, extra=("--limit", "4", "--max-tokens", "24"))
    _assert_all_lossless(proc, res, drafts)
    assert ("spec_compat[eagle3-aux-ids-convention]: draft " + str(head_dir(MLA)) + " names aux layer ids [0, 1, 2] "
            "in eagle_config; assumed convention 'output'") in proc.stderr, proc.stderr[-4000:]
    assert "serving the inputs of target layers [1, 2, 3]. Override with SPEC_COMPAT_AUX_IDS=input" in proc.stderr
    # evaluate's one-line form of a refusal: tests/unit/test_compare_drafts.py
    assert f"draft {head_dir(PRUNED)} names no aux layer ids; serving the target's default layers" in proc.stderr


def test_exported_heads_serve_losslessly(fixture_dir, head_dir):
    """SpecForge's export (``midlayer.*``, pruned vocabulary with ``d2t``/``t2d``, no ``embed_tokens``) and
    ModelOpt's Llama-style and Kimi (MLA) exports (``layers.0.*``, no ``embed_tokens``, no ``t2d``; the MLA
    head without ``draft_vocab_size``), in one comparison on the kimi-k25 fixture: each loads, serves
    losslessly with consistent counters, and its ``eagle_config`` ids (outputs of layers 0, 1, 2, as
    both exporters write them) are served as the inputs of layers 1, 2, 3, said so."""
    assert set(EXPORTED) <= set(FORMATS)
    kimi = fixture_dir("kimi-k25")
    drafts = [head_dir(name) for name in EXPORTED]
    proc, res = _compare(kimi, *drafts, extra=("--limit", "4", "--max-tokens", "24"))
    _assert_all_lossless(proc, res, drafts)
    for draft in drafts:
        assert (f"spec_compat[eagle3-aux-ids-convention]: draft {draft} names aux layer ids [0, 1, 2] in eagle_config; "
                "assumed convention 'output'") in proc.stderr, (draft, proc.stderr[-4000:])
    assert proc.stderr.count("serving the inputs of target layers [1, 2, 3]") >= len(drafts), proc.stderr[-4000:]


def _convert(head: Path, target: Path, out: Path, disable: str = "") -> subprocess.CompletedProcess:
    """Stock ``speculators convert --algorithm eagle3`` (its entry point ``convert_model``; speculators
    0.3's own CLI does not start with the typer of its environment) with the registry applied."""
    env = dict(os.environ, SPEC_COMPAT_DISABLE=disable)
    code = ("import sys, spec_compat; from speculators.convert.entrypoints import convert_model; "
            "convert_model(model=sys.argv[1], verifier=sys.argv[2], algorithm='eagle3', output_path=sys.argv[3])")
    return subprocess.run([sys.executable, "-c", code, str(head), str(target), str(out)],
                          env=env, capture_output=True, text=True, timeout=600, cwd=str(ROOT))


def _has_convert() -> bool:
    import importlib.util

    return importlib.util.find_spec("speculators.convert.eagle.eagle3_converter") is not None


def test_converted_head_serves_losslessly(fixture_dir, head_dir, tmp_path):
    """TorchSpec's full-vocabulary Llama-style head through stock ``speculators convert`` (speculators'
    format, ``draft_vocab_size`` from its lm_head), served losslessly."""
    if not _has_convert():
        pytest.skip("this speculators has no EAGLE-3 converter")
    kimi, converted = fixture_dir("kimi-k25"), tmp_path / "converted"
    proc = _convert(head_dir(LLAMA_HEAD), kimi, converted)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
    cfg = json.loads((converted / "config.json").read_text())
    assert cfg["speculators_model_type"] == "eagle3" and cfg["draft_vocab_size"] == 512, cfg
    proc, res = run_evaluate(kimi, converted, *PROOF_ARGS)
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert res["lossless"], res
    assert_consistent(res)


@pytest.mark.parametrize("pid", proof_cases("test_stock_convert_needs_the_patch"))
def test_stock_convert_needs_the_patch(fixture_dir, head_dir, tmp_path, prove, pid):
    proof = prove(pid)
    if not _has_convert():
        pytest.skip("this speculators has no EAGLE-3 converter")
    stock = _convert(head_dir(LLAMA_HEAD), fixture_dir("kimi-k25"), tmp_path / "stock", proof.disable)
    assert stock.returncode != 0, stock.stdout[-2000:]
    proof.assert_symptom(stock.stdout + stock.stderr)
    patched = _convert(head_dir(LLAMA_HEAD), fixture_dir("kimi-k25"), tmp_path / "patched", proof.baseline)
    assert patched.returncode == 0, patched.stderr[-4000:]
    proof.assert_absent(patched.stdout + patched.stderr)


@pytest.mark.parametrize("pid", proof_cases("test_mla_head_fails_without_the_patch"))
def test_mla_head_fails_without_the_patch(fixture_dir, head_dir, prove, pid):
    proof = prove(pid)
    proc, res = run_evaluate(fixture_dir("kimi-k25"), head_dir(MLA), *PROOF_ARGS, disable=proof.disable)
    assert proc.returncode != 0, res
    proof.assert_symptom(proc.stdout + proc.stderr)
    # the patched run: test_published_head_serves_losslessly[torchspec-eagle3-mla] (the same evaluation)
    on, on_res = run_evaluate(fixture_dir("kimi-k25"), head_dir(MLA), *PROOF_ARGS, disable=proof.baseline or None)
    assert on.returncode == 0 and on_res["lossless"], on.stderr[-3000:]
    proof.assert_absent(on.stdout + on.stderr)


def _late_crash(text: str) -> str:
    return next((ln for ln in text.splitlines() if "mat1 and mat2 shapes cannot be multiplied" in ln), "")


@pytest.mark.parametrize("pid", proof_cases("test_unfit_head_is_refused_before_loading"))
def test_unfit_head_is_refused_before_loading(fixture_dir, head_dir, prove, pid):
    """A head twice the target's width: stock vLLM loads it and the engine dies in its first step
    (a matmul shape error, nothing naming the widths); refused at configuration instead."""
    proof = prove(pid)
    stock, _ = run_evaluate(fixture_dir("kimi-k25"), head_dir(WIDE), *PROOF_ARGS, disable=proof.disable)
    assert stock.returncode != 0
    proof.assert_symptom(_late_crash(stock.stderr) or stock.stderr[-3000:], report=True)
    assert "Loading weights took" in stock.stderr or "Model loading took" in stock.stderr, stock.stderr[-3000:]
    patched, _ = run_evaluate(fixture_dir("kimi-k25"), head_dir(WIDE), *PROOF_ARGS, disable=proof.baseline or None)
    assert patched.returncode != 0 and "spec_compat[eagle3-draft-fits-target]: the EAGLE-3 draft" in patched.stderr
    assert "Loading weights took" not in patched.stderr, patched.stderr[-3000:]
    proof.assert_absent(patched.stdout + patched.stderr)


_REFUSALS = r"""
import json, sys
import spec_compat  # noqa: F401
from vllm.engine.arg_utils import EngineArgs
from spec_compat.cli.compare_drafts import spec_compat_refusal

target, *drafts = sys.argv[1:]
for draft in drafts:
    args = EngineArgs(model=target, tokenizer=target, trust_remote_code=True, max_model_len=512, enforce_eager=True,
                      speculative_config={"method": "eagle3", "model": draft, "num_speculative_tokens": 3})
    try:
        args.create_engine_config()
        print("REFUSAL " + json.dumps({"draft": draft, "refusal": None}), flush=True)
    except Exception as exc:  # noqa: BLE001
        print("REFUSAL " + json.dumps({"draft": draft, "refusal": spec_compat_refusal(exc) or repr(exc)[:500]}), flush=True)
"""


def _variant(src: Path, dst: Path, edit) -> Path:
    shutil.copytree(src, dst)
    cfg = json.loads((dst / "config.json").read_text())
    edit(cfg)
    (dst / "config.json").write_text(json.dumps(cfg))
    return dst


def _d2t_past_the_vocabulary(src: Path, dst: Path) -> Path:
    """``src`` with the last entry of its ``d2t`` moved 1000 tokens past the target's vocabulary."""
    from safetensors.torch import load_file, save_file

    shutil.copytree(src, dst)
    tensors = load_file(str(dst / "model.safetensors"))
    tensors["d2t"][-1] += 1000
    save_file(tensors, str(dst / "model.safetensors"))
    return dst


def test_unfit_heads_are_refused_naming_both_sides(fixture_dir, head_dir, tmp_path):
    """One clear error per head, before anything loads: a config that disagrees with its own vocabulary
    mapping, a d2t that names tokens past the target's vocabulary, aux ids past the target's layers (vLLM's config built in one process); a head twice the
    target's width through ``vllm serve``: the server exits naming both widths, no engine starts; a head
    that fits passes the same check."""
    kimi = fixture_dir("kimi-k25")
    pruned = head_dir(PRUNED)
    bad_vocab = _variant(pruned, tmp_path / "bad-vocab", lambda c: c.update(draft_vocab_size=128))
    bad_ids = _variant(head_dir(MLA), tmp_path / "bad-ids",
                       lambda c: c["eagle_config"].update(eagle_aux_hidden_state_layer_ids=[1, 2, 3]))
    bad_d2t = _d2t_past_the_vocabulary(pruned, tmp_path / "bad-d2t")
    proc = subprocess.run([sys.executable, "-c", _REFUSALS, str(kimi), str(bad_vocab), str(bad_ids), str(bad_d2t),
                           str(pruned)],
                          capture_output=True, text=True, timeout=600, cwd=str(ROOT))
    assert proc.returncode == 0, proc.stderr[-4000:]
    got = {Path(r["draft"]).name: r["refusal"] for r in
           (json.loads(ln[len("REFUSAL "):]) for ln in proc.stdout.splitlines() if ln.startswith("REFUSAL "))}
    print(json.dumps(got, indent=1))
    assert got[pruned.name] is None
    prefix = "spec_compat[eagle3-draft-fits-target]: the EAGLE-3 draft "
    assert got["bad-vocab"].startswith(prefix) and "(hidden size 256, vocabulary 512, 4 decoder layers)" in got["bad-vocab"]
    assert "the draft's d2t has shape [96], its draft_vocab_size is 128" in got["bad-vocab"]
    assert "the draft's aux layer ids [2, 3, 4] (as served: input convention) include [4], outside 0..3" \
        in got["bad-ids"], got["bad-ids"]
    assert "the draft's d2t maps 1 of its 96 tokens outside the target's vocabulary of 512 (first: draft token 95 " \
        "-> target token 1190)" in got["bad-d2t"], got["bad-d2t"]

    serve = shutil.which("vllm", path=str(Path(sys.executable).parent))
    assert serve, "no vllm command next to this interpreter"
    env = dict(os.environ)
    env.pop("SPEC_COMPAT_DISABLE", None)
    env.setdefault("VLLM_MLA_DISABLE", "1")
    spec = json.dumps({"method": "eagle3", "model": str(head_dir(WIDE)), "num_speculative_tokens": 3})
    proc = subprocess.run([serve, "serve", str(kimi), "--trust-remote-code", "--max-model-len", "512",
                           "--enforce-eager", "--port", "0", "--speculative-config", spec],
                          env=env, capture_output=True, text=True, timeout=300, cwd=str(ROOT))
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0, out[-3000:]
    assert prefix in out and "reads 1536 features" in out, out[-3000:]
    assert "Loading weights" not in out and "EngineCore" not in out and "Starting vLLM API server" not in out, out[-3000:]


_SERVED_LAYERS = r"""
import json, sys
import spec_compat  # noqa: F401
from vllm import LLM

target, draft = sys.argv[1:3]
llm = LLM(model=target, max_model_len=256, enforce_eager=True, seed=0,
          speculative_config={"method": "eagle3", "model": draft, "num_speculative_tokens": 2})
layers = llm.apply_model(lambda m: tuple(int(i) for i in m.model.aux_hidden_state_layers))[0]
print(f"SERVED served the layers {tuple(layers)}", flush=True)
"""


def _served_layers(target: Path, head: Path, disable: str = "", convention: str | None = None):
    env = dict(os.environ, SPEC_COMPAT_DISABLE=disable, VLLM_ENABLE_V1_MULTIPROCESSING="0")
    env.pop("SPEC_COMPAT_AUX_IDS", None)
    if convention:
        env["SPEC_COMPAT_AUX_IDS"] = convention
    proc = subprocess.run([sys.executable, "-c", _SERVED_LAYERS, str(target), str(head)], env=env,
                          capture_output=True, text=True, timeout=600, cwd=str(ROOT))
    line = next((ln[len("SERVED "):] for ln in proc.stdout.splitlines() if ln.startswith("SERVED ")), None)
    return proc, line


@pytest.fixture(scope="module")
def sglang_head(fixture_dir, head_dir, tmp_path_factory) -> tuple[Path, Path]:
    """An 8-layer Llama target and a TorchSpec-format head whose ``eagle_config`` names the outputs of
    layers 1, 3, 5 (SGLang's convention; vLLM's default for 8 layers is the inputs of 2, 4, 5)."""
    target = fixture_dir("llama+--layers+8")
    head = _variant(head_dir(LLAMA_HEAD), tmp_path_factory.mktemp("sglang") / "head",
                    lambda c: c.update(eagle_config={"eagle_aux_hidden_state_layer_ids": [1, 3, 5]}))
    return target, head


@pytest.mark.parametrize("pid", proof_cases("test_output_convention_head_needs_the_patch"))
def test_output_convention_head_needs_the_patch(sglang_head, prove, pid):
    """Stock vLLM 0.16 ignores the ids in ``eagle_config`` and serves its defaults: other layers than
    the head was trained on, and nothing says so."""
    proof = prove(pid)
    target, head = sglang_head
    stock, line = _served_layers(target, head, proof.disable)
    assert stock.returncode == 0 and line is not None, stock.stderr[-3000:]
    proof.assert_symptom(line, report=True)
    patched, line = _served_layers(target, head, proof.baseline)
    assert patched.returncode == 0, patched.stderr[-3000:]
    proof.assert_absent(line, report=True)
    assert line == "served the layers (2, 4, 6)", line


def test_aux_ids_convention_override(sglang_head):
    """``SPEC_COMPAT_AUX_IDS=input`` reads the same ids as vLLM's (inputs of 1, 3, 5); a malformed
    value is refused naming the variable before anything loads."""
    target, head = sglang_head
    proc, line = _served_layers(target, head, convention="input")
    assert proc.returncode == 0 and line == "served the layers (1, 3, 5)", (line, proc.stderr[-3000:])
    assert "assumed convention 'input'" in proc.stderr, proc.stderr[-3000:]
    proc, line = _served_layers(target, head, convention="sglang")
    assert proc.returncode != 0 and line is None
    assert "spec_compat[eagle3-aux-ids-convention]: SPEC_COMPAT_AUX_IDS='sglang': expected 'auto'" in proc.stderr, \
        proc.stderr[-3000:]


_MLA_FORWARD = r"""
import json, math, sys
import torch
import spec_compat  # noqa: F401
from safetensors.torch import load_file
from spec_compat.patches.serving.eagle3_mla_draft_head import mla_draft
from vllm import LLM, SamplingParams

target, head = sys.argv[1:3]
seen = []
prompt = [(7 * i + 3) % 250 + 20 for i in range(48)]
orig = mla_draft.MlaEagle3Model.forward
def forward(self, input_ids, positions, hidden_states, input_embeds=None):
    out = orig(self, input_ids, positions, hidden_states, input_embeds)
    # the prompt's prefill (warm-up and dummy runs are shorter); a multimodal target's drafter is
    # handed embeddings (input_ids None): of the prompt shifted by one token
    if not seen and input_embeds is not None and input_embeds.shape[0] >= 40 and positions.tolist() == list(range(input_embeds.shape[0])):
        seen.append((input_embeds.float().clone(), positions.clone(), hidden_states.float().clone(),
                     out[0].float().clone(), out[1].float().clone(), str(out[0].dtype)))
    return out
mla_draft.MlaEagle3Model.forward = forward

llm = LLM(model=target, trust_remote_code=True, max_model_len=512, enforce_eager=True, seed=0, dtype="float32",
          speculative_config={"method": "eagle3", "model": head, "num_speculative_tokens": 3})
llm.generate([{"prompt_token_ids": prompt}], SamplingParams(temperature=0, max_tokens=2), use_tqdm=False)
assert seen, "the drafter never ran on the prompt's prefill"
emb, pos, h, got_normed, got_prenorm, dtype = seen[0]
cfg = json.load(open(head + "/config.json"))
W = {k: v.float() for k, v in load_file(head + "/model.safetensors").items()}
eps, H, nh = cfg["rms_norm_eps"], cfg["hidden_size"], cfg["num_attention_heads"]
nope, rope, vd, kvr = cfg["qk_nope_head_dim"], cfg["qk_rope_head_dim"], cfg["v_head_dim"], cfg["kv_lora_rank"]
rs = cfg["rope_scaling"]

def rms(x, w):
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w

def mscale(s, m):
    return 0.1 * m * math.log(s) + 1.0 if s > 1 else 1.0

def inv_freq():  # DeepSeek's YaRN on the rotary dims (the contract of TorchSpec's config)
    base, d, f, orig_max = cfg["rope_theta"], rope, rs["factor"], rs["original_max_position_embeddings"]
    dim_of = lambda n: d * math.log(orig_max / (n * 2 * math.pi)) / (2 * math.log(base))
    lo, hi = max(math.floor(dim_of(rs["beta_fast"])), 0), min(math.ceil(dim_of(rs["beta_slow"])), d - 1)
    hi = hi + 0.001 if lo == hi else hi
    ramp = ((torch.arange(d // 2, dtype=torch.float64) - lo) / (hi - lo)).clamp(0, 1)
    freqs = base ** (torch.arange(0, d, 2, dtype=torch.float64) / d)
    keep = 1 - ramp
    return (1 / (f * freqs)) * (1 - keep) + (1 / freqs) * keep

def rotate(x, p, interleaved):
    ang = p.double()[:, None] * inv_freq()[None]
    m = mscale(rs["factor"], rs["mscale"]) / mscale(rs["factor"], rs["mscale_all_dim"])
    cos, sin = (torch.cos(ang) * m).float()[:, None], (torch.sin(ang) * m).float()[:, None]
    if interleaved:
        a, b = x[..., 0::2], x[..., 1::2]
        return torch.stack((a * cos - b * sin, b * cos + a * sin), dim=-1).flatten(-2)
    a, b = x[..., : rope // 2], x[..., rope // 2:]
    return torch.cat((a * cos - b * sin, b * cos + a * sin), dim=-1)

def reference(interleaved=True):
    L = lambda n: W["midlayer." + n]  # noqa: E731
    T = emb.shape[0]
    x = torch.cat([rms(emb, L("input_layernorm.weight")), rms(h, L("hidden_norm.weight"))], -1)
    q = rms(x @ L("self_attn.q_a_proj.weight").T, L("self_attn.q_a_layernorm.weight")) @ L("self_attn.q_b_proj.weight").T
    q = q.view(T, nh, nope + rope)
    c, k_pe = (x @ L("self_attn.kv_a_proj_with_mqa.weight").T).split([kvr, rope], -1)
    kv = (rms(c, L("self_attn.kv_a_layernorm.weight")) @ L("self_attn.kv_b_proj.weight").T).view(T, nh, nope + vd)
    k_nope, v = kv.split([nope, vd], -1)
    q = torch.cat([q[..., :nope], rotate(q[..., nope:], pos, interleaved)], -1)
    k = torch.cat([k_nope, rotate(k_pe[:, None], pos, interleaved).expand(T, nh, rope)], -1)
    scale = (nope + rope) ** -0.5 * mscale(rs["factor"], rs["mscale_all_dim"]) ** 2
    att = torch.einsum("qhd,khd->hqk", q, k) * scale
    att = att.masked_fill(torch.ones(T, T, dtype=torch.bool).triu(1), float("-inf")).softmax(-1)
    o = torch.einsum("hqk,khd->qhd", att, v).reshape(T, nh * vd) @ L("self_attn.o_proj.weight").T
    resid = o + h
    y = rms(resid, L("post_attention_layernorm.weight"))
    y = (torch.nn.functional.silu(y @ L("mlp.gate_proj.weight").T) * (y @ L("mlp.up_proj.weight").T)) @ L("mlp.down_proj.weight").T
    pre = y + resid
    return rms(pre, W["norm.weight"]), pre

ref_normed, ref_pre = reference()
neox_normed, _ = reference(interleaved=False)
finite = bool(torch.isfinite(got_normed).all() and torch.isfinite(got_prenorm).all())
scale = float(ref_normed.abs().max())
T = emb.shape[0]
shifted = torch.tensor(prompt[1:T])  # the last row embeds the token the target just sampled
want = W["embed_tokens.weight"][shifted]
embed_diff = float((emb[: T - 1] - want).abs().max()) / float(want.abs().max())
print("MLA " + json.dumps({
    "tokens": int(T), "embed_rows_diff": embed_diff, "first_position": int(pos[0]), "dtype": dtype, "finite": finite,
    "shape_ok": list(got_normed.shape) == list(ref_normed.shape) and list(got_prenorm.shape) == list(ref_pre.shape),
    "normed": float((got_normed - ref_normed).abs().max()) / scale,
    "prenorm": float((got_prenorm - ref_pre).abs().max()) / float(ref_pre.abs().max()),
    "neox_rope": float((got_normed - neox_normed).abs().max()) / scale}), flush=True)
"""


def test_mla_head_computes_the_contract(fixture_dir, head_dir):
    """The MLA head's first draft step in the engine (the prompt's prefill) against a plain-torch forward
    of the published contract from the checkpoint's own tensors: both norms, the low-rank query and latent
    key/value projections, DeepSeek's YaRN on the rotary dims (interleaved pairs), causal attention, the
    SiLU MLP.  The same forward with half-split (neox) rotary pairs is far off: the check tells them apart."""
    env = dict(os.environ, VLLM_ENABLE_V1_MULTIPROCESSING="0", VLLM_MLA_DISABLE="1")
    env.pop("SPEC_COMPAT_DISABLE", None)
    proc = subprocess.run([sys.executable, "-c", _MLA_FORWARD, str(fixture_dir("kimi-k25")), str(head_dir(MLA))],
                          env=env, capture_output=True, text=True, timeout=600, cwd=str(ROOT))
    assert proc.returncode == 0, proc.stderr[-4000:]
    out = json.loads(next(ln[4:] for ln in proc.stdout.splitlines() if ln.startswith("MLA ")))
    print(out)
    assert out["finite"] and out["shape_ok"], out
    assert out["tokens"] >= 40 and out["first_position"] == 0, out
    # the head's own embedding of the prompt shifted by one (in the engine's dtype)
    assert out["embed_rows_diff"] <= (1e-6 if out["dtype"] == "torch.float32" else 2 ** -8), out
    tol = 1e-4 if out["dtype"] == "torch.float32" else 3e-2  # bf16 engine: one layer of bf16 rounding
    assert out["normed"] <= tol and out["prenorm"] <= tol, out
    assert out["neox_rope"] >= 10 * max(out["normed"], tol), out
