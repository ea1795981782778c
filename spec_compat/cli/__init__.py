"""Command line: ``spec-compat`` / ``python -m spec_compat``.  One module per command; each defines
its own arguments (``add_arguments``) and is imported only when its command runs (or for ``--help``
of that command), so ``spec-compat report`` never imports the demo's or the evaluator's code.

  report [--json] [--strict]       installed versions and every patch's status      (report.py)
  patches [--markdown]             the registered patches and their version ranges  (report.py)
  run SCRIPT [ARGS...]             run an unmodified script with the registry applied  (run.py)
  selftest [--model DIR|llama]     stock extraction vs a transformers reference    (selftest.py)
           [--trust-remote-code]
  fixture NAME OUT_DIR [--seed N]  write a deterministic tiny checkpoint, or a published-format
                                   EAGLE-3 head                                      (fixture.py)
  demo [--model llama|kimi-k25] [--json] [--verbose]
                                   the whole pipeline on a tiny fixture, ending with evaluate
                                   (demo.py; its steps in demo_steps.py)
  evaluate --target DIR --draft DIR [--draft DIR ...] [--plot PNG] [--json] [--trust-remote-code]
                                   serve the drafts: lossless check and acceptance per position,
                                   one table for several drafts (compare_drafts.py; one draft's run: evaluate.py)

``--json`` writes exactly one JSON document on stdout; logs go to stderr (console.py).  What every
command checks about a checkpoint directory it is given (and the ``--trust-remote-code`` consent
before any of the checkpoint's own Python runs): checkpoints.py; the vLLM engine runs the commands
share: engine_runs.py.
"""

from __future__ import annotations

import argparse
import ast
import functools
import importlib
import sys
from collections.abc import Sequence
from pathlib import Path

from .. import SwitchError, __version__

def _declared(path: Path) -> dict[str, str]:
    """The ``COMMANDS = {name: help line}`` literal at the top level of a command module, read without
    importing it (``{}`` where it declares none).  Only that block is parsed (parsing every command
    module whole took ~45 ms here, this under 1 ms for all of them)."""
    text = path.read_text(encoding="utf-8")
    start = text.find("\nCOMMANDS = {")
    if start < 0:
        return {}
    end = text.find("\n}\n", start)
    return dict(ast.literal_eval(text[start + len("\nCOMMANDS = "):end + 2]))


@functools.lru_cache(maxsize=1)
def commands() -> dict[str, tuple[str, str]]:
    """command -> (module of spec_compat.cli that defines its arguments and runs it, one-line help),
    discovered from the modules' own ``COMMANDS`` declarations: a new command is a new module, and
    no run of another command imports (or depends on) it."""
    found: dict[str, tuple[str, str]] = {}
    for path in sorted(Path(__file__).parent.glob("*.py")):
        for name, help_line in _declared(path).items():
            if name in found:
                raise RuntimeError(f"command {name!r} is declared by both {found[name][0]}.py and {path.name}")
            found[name] = (path.stem, help_line)
    return dict(sorted(found.items()))


def _switches_help() -> str:
    """Every environment switch (``spec_compat.core.switches``: the one place they are parsed)."""
    from ..core import switches

    parts = ["SPEC_COMPAT_DISABLE=id,id|*", "SPEC_COMPAT_STRICT=1", "SPEC_COMPAT_LOG=DEBUG"]
    parts += [f"{var} ({s.doc})" for var, s in switches.SWITCHES.items()]
    return "Switches (docs/switches.md): " + ";  ".join(parts)


def command_of(argv: Sequence[str]) -> str | None:
    """The command ``argv`` names: its first word that is not an option (the top-level parser has
    options without values only), or None."""
    return next((a for a in argv if not a.startswith("-")), None)


def parser(only: str | None = None) -> argparse.ArgumentParser:
    """The ``spec-compat`` parser.  ``only=None``: every command's arguments (imports every command
    module); ``only=NAME``: that command's arguments alone (the others parse as their help line)."""
    p = argparse.ArgumentParser(
        prog="spec-compat",
        description="Run stock speculators on newer vLLM through a version-keyed registry of run-time patches.",
        epilog=_switches_help(),
    )
    p.add_argument("--version", action="version", version=f"spec-compat {__version__}")
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name, (module, help_line) in commands().items():
        sp = sub.add_parser(name, help=help_line, description=help_line)
        if only is None or only == name:
            importlib.import_module(f"{__name__}.{module}").add_arguments(name, sp)
    return p


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = parser(only=command_of(argv) or "").parse_args(argv)
    try:
        return int(args.func(args) or 0)
    except SwitchError as exc:
        print(f"spec-compat: {exc}", file=sys.stderr)
        return 2
