"""``spec-compat evaluate --draft A --draft B``: several drafts, one table / JSON, a plot; a spec-compat
refusal from inside vLLM's config checks in one line, for one draft or several (the engine runs are
faked here; the real ones: tests/engine/test_published_heads.py)."""

from __future__ import annotations

import json

import pytest

from spec_compat.cli import compare_drafts as cd
from spec_compat.cli import main
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
    rc = main(["evaluate", "--target", "t", "--draft", "runs/a/draft", "--draft", "runs/b/draft", *(["--json"] if as_json else [])])
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
    assert main(["evaluate", "--target", "t", "--draft", "a", "--draft", "b"]) == 1
    assert "outputs differ from the reference with b" in capfd.readouterr().err


def _drafts(n: int) -> list[str]:
    return [a for i in range(n) for a in ("--draft", f"d{i}")]


@pytest.mark.parametrize("n", [1, 2])
def test_a_refusal_is_one_line(monkeypatch, capfd, n):
    def refused(*args, **kwargs):
        raise ValueError("1 validation error for SpeculativeConfig\n  Value error, spec_compat[eagle3-draft-fits-target]: "
                         "the EAGLE-3 draft d does not fit the target t: widths 512 vs 256. Nothing was loaded. "
                         "[type=value_error, input_value=ArgsKwargs(())]")

    monkeypatch.setattr(cd, "evaluate_drafts", refused)  # several drafts
    monkeypatch.setattr(cd, "evaluate", refused)  # one draft
    assert main(["evaluate", "--target", "t", *_drafts(n)]) == 2
    assert capfd.readouterr().err.strip().splitlines()[-1] == (
        "spec-compat evaluate: spec_compat[eagle3-draft-fits-target]: the EAGLE-3 draft d does "
        "not fit the target t: widths 512 vs 256. Nothing was loaded.")


@pytest.mark.parametrize("n", [1, 2])
def test_other_errors_pass_through(monkeypatch, n):
    def broken(*args, **kwargs):
        raise RuntimeError("engine died")

    monkeypatch.setattr(cd, "evaluate_drafts", broken)
    monkeypatch.setattr(cd, "evaluate", broken)
    with pytest.raises(RuntimeError, match="engine died"):
        main(["evaluate", "--target", "t", *_drafts(n)])


@pytest.mark.parametrize("n", [1, 2])
def test_bad_paths_are_refused_before_any_engine(tmp_path, capfd, n):
    assert main(["evaluate", "--target", str(tmp_path / "none"), *_drafts(n)]) == 2
    assert "is not a directory" in capfd.readouterr().err


def test_one_draft_keeps_evaluates_document_and_plots(monkeypatch, capfd, tmp_path):
    """One ``--draft``: evaluate's own JSON document (not a list); ``--plot`` draws its line."""
    plotted = []
    monkeypatch.setattr(cd, "evaluate", lambda *a, **k: _result())
    monkeypatch.setattr(cd, "plot_positions", lambda drafts, results, path: plotted.append((drafts, path)) or True)
    assert main(["evaluate", "--target", "t", "--draft", "d", "--json", "--plot", str(tmp_path / "p.png")]) == 0
    doc = json.loads(capfd.readouterr().out)
    assert doc["mean_acceptance_length"] == 2.5 and "drafts" in doc and not isinstance(doc["drafts"], list)
    assert plotted == [(["d"], str(tmp_path / "p.png"))]


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


def test_plot_draws_one_line_per_draft(tmp_path):
    """With matplotlib (a test requirement of every cell, matrix/cells.py): a PNG with a line and a
    legend entry per draft, each naming its acceptance length."""
    pytest.importorskip("matplotlib")
    import matplotlib.pyplot as plt

    saved = []
    real_savefig = plt.Figure.savefig

    def keep(fig, path, *args, **kwargs):
        saved.append([(line.get_label(), list(line.get_ydata())) for line in fig.axes[0].get_lines()])
        return real_savefig(fig, path, *args, **kwargs)

    plt.Figure.savefig = keep
    try:
        assert cd.plot_positions(["runs/a/draft", "runs/b/draft"], [_result(), _result(1.25, (0.2, 0.05, 0.0))],
                                 str(tmp_path / "p.png")) is True
    finally:
        plt.Figure.savefig = real_savefig
    png = (tmp_path / "p.png").read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 5000
    assert saved == [[("a/draft (acceptance length 2.50)", [0.75, 0.5, 0.25]),
                      ("b/draft (acceptance length 1.25)", [0.2, 0.05, 0.0])]]
