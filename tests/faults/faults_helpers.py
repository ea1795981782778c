"""Helpers of the fault suite that other suites (and people) can reuse.

``watch_site_packages(commands)`` runs commands and reports every file of the
interpreter's site-packages that was created, modified or removed meanwhile.  As a
command line, for a full engine run (the lead's demo, say)::

    python tests/faults/faults_helpers.py --python ENV/bin/python -- ENV/bin/spec-compat demo --out /tmp/d

prints the changes and exits 1 when there are any.  ``PYTHONDONTWRITEBYTECODE=1`` is set
for the commands (as ``matrix/run`` does): bytecode caches that the interpreter itself
writes next to modules installed without them would otherwise be counted.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

#: what a child process gets from us: the checkout first, no SPEC_COMPAT_* from the caller
SCRUBBED_PREFIXES = ("SPEC_COMPAT_",)


def child_env(extra: Mapping[str, str] | None = None, *, pythonpath: Sequence[str | Path] = ()) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(SCRUBBED_PREFIXES)}
    env.pop("PYTHONSTARTUP", None)
    env["PYTHONPATH"] = os.pathsep.join(str(p) for p in (ROOT, *pythonpath))
    env["PYTHONDONTWRITEBYTECODE"] = "1"
    env.update(extra or {})
    return env


def site_packages(python: str | Path = sys.executable) -> list[Path]:
    """The site-packages directories of ``python`` (purelib and platlib, existing ones)."""
    out = subprocess.run(
        [str(python), "-S", "-c",
         "import json, sysconfig; print(json.dumps(sorted({sysconfig.get_paths()[k] for k in ('purelib', 'platlib')})))"],
        capture_output=True, text=True, check=True, timeout=60,
    )
    return [Path(p) for p in json.loads(out.stdout) if Path(p).is_dir()]


def snapshot(roots: Sequence[Path]) -> dict[str, tuple[int, int]]:
    """path -> (mtime_ns, size) of every file (and symlink) under ``roots``."""
    found: dict[str, tuple[int, int]] = {}
    stack = [str(r) for r in roots]
    while stack:
        d = stack.pop()
        try:
            entries = list(os.scandir(d))
        except OSError:
            continue
        for e in entries:
            try:
                if e.is_dir(follow_symlinks=False):
                    stack.append(e.path)
                else:
                    st = e.stat(follow_symlinks=False)
                    found[e.path] = (st.st_mtime_ns, st.st_size)
            except OSError:
                continue
    return found


@dataclass
class Changes:
    created: list[str] = field(default_factory=list)
    modified: list[str] = field(default_factory=list)
    removed: list[str] = field(default_factory=list)
    files: int = 0

    def __bool__(self) -> bool:
        return bool(self.created or self.modified or self.removed)

    def summary(self, limit: int = 20) -> str:
        parts = []
        for name in ("created", "modified", "removed"):
            paths = getattr(self, name)
            if paths:
                parts.append(f"{name} ({len(paths)}): " + ", ".join(paths[:limit]))
        return "; ".join(parts) or f"no change in {self.files} files"


def compare(before: Mapping[str, tuple[int, int]], after: Mapping[str, tuple[int, int]]) -> Changes:
    return Changes(
        created=sorted(set(after) - set(before)),
        modified=sorted(p for p in set(before) & set(after) if before[p] != after[p]),
        removed=sorted(set(before) - set(after)),
        files=len(before),
    )


@dataclass
class Watched:
    procs: list[subprocess.CompletedProcess]
    changes: Changes
    roots: list[Path]


def watch_site_packages(commands: Sequence[Sequence[str]], *, python: str | Path = sys.executable,
                        env: Mapping[str, str] | None = None, cwd: str | Path | None = None,
                        timeout: float = 600) -> Watched:
    """Run ``commands`` one after the other (output captured) and compare every file under
    ``python``'s site-packages before and after them."""
    roots = site_packages(python)
    before = snapshot(roots)
    procs = [subprocess.run(list(cmd), capture_output=True, text=True, env=dict(env or child_env()),
                            cwd=cwd, timeout=timeout) for cmd in commands]
    return Watched(procs, compare(before, snapshot(roots)), roots)


class Background:
    """``watch_site_packages`` started now, finished later: the snapshot is taken at once,
    the commands run one after the other in a thread; :meth:`finish` waits and compares."""

    def __init__(self, commands: Sequence[Sequence[str]], *, python: str | Path = sys.executable,
                 env: Mapping[str, str] | None = None, cwd: str | Path | None = None, timeout: float = 600) -> None:
        import threading

        self.roots = site_packages(python)
        self.before = snapshot(self.roots)
        self.procs: list[subprocess.CompletedProcess] = []
        self.error: BaseException | None = None
        self._current: subprocess.Popen | None = None
        self._cancelled = False

        def work() -> None:
            try:
                for cmd in commands:
                    if self._cancelled:
                        return
                    self._current = subprocess.Popen(list(cmd), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                                     text=True, env=dict(env or child_env()), cwd=cwd)
                    out, err = self._current.communicate(timeout=timeout)
                    self.procs.append(subprocess.CompletedProcess(cmd, self._current.returncode, out, err))
            except BaseException as exc:  # reported by finish()
                self.error = exc

        self._thread = threading.Thread(target=work, daemon=True)
        self._thread.start()

    def finish(self, timeout: float = 600) -> Watched:
        self._thread.join(timeout)
        if self._thread.is_alive():
            self.cancel()
            raise TimeoutError("the watched commands did not finish")
        if self.error is not None:
            raise self.error
        return Watched(self.procs, compare(self.before, snapshot(self.roots)), self.roots)

    def cancel(self) -> None:
        self._cancelled = True
        proc = self._current
        if proc is not None and proc.poll() is None:
            proc.kill()
            proc.wait()
        self._thread.join(30)


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description="run a command; list files it changed under site-packages")
    p.add_argument("--python", default=sys.executable, help="interpreter whose site-packages are watched")
    p.add_argument("command", nargs=argparse.REMAINDER)
    args = p.parse_args(argv)
    cmd = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not cmd:
        p.error("no command")
    env = {**os.environ, "PYTHONDONTWRITEBYTECODE": "1"}
    roots = site_packages(args.python)
    before = snapshot(roots)
    rc = subprocess.run(cmd, env=env).returncode
    changes = compare(before, snapshot(roots))
    print(f"[watch] {', '.join(map(str, roots))}: {changes.summary()} (command exit {rc})", file=sys.stderr)
    return 1 if changes else rc


if __name__ == "__main__":
    sys.exit(main())
