"""``spec-compat evaluate``'s input checks and counter arithmetic (no engine: these run
before vLLM is imported, or on plain numbers)."""

from __future__ import annotations

import json

import pytest

from spec_compat.cli import main
from spec_compat.cli.evaluate import EvaluateError, load_prompts, summarise


class FakeTokenizer:
    def __call__(self, text, add_special_tokens=True):
        return {"input_ids": [1] + [ord(c) for c in text]}

    def apply_chat_template(self, turns, add_generation_prompt=True, tokenize=True):
        ids = [1]
        for t in turns:
            ids += [2] + [ord(c) for c in t["content"]]
        return ids + ([3] if add_generation_prompt else [])


def test_missing_target_is_a_clear_error_before_any_engine(tmp_path, capsys):
    draft = tmp_path / "draft"
    draft.mkdir()
    (draft / "config.json").write_text("{}")
    rc = main(["evaluate", "--target", str(tmp_path / "nope"), "--draft", str(draft)])
    assert rc == 2
    assert "target" in capsys.readouterr().err


def test_directory_without_config_is_refused(tmp_path, capsys):
    (tmp_path / "t").mkdir()
    (tmp_path / "d").mkdir()
    rc = main(["evaluate", "--target", str(tmp_path / "t"), "--draft", str(tmp_path / "d")])
    assert rc == 2
    assert "config.json" in capsys.readouterr().err


def test_a_target_passed_as_draft_is_refused(tmp_path, capsys):
    for name, cfg in (("t", {"model_type": "llama", "architectures": ["LlamaForCausalLM"]}),
                      ("d", {"model_type": "llama", "architectures": ["LlamaForCausalLM"]})):
        (tmp_path / name).mkdir()
        (tmp_path / name / "config.json").write_text(json.dumps(cfg))
    rc = main(["evaluate", "--target", str(tmp_path / "t"), "--draft", str(tmp_path / "d")])
    assert rc == 2
    assert "not an EAGLE-3 draft" in capsys.readouterr().err


@pytest.mark.parametrize("k", ["0", "-1"])
def test_k_must_be_positive(tmp_path, capsys, k):
    rc = main(["evaluate", "--target", str(tmp_path), "--draft", str(tmp_path), "--k", k])
    assert rc == 2
    assert "--k" in capsys.readouterr().err


def test_prompt_formats(tmp_path):
    f = tmp_path / "p.jsonl"
    f.write_text("\n".join(json.dumps(o) for o in (
        {"prompt_token_ids": [5, 6, 7]},
        {"prompt": "ab"},
        {"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "x"}]},
    )) + "\n\n")
    assert load_prompts(f, FakeTokenizer()) == [[5, 6, 7], [1, 97, 98], [1, 2, 104, 105, 3]]
    txt = tmp_path / "p.txt"
    txt.write_text("ab\n\nc\n")
    assert load_prompts(txt, FakeTokenizer(), limit=1) == [[1, 97, 98]]


@pytest.mark.parametrize("line, needle", [
    ("{not json", "not JSON"),
    ('{"prompt_token_ids": [1, -2]}', "non-negative"),
    ('{"prompt_token_ids": []}', "non-empty"),
    ('{"messages": [{"role": "assistant", "content": "x"}]}', "starts with an assistant"),
    ('{"other": 1}', "needs prompt_token_ids"),
    ("[1, 2]", "JSON object"),
])
def test_malformed_prompt_lines_name_file_and_line(tmp_path, line, needle):
    f = tmp_path / "bad.jsonl"
    f.write_text('{"prompt_token_ids": [1]}\n' + line + "\n")
    with pytest.raises(EvaluateError, match=needle) as exc:
        load_prompts(f, FakeTokenizer())
    assert "bad.jsonl:2" in str(exc.value)


def test_empty_or_missing_prompts_file(tmp_path):
    with pytest.raises(EvaluateError, match="not found"):
        load_prompts(tmp_path / "none.jsonl", FakeTokenizer())
    (tmp_path / "empty.jsonl").write_text("\n")
    with pytest.raises(EvaluateError, match="no prompt"):
        load_prompts(tmp_path / "empty.jsonl", FakeTokenizer())


def test_shipped_eval_prompts_load():
    assert len(load_prompts(None, FakeTokenizer())) == 16


def test_summarise_takes_counter_deltas_and_finds_the_first_mismatch():
    before = {"num_drafts": 10, "num_draft_tokens": 30, "num_accepted_tokens": 5,
              "num_accepted_tokens_per_pos": [3, 2, 0]}
    after = {"num_drafts": 30, "num_draft_tokens": 90, "num_accepted_tokens": 25,
             "num_accepted_tokens_per_pos": [13, 8, 4]}
    same = [[1, 2, 3], [4, 5]]
    res = summarise(same, same, before, after, k=3)
    assert (res.drafts, res.draft_tokens, res.accepted_tokens) == (20, 60, 20)
    assert res.per_position_accepted == [10, 6, 4]
    assert res.per_position == [0.5, 0.3, 0.2]
    assert res.mean_acceptance_length == pytest.approx(2.0)
    assert res.acceptance_rate == pytest.approx(1 / 3)
    assert res.lossless and res.first_mismatch is None and res.output_tokens == 5
    diff = summarise(same, [[1, 2, 3], [4, 9]], before, after, k=3)
    assert not diff.lossless and diff.first_mismatch == {"prompt": 1, "position": 1}
    shorter = summarise(same, [[1, 2], [4, 5]], before, after, k=3)
    assert not shorter.lossless and shorter.first_mismatch == {"prompt": 0, "position": 2}


def test_summarise_reports_the_run_seen_from_the_outputs():
    """``from_outputs``: the output processor's decode steps and delivered tokens (deltas), and
    the accepted tokens they imply (output tokens - prompts - steps, up to k more per prompt
    for what a last step dropped past max_tokens); None where vLLM lacks those metrics."""
    before = {"num_drafts": 0, "output_steps": 7, "output_tokens": 100}
    after = {"num_drafts": 5, "output_steps": 12, "output_tokens": 110}
    spec = [[1, 2, 3, 4, 5, 6], [7, 8, 9, 10]]  # 10 tokens, 2 prompts
    res = summarise(spec, spec, before, after, k=3)
    assert res.from_outputs == {"decode_steps": 5, "generation_tokens": 10,
                                "accepted_tokens_min": 3, "accepted_tokens_max": 9}
    assert summarise(spec, spec, {"num_drafts": 0}, {"num_drafts": 5}, k=3).from_outputs is None
