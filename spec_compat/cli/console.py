"""Where the commands' output goes: stdout for the result, stderr (or a log file) for the rest.

:func:`stdout_to_stderr` keeps stdout for the command's result while vLLM (whose logger writes
to stdout) runs.  :func:`logs_to_file` sends everything the pipeline's libraries and
processes write (fds 1 and 2, inherited by vLLM's engine process) to a log file, and hands
back the real stderr for :class:`Progress`.
"""

from __future__ import annotations

import contextlib
import logging
import os
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import IO, Any

log = logging.getLogger("spec_compat")

LOG_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"


def _flush() -> None:
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()


@contextlib.contextmanager
def stdout_to_stderr() -> Iterator[None]:
    """Send everything written to fd 1 (vLLM logs to stdout) to stderr meanwhile."""
    sys.stdout.flush()
    saved = os.dup(1)
    try:
        os.dup2(2, 1)
        with contextlib.redirect_stdout(sys.stderr):
            yield
    finally:
        sys.stdout.flush()
        os.dup2(saved, 1)
        os.close(saved)


@contextlib.contextmanager
def logs_to_file(path: Path) -> Iterator[IO[str]]:
    """Meanwhile fds 1 and 2 and ``sys.stdout``/``sys.stderr`` write to ``path`` (appended): vLLM's
    logs, speculators' metrics, tqdm bars, the output of vLLM's engine process (which inherits the
    fds); the root logger (so the ``spec_compat`` and ``speculators`` loggers) logs at INFO there.
    Yields a stream on the real stderr."""
    _flush()
    saved_out, saved_err = os.dup(1), os.dup(2)
    terminal = os.fdopen(os.dup(2), "w", buffering=1)
    logfile = open(path, "a", buffering=1)  # noqa: SIM115  (closed below, after the fds are restored)
    root = logging.getLogger()
    level = root.level
    handler = logging.StreamHandler(logfile)
    handler.setFormatter(logging.Formatter(LOG_FORMAT))
    handler.setLevel(logging.INFO)
    try:
        os.dup2(logfile.fileno(), 1)
        os.dup2(logfile.fileno(), 2)
        root.addHandler(handler)  # speculators' basicConfig then finds a handler and adds none
        if root.getEffectiveLevel() > logging.INFO:
            root.setLevel(logging.INFO)
        with contextlib.redirect_stdout(logfile), contextlib.redirect_stderr(logfile):
            yield terminal
    finally:
        _flush()
        root.removeHandler(handler)
        root.setLevel(level)
        os.dup2(saved_out, 1)
        os.dup2(saved_err, 2)
        os.close(saved_out)
        os.close(saved_err)
        logfile.close()
        terminal.close()


class Progress:
    """One line per pipeline step on ``stream``: ``[demo 3/9] NAME ... done in 1.2s``, or a rich
    progress bar when rich is importable and ``stream`` is a terminal.  :meth:`step` times each
    step and logs its start and end (into the log file, where :func:`logs_to_file` is on)."""

    def __init__(self, total: int, stream: IO[str] | None = None, prefix: str = "demo", hint: str = "") -> None:
        self.total = total
        self.n = 0
        self.stream = stream or sys.stderr
        self.prefix = prefix
        #: appended to a failed step's line (where the full log is)
        self.hint = hint
        self.timings: dict[str, float] = {}
        self._bar: Any = None
        self._task: Any = None

    def __enter__(self) -> Progress:
        return self

    def __exit__(self, *exc: object) -> None:
        return None

    def note(self, text: str) -> None:
        """A line between the steps (a skipped step, where the log is)."""
        print(text, file=self.stream, flush=True)

    def step(self, name: str, fn: Callable[[], Any]) -> Any:
        self.n += 1
        head = f"[{self.prefix} {self.n}/{self.total}] {name}"
        self._start(head)
        t = time.perf_counter()
        try:
            out = fn()
        except BaseException:
            self._finish(head, f"FAILED after {time.perf_counter() - t:.1f}s{self.hint}")
            raise
        dt = time.perf_counter() - t
        self.timings[name] = round(dt, 2)
        self._finish(head, f"done in {dt:.1f}s")
        return out

    def _start(self, head: str) -> None:
        log.info("%s ...", head)
        print(f"{head} ...", end="", file=self.stream, flush=True)

    def _finish(self, head: str, outcome: str) -> None:
        log.info("%s: %s", head, outcome)
        print(f" {outcome}", file=self.stream, flush=True)


class RichProgress(Progress):
    """:class:`Progress` as a rich progress bar (one finished line per step above it)."""

    def __init__(self, total: int, stream: IO[str], prefix: str = "demo", hint: str = "") -> None:
        from rich.console import Console
        from rich.progress import BarColumn, MofNCompleteColumn, SpinnerColumn, TextColumn, TimeElapsedColumn
        from rich.progress import Progress as Bar

        super().__init__(total, stream, prefix, hint)
        self._bar = Bar(SpinnerColumn(), TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                        TimeElapsedColumn(), console=Console(file=stream))

    def __enter__(self) -> Progress:
        self._bar.start()
        self._task = self._bar.add_task(self.prefix, total=self.total)
        return self

    def __exit__(self, *exc: object) -> None:
        self._bar.stop()

    def note(self, text: str) -> None:
        self._bar.console.print(text, markup=False, highlight=False)

    def _start(self, head: str) -> None:
        log.info("%s ...", head)
        self._bar.update(self._task, description=head)

    def _finish(self, head: str, outcome: str) -> None:
        log.info("%s: %s", head, outcome)
        self._bar.console.print(f"{head}: {outcome}", markup=False, highlight=False)
        self._bar.advance(self._task)


class VerboseProgress(Progress):
    """``--verbose``: a line when a step starts and one when it ends, the step's own output between."""

    def _start(self, head: str) -> None:
        print(f"{head} ...", file=self.stream, flush=True)

    def _finish(self, head: str, outcome: str) -> None:
        print(f"{head}: {outcome}", file=self.stream, flush=True)


def progress_for(total: int, stream: IO[str], prefix: str = "demo", hint: str = "") -> Progress:
    """A rich progress bar when rich is importable and ``stream`` is a terminal, else plain lines."""
    if stream.isatty():
        try:
            return RichProgress(total, stream, prefix, hint)
        except ImportError:
            pass
    return Progress(total, stream, prefix, hint)
