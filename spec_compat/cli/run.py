"""``spec-compat run SCRIPT [ARGS...]``: an unmodified script as ``__main__`` with the registry applied."""

from __future__ import annotations

import argparse
import os
import runpy
import sys

from .. import apply

#: the commands this module defines (spec_compat.cli discovers them): name -> one-line help
COMMANDS = {
    'run': 'run a script with the registry applied (like ddtrace-run)',
}

#: the script ``spec-compat run`` is running (its real path), None before and outside it: the
#: patches that act only on a stock script run this way (``launch-vllm-trust-remote-code``) read it
SCRIPT: str | None = None


def add_arguments(command: str, p: argparse.ArgumentParser) -> None:
    p.add_argument("script", help="path of the Python script, run as __main__")
    p.add_argument("args", nargs=argparse.REMAINDER, help="arguments passed to the script")
    p.set_defaults(func=cmd_run)


def cmd_run(args: argparse.Namespace) -> int:
    apply()
    script = args.script
    if not os.path.exists(script):
        print(f"spec-compat run: no such script: {script}", file=sys.stderr)
        return 2
    global SCRIPT
    SCRIPT = os.path.realpath(script)
    sys.argv = [script, *args.args]
    sys.path.insert(0, os.path.dirname(os.path.abspath(script)))
    runpy.run_path(script, run_name="__main__")
    return 0
