"""``python -m spec_compat.cli.compare_drafts``: several drafts, one table / JSON; a spec-compat
refusal from inside vLLM's config checks in one line (the engine runs are faked here; the real ones:
tests/engine/test_published_heads.py)."""

from __future__ import annotations

import json

import pytest

from spec_compat.cli import compare_drafts as cd
from spec_compat.cli.evaluate import EvalResult


def _result(mal: float = 2.5, pos=(0.75, 0.5, 0.25), lossless: bool = True) -> EvalResult:
    return EvalResult(lossless=lossless, drafts=4, draft_tokens=12, accepted_tokens=6, acceptance_rate=0.5,
                      mean_acceptance_length=mal, per_position=list(pos), per_position_accepted=[3, 2, 1],
                      k=3, prompts=2, output_tokens=16)


@pytest.mark.parametrize("as_json", [False, True])
def test_several_drafts_in_one_table(monkeypatch, capfd, as_json):
    def fake(target, drafts, **kwargs):
        assert drafts == ["runs/a/draft", "runs/b/draft"]
        print("vLLM noise on stdout")
        return [_result(), _result(1.25, (0.2, 0.05, 0.0))]

    monkeypatch.setattr(cd, "evaluate_drafts", fake)
    rc = cd.main(["--target", "t", "--draft", "runs/a/draft", "--draft", "runs/b/draft", *(["--json"] if as_json else [])])
    out, err = capfd.readouterr()
    assert rc == 0, err
    assert "vLLM noise" not in out and "vLLM noise" in err
    if as_json:
        got = json.loads(out)["drafts"]
        assert [d["draft"] for d in got] == ["runs/a/draft", "runs/b/draft"]
        assert [d["mean_acceptance_length"] for d in got] == [2.5, 1.25]
    else:
        lines = out.splitlines()
        # two drafts named "draft": the table names them parent/name
        row_a = next(ln for ln in lines if ln.startswith("a/draft")).split()
        row_b = next(ln for ln in lines if ln.startswith("b/draft")).split()
        assert row_a[1:] == ["yes", "2.500", "0.500", "0.750", "0.500", "0.250"]
        assert row_b[1:3] == ["yes", "1.250"]


def test_a_lossy_draft_fails_the_run(monkeypatch, capfd):
    monkeypatch.setattr(cd, "evaluate_drafts", lambda *a, **k: [_result(), _result(lossless=False)])
    assert cd.main(["--target", "t", "--draft", "a", "--draft", "b"]) == 1
    assert "outputs differ from the reference with b" in capfd.readouterr().err


def test_a_refusal_is_one_line(monkeypatch, capfd):
    def refused(*args, **kwargs):
        raise ValueError("1 validation error for SpeculativeConfig\n  Value error, spec_compat[eagle3-draft-fits-target]: "
                         "the EAGLE-3 draft d does not fit the target t: widths 512 vs 256. Nothing was loaded. "
                         "[type=value_error, input_value=ArgsKwargs(())]")

    monkeypatch.setattr(cd, "evaluate_drafts", refused)
    assert cd.main(["--target", "t", "--draft", "d"]) == 2
    assert capfd.readouterr().err.strip().splitlines()[-1] == (
        "python -m spec_compat.cli.compare_drafts: spec_compat[eagle3-draft-fits-target]: the EAGLE-3 draft d does "
        "not fit the target t: widths 512 vs 256. Nothing was loaded.")


def test_other_errors_pass_through(monkeypatch):
    def broken(*args, **kwargs):
        raise RuntimeError("engine died")

    monkeypatch.setattr(cd, "evaluate_drafts", broken)
    with pytest.raises(RuntimeError, match="engine died"):
        cd.main(["--target", "t", "--draft", "d"])


def test_bad_paths_are_refused_before_any_engine(tmp_path, capfd):
    assert cd.main(["--target", str(tmp_path / "none"), "--draft", str(tmp_path)]) == 2
    assert "is not a directory" in capfd.readouterr().err


def test_plot_without_matplotlib_is_a_warning(monkeypatch, caplog, tmp_path):
    import builtins

    real = builtins.__import__

    def no_mpl(name, *args, **kwargs):
        if name.startswith("matplotlib"):
            raise ImportError("no matplotlib")
        return real(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_mpl)
    assert cd.plot_positions(["a"], [_result()], str(tmp_path / "p.png")) is False
    assert not (tmp_path / "p.png").exists()
    assert "--plot needs matplotlib" in caplog.text
