"""docs/failures.md is the catalog every failure code resolves to.

* every code in a registered patch's ``fixes`` has an entry (``<a id>`` anchor + ``### CODE — title``);
* an entry's ``Patches:`` line names exactly the registered patches that declare its code;
* the patches that declare no code are the rows of the "Patches that answer no code" table
  (``tools/regenerate`` writes the Patches lines and that table; ``test_add_a_patch`` checks both);
* every code-looking token (F/O/K/G/T/S/P + number, ``P-single``) and every ``BRIEF §N`` in the
  package, the tests, the benchmarks and the Markdown docs has an entry.

Nothing here imports vllm, torch, transformers or speculators.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from spec_compat import REGISTRY
from spec_compat import patches  # noqa: F401  (registers every patch)

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "failures.md"

#: a failure code: a family letter and a number, or P-single.  Not a flake8 code (F401), not a
#: model name (Kimi-K2.5, Kimi-K2/K2.5): no word character or "." before it, no "<letter>-"
#: before it, no word character or ".<digit>" after it.
CODE_TOKEN = re.compile(r"(?<![\w.])(?<![A-Za-z]-)(?:[FOKGTSP]\d{1,2}|P-single)(?!\w)(?!\.\d)")
BRIEF_SECTION = re.compile(r"BRIEF\s*§\s*(\d+)")
ENTRY = re.compile(r'^<a id="(?P<anchor>[^"]+)"></a>\n### (?P<code>\S+) — (?P<title>.+)$', re.M)
PATCHES_LINE = re.compile(r"^- \*\*Patches:\*\* (?P<ids>.+)$", re.M)
NO_CODE_SECTION = '<a id="no-code"></a>'


def anchor_of(code: str) -> str:
    return "issue-" + code[1:] if code.startswith("#") else code.lower()


def registered() -> dict[str, tuple[str, ...]]:
    return {p.id: tuple(p.fixes) for p in REGISTRY.patches()}


def entries(text: str) -> dict[str, dict[str, object]]:
    """code -> {anchor, title, body, patches (set of ids, or None without a Patches line)}."""
    matches = list(ENTRY.finditer(text))
    out: dict[str, dict[str, object]] = {}
    for i, m in enumerate(matches):
        end = matches[i + 1].start() if i + 1 < len(matches) else len(text)
        body = text[m.end():end]
        body = re.split(r"^## |^<a id=", body, maxsplit=1, flags=re.M)[0]
        line = PATCHES_LINE.search(body)
        ids = None
        if line is not None:
            ids = set() if line["ids"].startswith("none") else set(re.findall(r"`([^`]+)`", line["ids"]))
        assert m["code"] not in out, f"docs/failures.md: two entries for {m['code']}"
        out[m["code"]] = {"anchor": m["anchor"], "title": m["title"], "body": body, "patches": ids}
    return out


def no_code_rows(text: str) -> set[str]:
    start = text.index(NO_CODE_SECTION)
    section = re.split(r"^## |^<a id=", text[start + len(NO_CODE_SECTION):].split("\n## ", 1)[1], maxsplit=1,
                       flags=re.M)[0]
    return set(re.findall(r"^\| `([^`]+)` \|", section, re.M))


# -- checks, each returning its problems (so the self-tests can show they fail) ----------------

def missing_fix_codes(text: str, reg: dict[str, tuple[str, ...]]) -> list[str]:
    have = entries(text)
    return sorted({f"{code} (fixes of {pid})" for pid, fixes in reg.items() for code in fixes if code not in have})


def patch_list_problems(text: str, reg: dict[str, tuple[str, ...]]) -> list[str]:
    problems = []
    for code, entry in entries(text).items():
        if entry["anchor"] != anchor_of(code):
            problems.append(f"{code}: anchor {entry['anchor']!r}, expected {anchor_of(code)!r}")
        listed = entry["patches"]
        if listed is None:
            problems.append(f"{code}: no '- **Patches:**' line")
            continue
        unknown = sorted(listed - set(reg))
        if unknown:
            problems.append(f"{code}: lists unregistered patches {unknown}")
        declaring = {pid for pid, fixes in reg.items() if code in fixes}
        if listed & set(reg) != declaring:
            problems.append(f"{code}: lists {sorted(listed)}, the registry has {sorted(declaring)}")
    return problems


def no_code_problems(text: str, reg: dict[str, tuple[str, ...]]) -> list[str]:
    rows = no_code_rows(text)
    without = {pid for pid, fixes in reg.items() if not fixes}
    return ([f"{pid}: declares no code but is not in the 'no code' table" for pid in sorted(without - rows)]
            + [f"{pid}: in the 'no code' table but not a registered patch without fixes"
               for pid in sorted(rows - without)])


def source_files() -> list[Path]:
    files: set[Path] = set()
    for pattern in ("spec_compat/**/*.py", "tests/**/*.py", "tests/**/*.md", "benchmarks/**/*.py",
                    "benchmarks/**/*.sh", "benchmarks/*.md", "examples/**/*.py", "matrix/*.md",
                    "docs/*.md", "*.md"):
        files.update(p for p in ROOT.glob(pattern) if p.is_file() and "__pycache__" not in p.parts)
    files.discard(Path(__file__).resolve())  # its self-tests name codes that must not resolve
    return sorted(files)


def unresolved_tokens(text: str, files: dict[str, str]) -> list[str]:
    have = entries(text)
    brief = text[text.index('<a id="brief"></a>'):]
    out = set()
    for name, content in files.items():
        for m in CODE_TOKEN.finditer(content):
            if m.group() not in have:
                line = content.count("\n", 0, m.start()) + 1
                out.add(f"{m.group()} ({name}:{line})")
        for m in BRIEF_SECTION.finditer(content):
            if f"§{m[1]} " not in brief:
                out.add(f"BRIEF §{m[1]} ({name}) not described in the 'brief' section")
    return sorted(out)


# -- tests --------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def doc() -> str:
    return DOC.read_text(encoding="utf-8")


def test_registry_is_loaded():
    reg = registered()
    assert len(reg) > 40 and any(reg.values()), "spec_compat.patches did not register the patches"


def test_every_fixes_code_has_an_entry(doc):
    assert missing_fix_codes(doc, registered()) == []


def test_entries_list_exactly_the_patches_that_declare_their_code(doc):
    assert patch_list_problems(doc, registered()) == []


def test_patches_without_a_code_have_their_own_table(doc):
    assert no_code_problems(doc, registered()) == []


def test_every_entry_says_where_and_what(doc):
    problems = []
    for code, entry in entries(doc).items():
        body = str(entry["body"])
        needed = ("- **Goal:**",) if re.fullmatch(r"P[1-9]", code) else ("- **Where:**", "- **Symptom:**")
        problems += [f"{code}: no {field!r}" for field in needed if field not in body]
        if "- **Symptom:**" in body and not re.search(r"loud|silent|slow", body.split("- **Symptom:**", 1)[1]):
            problems.append(f"{code}: symptom says neither loud, silent nor slow")
    assert problems == []


def test_every_code_token_in_the_tree_resolves(doc):
    files = {str(p.relative_to(ROOT)): p.read_text(encoding="utf-8", errors="replace") for p in source_files()}
    assert "spec_compat/core/registry.py" in files and "README.md" in files and "docs/failures.md" in files
    assert unresolved_tokens(doc, files) == []


# -- the checks can fail ------------------------------------------------------------------------

def _without_entry(text: str, code: str) -> str:
    start = text.index(f'<a id="{anchor_of(code)}"></a>')
    nxt = re.compile(r"^(?:<a id=|## )", re.M).search(text, start + 1)
    return text[:start] + (text[nxt.start():] if nxt else "")


def test_checks_fail_on_a_broken_doc(doc):
    reg = registered()
    no_f10 = _without_entry(doc, "F10")
    assert "F10 (fixes of rows-by-request-id)" in missing_fix_codes(no_f10, reg)
    assert any(t.startswith("F10 (") for t in unresolved_tokens(no_f10, {"x.py": "see F10"}))
    assert unresolved_tokens(doc, {"x.py": "F99, BRIEF §9"}) == [
        "BRIEF §9 (x.py) not described in the 'brief' section", "F99 (x.py:1)"]
    assert unresolved_tokens(doc, {"x.py": "noqa: F401, Kimi-K2.5, Kimi-K2/K2.5"}) == []

    dropped = doc.replace("- **Patches:** `capture-per-request`, `rows-by-request-id`",
                          "- **Patches:** `rows-by-request-id`")
    assert dropped != doc
    assert any(p.startswith("F10: lists") for p in patch_list_problems(dropped, reg))
    foreign = doc.replace("- **Patches:** `scheduler-config-init-vars`",
                          "- **Patches:** `scheduler-config-init-vars`, `no-such-patch`")
    assert foreign != doc
    assert "F1: lists unregistered patches ['no-such-patch']" in patch_list_problems(foreign, reg)

    no_row = re.sub(r"^\| `cpu-rejection-sampler` \|.*\n", "", doc, flags=re.M)
    assert no_row != doc
    assert no_code_problems(no_row, reg) == [
        "cpu-rejection-sampler: declares no code but is not in the 'no code' table"]
