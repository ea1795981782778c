"""Every published head format on both fixtures, compared in one ``spec-compat evaluate --draft A --draft B ...`` run per target:
TorchSpec's MLA head, its Llama-style head (full and pruned vocabulary), the Llama-style head after
stock ``speculators convert``, and the heads SpecForge's and ModelOpt's exporters write (Llama-style
and MLA), on the Kimi-K2.5 fixture (the heads' own size) and on the Llama fixture (the same width and
vocabulary).  Each lossless and its counters consistent; the table (acceptance
length at k = 3, greedy, per position) is printed.  ``matrix/run`` records it; CI serves two of the
heads on Kimi-K2.5 in test_published_heads.py."""

from __future__ import annotations

import json

import pytest

from test_published_heads import (EXPORTED, LLAMA_HEAD, MLA, PRUNED, _compare, _convert, _has_convert,  # noqa: F401
                                  _serving_here, _variant, head_dir)
from test_serving import assert_consistent

pytestmark = pytest.mark.engine


def _with_ids(src, dst):
    """The head with SGLang-convention ids for the 4-layer fixtures (outputs of 0, 1, 2)."""
    return _variant(src, dst, lambda c: c.update(eagle_config={"eagle_aux_hidden_state_layer_ids": [0, 1, 2]}))


@pytest.mark.parametrize("target", ["kimi-k25", "llama"])
def test_every_head_format_serves_losslessly(fixture_dir, head_dir, tmp_path, target):  # noqa: F811
    """On the Llama fixture vLLM's own default aux layers for 4 layers, (2, 2, 1), repeat a layer: a
    head naming no ids is refused there (naming the fix), and the Llama-style heads are served with
    ids written into their config (as a user would)."""
    tdir = fixture_dir(target)
    if target == "llama":
        proc, _ = _compare(tdir, head_dir(LLAMA_HEAD), extra=("--limit", "1", "--max-tokens", "4"))
        assert proc.returncode == 2, proc.stderr[-3000:]
        assert "vLLM's default for a 4-layer target, (2, 2, 1), repeats a layer" in proc.stderr.splitlines()[-1]
        drafts = [head_dir(MLA), _with_ids(head_dir(LLAMA_HEAD), tmp_path / "llama-head-ids"),
                  _with_ids(head_dir(PRUNED), tmp_path / "pruned-head-ids")]
    else:
        drafts = [head_dir(MLA), head_dir(LLAMA_HEAD), head_dir(PRUNED)]
    drafts += [head_dir(name) for name in EXPORTED]  # their ids are in eagle_config: served on both targets
    if _has_convert() and target == "kimi-k25":
        converted = tmp_path / "converted"
        proc = _convert(head_dir(LLAMA_HEAD), tdir, converted)
        assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
        drafts.append(converted)
    proc, res = _compare(tdir, *drafts, extra=("--limit", "4", "--max-tokens", "24"))
    assert proc.returncode == 0, proc.stderr[-4000:]
    rows = res["drafts"]
    assert [r["draft"] for r in rows] == [str(d) for d in drafts]
    for r in rows:
        print(json.dumps({"target": target, "draft": r["draft"].rsplit("/", 1)[-1], "lossless": r["lossless"],
                          "mean_acceptance_length": round(r["mean_acceptance_length"], 3),
                          "per_position": [round(x, 3) for x in r["per_position"]], "drafts": r["drafts"]}))
        assert r["lossless"], r
        assert_consistent(r)
