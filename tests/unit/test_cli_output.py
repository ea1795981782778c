"""Where the commands write: ``--json`` is exactly one JSON document on stdout (whatever the libraries
print on fd 1), the demo writes one line per step and its summary, and the libraries' output goes to
its log file (``--verbose``: to stderr).  The engine is replaced by stand-ins that write like vLLM
(a logger on stdout, raw writes on fds 1 and 2); tests/engine/test_cli.py runs the real one."""

from __future__ import annotations

import io
import json
import logging
import os
import sys
from pathlib import Path

import pytest

from spec_compat.cli import main
from spec_compat.cli import demo as demo_cli
from spec_compat.cli import compare_drafts as evaluate_cli  # the evaluate command
from spec_compat.cli import report as report_cli
from spec_compat.cli.console import Progress, progress_for
from spec_compat.cli.evaluate import EvalResult

NOISE = ("vllm-logger-on-stdout", "raw-fd1-write", "raw-fd2-write", "print-to-sys-stdout", "info-on-spec-compat")


def _noise() -> None:
    """What vLLM, speculators and tqdm do meanwhile: a logger on sys.stdout, raw fd writes, prints."""
    vllm_like = logging.getLogger("test_cli_output.vllm")
    handler = logging.StreamHandler(sys.stdout)
    vllm_like.addHandler(handler)
    vllm_like.propagate = False
    try:
        vllm_like.warning(NOISE[0])
    finally:
        vllm_like.removeHandler(handler)
    sys.stdout.flush()
    os.write(1, (NOISE[1] + "\n").encode())
    os.write(2, (NOISE[2] + "\n").encode())
    print(NOISE[3])
    logging.getLogger("spec_compat").info(NOISE[4])


def _report_data() -> dict:
    _noise()
    return {"spec_compat": "0", "versions": {"vllm": "0.16.0"},
            "providers": {"vllm": {"distribution": "vllm", "installed": {"vllm": "0.16.0"}}},
            "platform": {"python": "3", "machine": "x", "vllm_platform": "cpu", "cuda_available": False},
            "tested": {"tested": True, "message": "tested"},
            "patches": [{"id": "p", "status": "applied", "target": "t", "reason": "r"}], "notes": ["n"]}


def test_report_json_is_the_whole_stdout(monkeypatch, capfd):
    monkeypatch.setattr(report_cli, "report_data", _report_data)
    assert main(["report", "--json"]) == 0
    out, err = capfd.readouterr()
    assert json.loads(out)["patches"][0]["id"] == "p"
    for text in NOISE[:3]:
        assert text in err


def test_report_text_keeps_stdout_for_the_report(monkeypatch, capfd):
    monkeypatch.setattr(report_cli, "report_data", _report_data)
    assert main(["report"]) == 0
    out, _err = capfd.readouterr()
    assert out.startswith("spec-compat 0\n") and "note: n" in out
    assert not any(text in out for text in NOISE)


def _eval_result(lossless: bool = True) -> EvalResult:
    return EvalResult(lossless=lossless, drafts=4, draft_tokens=12, accepted_tokens=6, acceptance_rate=0.5,
                      mean_acceptance_length=2.5, per_position=[0.75, 0.5, 0.25], per_position_accepted=[3, 2, 1],
                      k=3, prompts=2, output_tokens=16)


@pytest.mark.parametrize("lossless", [True, False])
def test_evaluate_json_is_the_whole_stdout(monkeypatch, capfd, lossless):
    def fake_evaluate(*args, **kwargs):
        _noise()
        return _eval_result(lossless)

    monkeypatch.setattr(evaluate_cli, "evaluate", fake_evaluate)
    rc = main(["evaluate", "--target", "t", "--draft", "d", "--json"])
    out, err = capfd.readouterr()
    assert rc == (0 if lossless else 1)
    assert json.loads(out)["lossless"] is lossless
    for text in NOISE[:3]:
        assert text in err


def _fake_run_demo(fail: bool = False):
    def run_demo(model, out, *, progress, **kwargs):
        out_dir = Path(out)
        res = demo_cli.DemoResult(out=out_dir, model_dir=out_dir / "model", data_dir=out_dir / "hidden_states",
                                  draft_dir=out_dir / "draft", losses=[2.0, 1.0], samples=3, tokens=30)
        with progress(2) as p:
            p.step("first step", _noise)
            if fail:
                p.step("failing step", lambda: 1 / 0)
            p.step("second step", lambda: print("second-step-output"))
        res.timings = p.timings
        return res

    return run_demo


def test_demo_json_is_the_whole_stdout_and_the_rest_goes_to_the_log(monkeypatch, capfd, tmp_path):
    monkeypatch.setattr(demo_cli, "run_demo", _fake_run_demo())
    out_dir = tmp_path / "out"
    assert main(["demo", "--out", str(out_dir), "--json"]) == 0
    out, err = capfd.readouterr()
    res = json.loads(out)
    log_file = out_dir / "demo.log"
    assert res["log"] == str(log_file) and res["samples"] == 3
    assert f"full log in {log_file}" in err
    assert "[demo 1/2] first step ... done in" in err and "[demo 2/2] second step ... done in" in err
    logged = log_file.read_text()
    for text in (*NOISE, "second-step-output", "[demo 1/2] first step"):
        assert text not in out and (text in logged), text
        assert text not in err or text.startswith("[demo"), text


def test_demo_text_prints_the_summary_and_names_the_log(monkeypatch, capfd, tmp_path):
    monkeypatch.setattr(demo_cli, "run_demo", _fake_run_demo())
    out_dir = tmp_path / "out"
    assert main(["demo", "--out", str(out_dir)]) == 0
    out, err = capfd.readouterr()
    assert out.startswith("model:") and f"full log:         {out_dir / 'demo.log'}" in out
    assert not any(text in out + err for text in NOISE)


def test_demo_verbose_shows_everything_on_stderr(monkeypatch, capfd, tmp_path):
    monkeypatch.setattr(demo_cli, "run_demo", _fake_run_demo())
    out_dir = tmp_path / "out"
    assert main(["demo", "--out", str(out_dir), "--json", "--verbose"]) == 0
    out, err = capfd.readouterr()
    assert json.loads(out)["log"] is None
    assert "[demo 1/2] first step ..." in err and "[demo 1/2] first step: done in" in err
    for text in NOISE[:4]:
        assert text in err
    assert not (out_dir / "demo.log").exists()


def test_demo_failure_names_the_log(monkeypatch, capfd, tmp_path):
    monkeypatch.setattr(demo_cli, "run_demo", _fake_run_demo(fail=True))
    out_dir = tmp_path / "out"
    with pytest.raises(ZeroDivisionError):
        main(["demo", "--out", str(out_dir), "--json"])
    out, err = capfd.readouterr()
    assert out == ""
    assert "[demo 2/2] failing step ... FAILED after" in err and f"log: {out_dir / 'demo.log'}" in err
    assert "ZeroDivisionError" in (out_dir / "demo.log").read_text()


def test_demo_refuses_earlier_results_before_writing_a_log(capfd, tmp_path):
    (tmp_path / "hidden_states").mkdir()
    (tmp_path / "hidden_states" / "data_0.pt").write_text("")
    assert main(["demo", "--out", str(tmp_path)]) == 2
    assert "is not empty" in capfd.readouterr().err
    assert not (tmp_path / "demo.log").exists()


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_plain_progress_off_a_terminal_and_rich_on_one():
    assert type(progress_for(2, io.StringIO())) is Progress
    pytest.importorskip("rich")
    term = _Terminal()
    bar = progress_for(2, term)
    assert type(bar) is not Progress
    with bar as p:
        assert p.step("a step", lambda: 7) == 7
    assert "a step: done in" in term.getvalue()
