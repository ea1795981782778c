"""``spec-compat demo --model smollm2`` before any engine: a bad size is refused with one line and exit 2
before the model is converted or ShareGPT read; the per-step time estimates scale with the sizes."""

from __future__ import annotations

import pytest

from spec_compat.cli import main
from spec_compat.cli.demo_real import ENGINE_START, RATES, estimate


@pytest.mark.parametrize("argv, word", [(["--conversations", "1"], "--conversations"),
                                        (["--eval-prompts", "0"], "--eval-prompts"),
                                        (["--epochs", "0"], "--epochs")])
def test_a_bad_size_is_refused_before_any_work(tmp_path, capsys, monkeypatch, argv, word):
    from spec_compat.cli import demo_real

    monkeypatch.setattr(demo_real, "REAL_CACHE", tmp_path / "cache")
    rc = main(["demo", "--model", "smollm2", "--out", str(tmp_path / "out"), *argv])
    err = capsys.readouterr().err
    assert rc == 2
    assert word in err and "spec-compat demo:" in err
    assert not (tmp_path / "cache").exists()
    assert not (tmp_path / "out" / "sharegpt_chats.jsonl").exists()


def test_estimates_scale_with_the_sizes():
    small, big = estimate(64, 10, 40), estimate(128, 20, 80)
    assert small["regenerate"] == pytest.approx(ENGINE_START + 64 * RATES["regenerate"])
    assert big["regenerate"] - ENGINE_START == pytest.approx(2 * (small["regenerate"] - ENGINE_START))
    assert big["extract"] - ENGINE_START == pytest.approx(2 * (small["extract"] - ENGINE_START))
    assert big["train"] == pytest.approx(4 * small["train"])
    assert big["evaluate"] - 2 * ENGINE_START == pytest.approx(2 * (small["evaluate"] - 2 * ENGINE_START))
    # the measured point itself: 64 conversations, 10 epochs took 2,572.5 s of training here
    assert small["train"] == pytest.approx(2572.5)
