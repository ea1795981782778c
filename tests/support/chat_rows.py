"""Chat rows checked against the chat template itself (speculators 0.3 - 0.7's offset-masked rows).

A prepared row must be the template's token ids of one conversation, and its masked tokens must
decode to exactly that conversation's assistant contents (every assistant turn, nothing else).  The
tokenizer runs in a child process of the environment under test (this process imports no
transformers)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

DEMO_CHATS = Path(__file__).resolve().parents[2] / "spec_compat" / "data" / "demo_chat.jsonl"

_TEMPLATE = r"""
import json, sys
from transformers import AutoTokenizer
tok = AutoTokenizer.from_pretrained(sys.argv[1], trust_remote_code=True)
rows = json.loads(open(sys.argv[2]).read())
convs = [json.loads(line)["conversations"] for line in open(sys.argv[3])]
runs = []
for ids, mask in zip(rows["input_ids"], rows["loss_mask"]):
    spans, cur = [], []
    for t, m in zip(ids, mask):
        if m:
            cur.append(t)
        elif cur:
            spans.append(tok.decode(cur)); cur = []
    if cur:
        spans.append(tok.decode(cur))
    runs.append(spans)
print(json.dumps({"template": [list(map(int, tok.apply_chat_template(c, tokenize=True))) for c in convs],
                  "assistant": [[t["content"] for t in c if t["role"] == "assistant"] for c in convs],
                  "masked": runs, "is_fast": bool(getattr(tok, "is_fast", False))}))
"""


def template_view(model: Path, rows: dict[str, Any], chats: Path, work: Path) -> dict[str, Any]:
    """The tokenizer's view: ``template`` ids and ``assistant`` contents per conversation of
    ``chats``, the decoded ``masked`` runs of each row, ``is_fast``."""
    work.mkdir(parents=True, exist_ok=True)
    (work / "rows.json").write_text(json.dumps(rows))
    proc = subprocess.run([sys.executable, "-c", _TEMPLATE, str(model), str(work / "rows.json"), str(chats)],
                          capture_output=True, text=True, timeout=300,
                          env=dict(os.environ, HF_HUB_OFFLINE="1", HF_MODULES_CACHE=str(work / "modules")))
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.splitlines()[-1])


def assert_rows_follow_the_template(model: Path, rows: dict[str, Any], chats: Path, work: Path) -> None:
    """``rows`` (``input_ids``, ``loss_mask`` lists) are the conversations of ``chats``, one row
    each (in any order), masked exactly on their assistant contents; the tokenizer is a Python one."""
    expect = template_view(model, rows, chats, work)
    assert expect["is_fast"] is False  # the case under test: a Python tokenizer
    n = len(expect["template"])
    assert len(rows["input_ids"]) == n == len(rows["loss_mask"]), (len(rows["input_ids"]), n)
    # preprocessing shuffles: match each row to a conversation whose template it is; every
    # conversation once (the demo repeats a few chats word for word: equal ids, equal contents)
    by_ids: dict[tuple[int, ...], int] = {}
    for i, ids in enumerate(expect["template"]):
        by_ids.setdefault(tuple(ids), i)
    for ids, mask, masked in zip(rows["input_ids"], rows["loss_mask"], expect["masked"]):
        assert len(mask) == len(ids) and set(mask) <= {0, 1}, (len(mask), len(ids))
        conv = by_ids.get(tuple(ids))
        assert conv is not None, f"a row is no conversation's template ids: {ids[:20]}..."
        assert masked == expect["assistant"][conv], (masked, expect["assistant"][conv])
    assert sorted(map(tuple, rows["input_ids"])) == sorted(map(tuple, expect["template"]))
