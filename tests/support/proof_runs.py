"""Running a patch's proof of need (test code; the declaration is ``spec_compat.core.proof.Proof``).

* :func:`proof_cases` -- the ids whose proof is a given test function (its ``pid`` parameter list),
  so every declared proof is a collected test item;
* :class:`ProofRun` -- one proof test's bookkeeping, handed out by the ``prove`` fixture
  (``tests/support/proof_hooks.py``): which ids the stock run disabled, whether the declared symptom was seen
  with them off and was absent with the patch on; checked after the test passed;
* :func:`final_error` / :func:`first_error` -- what a symptom is matched against: the error that
  ended a run, not its whole log (the rules: "the error that ended a run" below).
"""

from __future__ import annotations

import re

from spec_compat.core.proof import SYMPTOM_KINDS, Proof


def proof_cases(test_function: str) -> list[str]:
    """Ids of the registered patches whose proof is ``test_function`` (a test's parameter list)."""
    from spec_compat import REGISTRY
    from spec_compat import patches  # noqa: F401  (registers every patch)

    return sorted(p.id for p in REGISTRY.patches()
                  if p.proof is not None and p.proof.test_function == test_function)


# -- the error that ended a run -------------------------------------------------------------
#
# A stock run's output is matched where the run says what stopped it, not anywhere:
#
# * a crashed process's stdout/stderr (the default): the LAST traceback of that process (the
#   untagged lines; another process's only when it printed none) -- its final exception (the last
#   of a ``raise ... from`` / "During handling" chain) with that exception's frames.
#   Lines are read without the prefixes other processes and loggers put on them: vLLM's process
#   tag ``(EngineCore_DP0 pid=12) `` / ``(Worker_TP0 pid=13) ``, torch.distributed's ``[rank0]: ``,
#   a vLLM log record's header ``ERROR 12-05 10:00:00 [core.py:1006] ``; lines of different
#   processes are told apart by their tag, so interleaved tracebacks stay apart.  Tracebacks
#   printed as "Exception ignored in: ..." (``__del__``, atexit) never ended a run.  When the
#   last exception only relays another process's failure -- vLLM's "Engine core initialization
#   failed. See root cause above", "Worker failed with error '...', please check the stack trace
#   above for the root cause", "WorkerProc initialization failed ... See stack trace for root
#   cause", ``EngineDeadError`` "... See stack trace (above) for the root cause", torchrun's
#   ``ChildFailedError`` -- the error is the last traceback of another process before it.  Rich
#   tracebacks (typer's CLIs print those) are read as plain ones: each frame's title and the
#   line it ran (the lines around it dropped), then the exception.
# * a server's log (``since=``: where it stood when the stock request was sent): the FIRST
#   traceback after that point -- the error the request ran into, before any shutdown noise.
# * a verdict the test extracted (``report=True``): a selftest check's ``FAIL`` line, a T1
#   verdict line, an HTTP status and body, a value check's one-line description -- matched as
#   given (the test passes only that line).
#
# A frame a symptom names is written as the frame's line followed by ``(?:  .*\n)*`` -- the
# indented lines of the frames below it -- then the exception line: it cannot reach past the
# final exception's own traceback.

_ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")
#: the tag(s) of the process that wrote a line: vLLM's ``(NAME pid=N) ``, torch.distributed's ``[rankN]: ``
_PROC = re.compile(r"(?:\([\w.:-]+ pid=\d+\)(?: |$)|\[rank\d+\]: )*")
#: a vLLM log record's header (each line of a multi-line record repeats it)
_LOG = re.compile(r"(?:DEBUG|INFO|WARNING|ERROR|CRITICAL) \d\d-\d\d \d\d:\d\d:\d\d(?:\.\d+)? \[[^\]\n]*\] ")
_HEADER = "Traceback (most recent call last):"
_RICH_HEADER = re.compile(r"╭─+ Traceback \(most recent call last\) ─+╮$")
#: a code line of a rich frame: the marker of the line it ran (❱), its number, the code (indentation as │ guides)
_RICH_CODE = re.compile(r"(❱|\s)\s*\d+(?: (.*))?$")
_SEPARATORS = ("The above exception was the direct cause of the following exception:",
               "During handling of the above exception, another exception occurred:")
#: a line that is no part of an exception's message: a warning, a glog line, an unraisable report
_NOT_MESSAGE = re.compile(r"\S+\.py:\d+: \w*Warning: |[IWEF]\d{4} \d\d:\d\d:\d\d|Exception ignored ")
#: the final exception only relays another process's failure (vLLM, torchrun)
_RELAYS = re.compile(r"root cause above|stack trace (?:\(above\) |above )?for (?:the )?root cause|ChildFailedError")


class _Line:
    __slots__ = ("n", "stream", "head", "text")

    def __init__(self, n: int, stream: str, head: str, text: str) -> None:
        self.n, self.stream, self.head, self.text = n, stream, head, text


class Traceback:
    """One exception as printed: its frames and exception lines, without line prefixes."""

    __slots__ = ("stream", "start", "end", "frames", "exception", "chained", "ignored")

    def __init__(self, stream: str, start: int, end: int, frames: list[str], exception: list[str]) -> None:
        self.stream = stream  # the writing process's tag ("" for untagged output)
        self.start, self.end = start, end  # line numbers in the output (header, last line)
        self.frames = frames
        self.exception = exception
        self.chained = False  # printed as the consequence of the one before it (same chain)
        self.ignored = False  # an "Exception ignored in ..." report: it ended nothing

    @property
    def text(self) -> str:
        return "\n".join([_HEADER, *self.frames, *self.exception]) + "\n"

    def __repr__(self) -> str:
        return f"Traceback({self.stream!r}, lines {self.start}-{self.end}: {self.exception[0]!r})"


def _lines(output: str) -> list[_Line]:
    out = []
    for n, raw in enumerate(_ANSI.sub("", output).split("\n")):
        raw = raw.rstrip("\r")
        proc = _PROC.match(raw)
        rest = raw[proc.end():]
        log = _LOG.match(rest)
        head = log.group(0) if log else ""
        out.append(_Line(n, proc.group(0).strip(), head, rest[len(head):]))
    return out


def _is_header(text: str) -> bool:
    return text.startswith(_HEADER) or bool(_RICH_HEADER.match(text.rstrip()))


def _rich_frames(lines: list[_Line], j: int) -> tuple[list[str], int]:
    """The frames of a rich traceback box from line ``j`` (after its header): each frame's title
    (``path:line in function``) and the line it ran; context lines and locals dropped."""
    frames: list[str] = []
    last = ""  # what the previous box line was: "title", "hot" (the line the frame ran), ""
    full = False  # the previous line filled the box: a word cut at the edge goes on without a space
    while j < len(lines) and lines[j].text.startswith("│"):
        box = lines[j].text.rstrip()
        box = box[1:-1] if box.endswith("│") and len(box) > 1 else box[1:]
        padded = box[1:-1] if box.startswith(" ") and box.endswith(" ") else box.strip(" ")
        inner = padded.rstrip()
        j += 1
        code = _RICH_CODE.match(inner)
        if not inner.strip() or inner[0] in "╭│╰":  # a blank line, a locals panel
            last = ""
        elif code:
            last = "hot" if code.group(1) == "❱" else "context"
            if last == "hot":
                frames.append("    " + (code.group(2) or "").lstrip(" │"))
        elif inner[0].isspace():  # a wrapped code line
            if last == "hot":
                frames[-1] += " " + inner.strip()
        elif last == "title":  # a title wrapped at the box's width
            frames[-1] += ("" if full else " ") + inner
        else:
            frames.append("  " + inner)
            last = "title"
        full = padded == inner
    if j < len(lines) and lines[j].text.startswith("╰"):
        j += 1
    return frames, j


def _parse(lines: list[_Line]) -> list[Traceback]:
    """The tracebacks of one process's lines, in order."""
    found: list[Traceback] = []
    between: list[str] = []  # non-blank lines since the last traceback
    i = 0
    while i < len(lines):
        text = lines[i].text
        if not _is_header(text):
            if text.strip():
                between.append(text.strip())
            i += 1
            continue
        start = lines[i].n
        if text.startswith(_HEADER):
            frames, j = [], i + 1
            while j < len(lines) and lines[j].text[:1] in (" ", "\t") and lines[j].text.strip():
                frames.append(lines[j].text)
                j += 1
        else:
            frames, j = _rich_frames(lines, i + 1)
        if j >= len(lines) or not lines[j].text.strip() or _is_header(lines[j].text) or lines[j].text[:1].isspace():
            between = [text]  # a header without its exception (cut off): not a traceback
            i = j
            continue
        head = lines[j].head
        exception = [lines[j].text]
        j += 1
        while (j < len(lines) and lines[j].head == head and lines[j].text.strip() and not _is_header(lines[j].text)
               and lines[j].text.strip() not in _SEPARATORS and not _NOT_MESSAGE.match(lines[j].text)):
            exception.append(lines[j].text)
            j += 1
        tb = Traceback(lines[i].stream, start, lines[j - 1].n, frames, exception)
        tb.chained = bool(found) and bool(between) and all(b in _SEPARATORS for b in between)
        tb.ignored = ((tb.chained and found[-1].ignored)
                      or (bool(between) and between[-1].startswith("Exception ignored")))
        found.append(tb)
        between = []
        i = j
    return found


def tracebacks(output: str) -> list[Traceback]:
    """Every traceback printed in ``output`` (any process), in the order they ended."""
    streams: dict[str, list[_Line]] = {}
    for line in _lines(output):
        streams.setdefault(line.stream, []).append(line)
    return sorted((tb for lines in streams.values() for tb in _parse(lines)), key=lambda tb: tb.end)


def _errors(output: str) -> list[Traceback]:
    """The errors ``output`` shows, in the order they ended: the final exception of each chain,
    "Exception ignored" reports left out."""
    streams: dict[str, list[Traceback]] = {}
    for tb in tracebacks(output):
        streams.setdefault(tb.stream, []).append(tb)
    finals = [tb for seq in streams.values() for tb, nxt in zip(seq, [*seq[1:], None])
              if not (nxt is not None and nxt.chained) and not tb.ignored]
    return sorted(finals, key=lambda tb: tb.end)


def final_error(output: str) -> str | None:
    """The error that ended the run whose stdout/stderr is ``output``: its last traceback's final
    exception with that exception's frames (a relayed failure traced back to the process it
    happened in, see above), without line prefixes; None when ``output`` holds no traceback."""
    errors = _errors(output)
    if not errors:
        return None
    # the run's own process writes untagged lines; its last error is what ended it (a worker's
    # traceback printed while the run shut down comes later, and ended nothing)
    own = [k for k, e in enumerate(errors) if not e.stream]
    k = own[-1] if own else len(errors) - 1
    while _RELAYS.search("\n".join(errors[k].exception)):
        before = [e for e in errors[:k] if e.end < errors[k].end]
        elsewhere = [e for e in before if e.stream != errors[k].stream]
        if not (elsewhere or before):
            break
        k = errors.index((elsewhere or before)[-1])
    return errors[k].text


def first_error(log: str) -> str | None:
    """The first error ``log`` shows (a server's log from the stock request on): the final
    exception of the first traceback with its frames; None when there is none."""
    errors = _errors(log)
    return errors[0].text if errors else None


def _lines_of(regex: re.Pattern[str], text: str) -> str | None:
    """The whole lines of ``text`` where ``regex`` matches first, or None."""
    m = regex.search(text)
    if m is None:
        return None
    start = text.rfind("\n", 0, m.start()) + 1
    end = m.end() if m.end() > m.start() and text[m.end() - 1] == "\n" else text.find("\n", m.end())
    return text[start:end if end >= 0 else len(text)].rstrip("\n")


def _where(output: str, since: int | None, report: bool) -> str | None:
    """What a symptom is matched against (see the top of this section)."""
    if report:
        if since is not None:
            raise ValueError("a report is matched as given: since= is for a server's log")
        return output
    if since is not None:
        return first_error(output[since:])
    return final_error(output)


def find_symptom(proof: Proof, output: str, *, since: int | None = None, report: bool = False) -> str | None:
    """The lines showing the symptom in the error that ended the run (``output``: a crashed
    process's stdout/stderr; with ``since``: a server's log, the first error after that offset;
    with ``report``: the verdict line(s) the test extracted), or None."""
    if proof.regex is None:
        return None
    where = _where(output, since, report)
    return None if where is None else _lines_of(proof.regex, where)


class ProofRun:
    """One proof test's bookkeeping: which ids it disabled, whether it saw the symptom."""

    def __init__(self, pid: str, proof: Proof) -> None:
        self.pid = pid
        self.proof = proof
        self.disabled: list[str] = []
        self.symptom_seen: str | None = None
        self.absent_checked = False
        self.identical_checked = False

    @property
    def disable(self) -> str:
        """The ``SPEC_COMPAT_DISABLE`` value of the stock run (recorded as used)."""
        value = ",".join(self.proof.disabled_ids(self.pid))
        self.disabled.append(value)
        return value

    @property
    def baseline(self) -> str:
        """The ``SPEC_COMPAT_DISABLE`` value of the patched run: ``also_off`` only (may be empty)."""
        return ",".join(self.proof.also_off)

    def assert_symptom(self, output: str, *, since: int | None = None, report: bool = False) -> str:
        """The stock run ended with the declared symptom (returns the lines showing it).

        ``output``: the stdout/stderr of a run that crashed -- matched against its final error
        (:func:`final_error`); with ``since``, a server's log and the offset it had reached when the
        stock request was sent -- the first error after it (:func:`first_error`); with ``report``,
        the verdict the test extracted (a FAIL / T1-FAIL line, an HTTP status and body, a value
        check's description) -- matched as given."""
        where = _where(output, since, report)
        line = None if where is None or self.proof.regex is None else _lines_of(self.proof.regex, where)
        if where is None:
            seen = ("no traceback in the run's output (a verdict line is passed with report=True)" if since is None
                    else f"no traceback in the log after offset {since}")
        elif report:
            seen = f"its verdict: {where[-4000:]!r}"
        else:
            seen = f"the run ended with:\n{where[-4000:]}"
        assert line is not None, (f"{self.pid}: the run with {self.proof.disabled_ids(self.pid)} disabled does not "
                                  f"show the declared symptom /{self.proof.symptom}/; {seen}"
                                  + ("" if report else f"\n--- output:\n{output[-4000:]}"))
        self.symptom_seen = line
        return line

    def assert_absent(self, output: str, *, report: bool = False) -> None:
        """The patched run does not show the symptom: neither anywhere in ``output`` (as a line or
        spanning lines) nor in any traceback it printed, read without line prefixes (``report``:
        ``output`` is the patched run's verdict, checked as given)."""
        regex = self.proof.regex
        line = None
        if regex is not None:
            line = next((ln for ln in output.splitlines() if regex.search(ln)), None)
            if line is None:
                m = regex.search(output)
                line = m.group(0) if m else None
            if line is None and not report:
                line = next((hit for tb in tracebacks(output) if (hit := _lines_of(regex, tb.text))), None)
        assert line is None, f"{self.pid}: the patched run shows the symptom too: {line}"
        self.absent_checked = True

    def assert_identical(self, identical: bool, what: str) -> None:
        """An optimisation: output with and without the patch is byte-identical."""
        assert identical, f"{self.pid}: {what} differs with the patch disabled"
        self.identical_checked = True

    def problems(self) -> list[str]:
        """What the test did not do that its proof requires (checked after the test passed)."""
        if self.proof.kind == "measured":  # nothing is run disabled: the benchmark JSON is the proof
            return []
        want = ",".join(self.proof.disabled_ids(self.pid))
        out = []
        if not self.disabled:
            out.append(f"never ran with {want} disabled (use prove(pid).disable)")
        elif any(d != want for d in self.disabled):
            out.append(f"disabled {self.disabled}, declared {want!r}")
        if self.proof.kind in SYMPTOM_KINDS:
            if self.symptom_seen is None:
                out.append(f"did not assert the declared symptom /{self.proof.symptom}/")
            if not self.absent_checked:
                out.append("did not check the symptom's absence with the patch on")
        if self.proof.kind == "optimization" and not self.identical_checked:
            out.append("did not compare output with and without the patch")
        return out
