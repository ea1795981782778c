"""``spec-compat doctor`` on the Llama fixture: training data built from a transformers forward of the
target exactly as the stock pipeline writes it (speculators >= 0.5's layout), once clean and once with
each silent defect planted the way the pipeline produces it.  The doctor must name each planted defect
in the check that owns it, and raise no problem on the clean data and draft."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("datasets")
pytest.importorskip("safetensors")
torch = pytest.importorskip("torch")

ROOT = Path(__file__).resolve().parents[2]
AUX = [0, 1, 2]  # the draft's aux layers (input convention) on the 4-layer fixture
REPLIES = ["the quick brown fox jumps over the lazy dog " * 3, "pack my box with five dozen liquor jugs " * 4,
           "how vexingly quick daft zebras jump " * 5, "sphinx of black quartz, judge my vow " * 4,
           "a wizard's job is to vex chumps quickly in fog " * 3, "we promptly judged antique ivory buckles " * 4]
PROMPTS = ["tell me a story", "what is a pangram?", "say something", "write a line", "another one", "go on"]


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    from transformers import AutoTokenizer

    from spec_compat.fixtures.llama import build_llama
    from spec_compat.fixtures.sharegpt import rendered_ids
    from spec_compat.verify.reference import layer_states, load_reference_model

    root = tmp_path_factory.mktemp("doctor")
    target = build_llama(root / "target")
    tok = AutoTokenizer.from_pretrained(str(target))
    model = load_reference_model(target)
    samples, masks = [], []
    for p, r in zip(PROMPTS, REPLIES):
        prompt = rendered_ids(tok, [{"role": "user", "content": p}])
        reply = list(tok(r, add_special_tokens=False)["input_ids"]) + [tok.eos_token_id]
        samples.append(prompt + reply)
        masks.append([0] * len(prompt) + [1] * len(reply))

    def rows_of(ids, where="input"):
        n = 4
        taps = [(a, where) for a in AUX] + [(n - 1, "output")]
        return torch.stack(layer_states(model, ids, taps), dim=1).to(torch.bfloat16)

    return {"root": root, "target": target, "tok": tok, "model": model, "samples": samples, "masks": masks,
            "rows_of": rows_of}


def write_data(d: Path, samples, masks, rows) -> Path:
    from datasets import Dataset
    from safetensors.torch import save_file

    ds = Dataset.from_dict({"input_ids": samples, "loss_mask": masks, "seq_len": [len(s) for s in samples]})
    ds.save_to_disk(str(d))
    (d / "hidden_states").mkdir()
    for i, (s, r) in enumerate(zip(samples, rows)):
        save_file({"hidden_states": r.contiguous(), "token_ids": torch.tensor(s)}, str(d / "hidden_states" / f"hs_{i}.safetensors"))
    return d


def write_draft(d: Path, vocab_ids: list[int]) -> Path:
    from safetensors.torch import save_file

    d.mkdir(parents=True)
    h, v = 256, len(vocab_ids)
    d2t = torch.tensor([t - i for i, t in enumerate(sorted(vocab_ids))], dtype=torch.long)
    t2d = torch.zeros(512, dtype=torch.bool)
    t2d[sorted(vocab_ids)] = True
    save_file({"fc.weight": torch.zeros(h, 3 * h), "lm_head.weight": torch.zeros(v, h), "d2t": d2t, "t2d": t2d},
              str(d / "model.safetensors"))
    (d / "config.json").write_text(json.dumps({
        "speculators_model_type": "eagle3", "architectures": ["Eagle3Speculator"], "draft_vocab_size": v,
        "target_hidden_size": h, "eagle_aux_hidden_state_layer_ids": AUX,
        "transformer_layer_config": {"hidden_size": h, "vocab_size": 512, "num_hidden_layers": 1}}))
    return d


def train_draft(d: Path, world, vocab_ids: list[int], before_norm: bool = False, steps: int = 150) -> Path:
    """A one-layer EAGLE-3 draft (speculators 0.9's layout) trained on the fixture's samples, with the
    doctor's own first-step forward, to guess the target's next token after its final norm or, with
    ``before_norm``, from the last layer without it (O7's targets)."""
    from safetensors.torch import save_file

    from spec_compat.doctor.draft_forward import first_logits
    from spec_compat.doctor.rows import target_states

    layer = {"hidden_size": 256, "vocab_size": 512, "num_hidden_layers": 1, "num_attention_heads": 4,
             "num_key_value_heads": 2, "head_dim": 64, "intermediate_size": 512, "rms_norm_eps": 1e-5,
             "rope_theta": 10000.0}
    cfg = {"speculators_model_type": "eagle3", "architectures": ["Eagle3DraftModel"], "draft_vocab_size": len(vocab_ids),
           "target_hidden_size": 256, "eagle_aux_hidden_state_layer_ids": AUX, "norm_before_residual": False,
           "transformer_layer_config": layer}
    shapes = {"fc.weight": (256, 768), "layers.0.self_attn.q_proj.weight": (256, 512),
              "layers.0.self_attn.k_proj.weight": (128, 512), "layers.0.self_attn.v_proj.weight": (128, 512),
              "layers.0.self_attn.o_proj.weight": (256, 256), "layers.0.mlp.gate_proj.weight": (512, 256),
              "layers.0.mlp.up_proj.weight": (512, 256), "layers.0.mlp.down_proj.weight": (256, 512),
              "lm_head.weight": (len(vocab_ids), 256)}
    gen = torch.Generator().manual_seed(0)
    w = {k: (torch.randn(sh, generator=gen) / sh[-1] ** 0.5).requires_grad_() for k, sh in shapes.items()}
    for k in ("layers.0.input_layernorm.weight", "layers.0.hidden_norm.weight",
              "layers.0.post_attention_layernorm.weight", "norm.weight"):
        w[k] = torch.ones(256, requires_grad=True)
    model = world["model"]
    embed, head = model.get_input_embeddings().weight.detach(), model.get_output_embeddings().weight.detach()
    vocab = sorted(vocab_ids)
    to_draft = torch.full((512,), -100, dtype=torch.long)
    to_draft[vocab] = torch.arange(len(vocab))
    batch = []
    for ids in world["samples"]:
        st = target_states(model, ids)
        nxt = (st["prenorm" if before_norm else "postnorm"] @ head.T).argmax(-1)[1:]
        batch.append((torch.cat([st[f"input:{i}"] for i in AUX], -1), torch.tensor(ids), to_draft[nxt]))
    opt = torch.optim.Adam(list(w.values()), lr=3e-3)
    for _ in range(steps):
        opt.zero_grad()
        loss = sum(torch.nn.functional.cross_entropy(first_logits(w, cfg, a, i, embed), t, ignore_index=-100)
                   for a, i, t in batch)
        loss.backward()
        opt.step()
    d.mkdir(parents=True)
    t2d = torch.zeros(512, dtype=torch.bool)
    t2d[vocab] = True
    out = {k: v.detach().contiguous() for k, v in w.items()}
    out.update({"d2t": torch.tensor([t - i for i, t in enumerate(vocab)], dtype=torch.long), "t2d": t2d})
    save_file(out, str(d / "model.safetensors"))
    (d / "config.json").write_text(json.dumps(cfg))
    return d


def doctor(world, data: Path, draft: Path) -> dict:
    from spec_compat.doctor import Inputs, as_json, run_checks

    inp = Inputs(world["target"], draft, data, samples=6)
    inp._cache["model"] = world["model"]  # one reference model for the module's runs
    return {c["check"]: c for c in as_json(run_checks(inp))["checks"]}


def reply_vocab(world) -> list[int]:
    seen = sorted({t for s, m in zip(world["samples"], world["masks"]) for t, k in zip(s, m) if k})
    return seen + [t for t in range(512) if t not in seen][:128 - len(seen)]


@pytest.fixture(scope="module")
def clean(world):
    rows = [world["rows_of"](s) for s in world["samples"]]
    data = write_data(world["root"] / "clean", world["samples"], world["masks"], rows)
    return data, train_draft(world["root"] / "draft", world, reply_vocab(world))


def test_clean_data_and_draft_raise_no_problem(world, clean):
    got = doctor(world, *clean)
    assert {k: v["status"] for k, v in got.items()} == {"fit": "ok", "rows": "ok", "tokens": "ok", "vocabulary": "ok",
                                                       "targets": "ok", "measured": "skipped"}, got
    assert "no --prompts" in got["measured"]["summary"]
    assert got["rows"]["evidence"]["own_rows"] == 1.0


def test_o6_layer_outputs_are_named_one_layer_off(world, clean):
    rows = [world["rows_of"](s, "output") for s in world["samples"]]
    data = write_data(world["root"] / "o6", world["samples"], world["masks"], rows)
    got = doctor(world, data, clean[1])
    assert got["rows"]["status"] == "problem" and "one layer off (O6" in got["rows"]["summary"], got["rows"]
    assert '"eagle_aux_hidden_state_layer_ids": [1, 2, 3]' in got["rows"]["fix"]
    assert got["targets"]["status"] == "ok", got["targets"]  # the draft learned the target's own tokens


def test_f8_rows_shifted_by_cached_blocks_are_named(world, clean):
    """Prefix caching served a 16-token block of every sample but the first; the capture, sliced by the
    full lengths in input order, shifts each later sample's rows by the blocks skipped before it."""
    full = [world["rows_of"](s) for s in world["samples"]]
    capture = torch.cat([full[0]] + [r[16:] for r in full[1:]])
    rows, pos = [], 0
    for s in world["samples"]:
        rows.append(capture[pos:pos + len(s)])
        pos += len(s)
    kept = [(s, m[:len(r)], r) for s, m, r in zip(world["samples"], world["masks"], rows) if len(r) > 1]
    data = write_data(world["root"] / "f8", [s[:len(r)] for s, _, r in kept], [m for _, m, _ in kept],
                      [r for _, _, r in kept])
    got = doctor(world, data, clean[1])
    assert got["rows"]["status"] == "problem" and "(F8)" in got["rows"]["summary"], got["rows"]
    assert "prefix-caching-off" in got["rows"]["fix"]
    assert got["targets"]["status"] == "ok", got["targets"]  # the draft learned the target's own tokens


def test_f9_truncated_rows_are_named(world, clean):
    """Chunked prefill aborted after one step: the long samples keep only their first rows, ids in full."""
    rows = [world["rows_of"](s) for s in world["samples"]]
    rows = [r[:len(r) // 2] if i % 2 else r for i, r in enumerate(rows)]
    data = write_data(world["root"] / "f9", world["samples"], world["masks"], rows)
    got = doctor(world, data, clean[1])
    assert got["rows"]["status"] == "problem" and "(truncated: F9" in got["rows"]["summary"], got["rows"]
    assert "keep-unfinished-prefill" in got["rows"]["fix"]
    assert len(got["rows"]["evidence"]["short_samples"]) == 3


def test_f10_rows_of_other_sequences_are_named(world, clean):
    """The engine finished the batch in another order than the input's; the capture was sliced by the
    input order's lengths: every sample gets rows of other sequences, row counts right."""
    full = [world["rows_of"](s) for s in world["samples"]]
    capture = torch.cat(full[::-1])
    rows, pos = [], 0
    for s in world["samples"]:
        rows.append(capture[pos:pos + len(s)])
        pos += len(s)
    data = write_data(world["root"] / "f10", world["samples"], world["masks"], rows)
    got = doctor(world, data, clean[1])
    assert got["rows"]["status"] == "problem" and "(F10)" in got["rows"]["summary"], got["rows"]
    assert "rows-by-request-id" in got["rows"]["fix"]
    assert got["rows"]["evidence"]["foreign_rows"] > 0.5


def test_k6_data_without_samples_is_named(world, clean):
    """A slow tokenizer gives no offsets: speculators 0.3/0.4's preprocessing drops every conversation, and
    the generator script (nothing to generate) returns before writing anything into its output directory."""
    data = world["root"] / "k6"
    data.mkdir()
    got = doctor(world, data, clean[1])
    assert got["rows"]["status"] == "problem" and "(K6" in got["rows"]["summary"], got["rows"]
    assert "slow-tokenizer-offsets" in got["rows"]["fix"]
    assert {got[c]["status"] for c in ("tokens", "vocabulary", "targets")} == {"skipped"}, got


def test_k3_rows_unlike_the_target_are_named(world, clean):
    """Rows that are no state of the target at all (K3: a layer called without an argument its model
    computes, e.g. DeepSeek-V3's ``llama_4_scaling``; or rows of another checkpoint): every slot off."""
    gen = torch.Generator().manual_seed(3)
    rows = []
    for s in world["samples"]:
        r = world["rows_of"](s).float()
        rows.append((r + 0.6 * r.std() * torch.randn(r.shape, generator=gen)).to(torch.bfloat16))
    data = write_data(world["root"] / "k3", world["samples"], world["masks"], rows)
    got = doctor(world, data, clean[1])
    assert got["rows"]["status"] == "problem" and "match no state of the target" in got["rows"]["summary"], got["rows"]
    assert "capture-layer-hooks" in got["rows"]["fix"]
    assert "(F10)" not in got["rows"]["summary"]
    assert {got[c]["status"] for c in ("tokens", "vocabulary", "targets")} == {"ok"}, got


def test_g1_masks_of_other_samples_are_named(world, clean):
    masks = world["masks"][1:] + world["masks"][:1]  # each sample trained with another's mask
    masks = [(m + [0] * len(s))[:len(s)] for s, m in zip(world["samples"], masks)]
    rows = [world["rows_of"](s) for s in world["samples"]]
    data = write_data(world["root"] / "g1", world["samples"], masks, rows)
    got = doctor(world, data, clean[1])
    assert got["tokens"]["status"] == "problem" and "(G1" in got["tokens"]["summary"], got["tokens"]
    assert got["rows"]["status"] == "ok"
    assert got["targets"]["status"] == "ok", got["targets"]  # the draft learned the target's own tokens


def test_two_bos_is_named(world, clean):
    bos = world["tok"].bos_token_id
    samples = [[bos] + s for s in world["samples"]]
    rows = [world["rows_of"](s) for s in samples]
    data = write_data(world["root"] / "bos2", samples, [[0] + m for m in world["masks"]], rows)
    got = doctor(world, data, clean[1])
    assert got["tokens"]["status"] == "problem" and "two BOS" in got["tokens"]["summary"], got["tokens"]
    assert got["targets"]["status"] == "ok", got["targets"]  # the draft learned the target's own tokens


def test_a_vocabulary_from_other_data_is_named(world, clean):
    seen = set(reply_vocab(world)[:40])
    other = [t for t in range(512) if t not in seen][:128]
    draft = write_draft(world["root"] / "draft_other_vocab", other)
    got = doctor(world, clean[0], draft)
    assert got["vocabulary"]["status"] == "problem" and "built from other data" in got["vocabulary"]["summary"]
    assert got["vocabulary"]["evidence"]["covered"] < 0.5


def test_o7_targets_before_the_final_norm_are_named(world, clean):
    """The same recipe with the trainer's targets taken from the last layer without the final norm: the
    draft guesses what the target never emits where the norm changes the next token."""
    draft = train_draft(world["root"] / "draft_o7", world, reply_vocab(world), before_norm=True)
    got = doctor(world, clean[0], draft)
    t = got["targets"]
    assert t["status"] == "problem" and "(O7" in t["summary"], t
    assert "targets-after-final-norm" in t["fix"]
    assert t["evidence"]["positions_where_the_norm_changes_the_token"] >= 10
    assert t["evidence"]["draft_follows_without_norm"] > t["evidence"]["draft_follows_after_norm"]
    ok = doctor(world, *clean)["targets"]
    assert ok["status"] == "ok", ok
    assert ok["evidence"]["draft_follows_after_norm"] > ok["evidence"]["draft_follows_without_norm"]
    assert ok["evidence"]["first_guess_agrees_with_target"] > 0.5


def test_missing_inputs_are_skipped_lines_not_tracebacks(world, clean, tmp_path):
    got = doctor(world, tmp_path / "nowhere", clean[1])
    assert got["rows"]["status"] == "skipped" and "does not exist" in got["rows"]["summary"]
    empty = tmp_path / "draft_without_weights"
    empty.mkdir()
    (empty / "config.json").write_text((clean[1] / "config.json").read_text())
    got = doctor(world, clean[0], empty)
    assert got["fit"]["status"] == "skipped" and "no weight file" in got["fit"]["summary"]
    assert got["vocabulary"]["status"] == "skipped" and str(empty) in got["vocabulary"]["summary"]
    proc = subprocess.run([sys.executable, "-m", "spec_compat", "doctor", "--target", str(world["target"]),
                           "--draft", str(tmp_path / "no_draft")], capture_output=True, text=True, cwd=str(ROOT),
                          timeout=120)
    assert proc.returncode == 2 and "no_draft" in proc.stderr and "Traceback" not in proc.stderr


def test_the_0_3_layout_is_read_with_its_layer_ids(world, clean, tmp_path):
    """speculators 0.3/0.4's ``data_{i}.pt`` (a list of [T, H] per captured layer) and ``data_config.json``:
    the same rows read the same way; the captured layer ids are shown as evidence."""
    d = tmp_path / "pt"
    d.mkdir()
    for i, s in enumerate(world["samples"]):
        r = world["rows_of"](s, "output")  # 0.3 captures layer outputs (O6 when served as inputs)
        torch.save({"input_ids": torch.tensor(s), "hidden_states": [r[:, j] for j in range(r.shape[1])],
                    "loss_mask": torch.tensor(world["masks"][i])}, d / f"data_{i}.pt")
    (d / "data_config.json").write_text(json.dumps({"hidden_states": {"layer_ids": [0, 1, 2, 3]}}))
    got = doctor(world, d, clean[1])
    assert got["rows"]["evidence"]["data_config_layer_ids"] == [0, 1, 2, 3]
    assert got["rows"]["status"] == "problem" and "one layer off (O6" in got["rows"]["summary"]
    assert got["tokens"]["status"] == "ok"
