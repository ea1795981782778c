"""``spec-compat doctor --target T --draft D [--data DIR] [--json]``: one line per check of
:mod:`spec_compat.doctor` (``ok`` / ``problem`` / ``skipped (why)``, with the seconds it took); every
problem with its cause, its fix and the evidence.  Exit status: 0 no problem, 1 a problem found,
2 a bad argument (a path that is not a checkpoint directory)."""

from __future__ import annotations

import argparse
import json
import logging
import sys
from pathlib import Path

from .checkpoints import TRUST_FLAG, TRUST_HELP, CheckpointError, checked_target, eagle3_draft, model_dir

#: the commands this module defines (spec_compat.cli discovers them): name -> one-line help
COMMANDS = {
    "doctor": "why does a draft accept few tokens? checks the draft against the target and a sample of its training "
              "data (layers, rows, tokens and loss mask, vocabulary) and names each defect with its fix",
}

log = logging.getLogger("spec_compat.doctor")


def add_arguments(command: str, p: argparse.ArgumentParser) -> None:
    p.add_argument("--target", required=True, help="the target (verifier) checkpoint directory the draft serves")
    p.add_argument("--draft", required=True, help="the EAGLE-3 draft's directory (speculators' format)")
    p.add_argument("--data", help="the draft's training data: a speculators >= 0.5 data directory (dataset + "
                                  "hidden_states/) or 0.3/0.4 data_*.pt files; read as a sample, never written")
    p.add_argument("--samples", type=int, default=6, help="training samples read (default 6, from the first)")
    p.add_argument("--prompts", help="held-out prompts (evaluate's --prompts format): the measured check serves the "
                                     "draft in vLLM on them (minutes on CPU); without it that check is skipped")
    p.add_argument("--k", type=int, default=3, help="draft tokens per step for the measured check (default 3)")
    p.add_argument("--max-tokens", type=int, default=64, help="tokens generated per prompt (default 64)")
    p.add_argument("--baseline", type=float, help="the mean acceptance length a clean draft of the same size reaches "
                                                  "on these prompts (the measured check compares with it)")
    p.add_argument("--check", action="append", metavar="NAME",
                   help="run only this check (repeat): fit, rows, tokens, vocabulary, targets, measured")
    p.add_argument("--json", action="store_true", help="one JSON document on stdout")
    p.add_argument(TRUST_FLAG, action="store_true", help=TRUST_HELP)
    p.set_defaults(func=cmd_doctor)


def cmd_doctor(args: argparse.Namespace) -> int:
    from ..doctor import CHECKS, Inputs, as_json, line, run_checks

    try:
        target, _ = checked_target(args.target, "target", args.trust_remote_code)
        draft = model_dir(args.draft, "draft")
        eagle3_draft(draft)
    except CheckpointError as exc:
        print(f"spec-compat doctor: {exc}", file=sys.stderr)
        return 2
    unknown = [c for c in args.check or [] if c not in CHECKS]
    if unknown or args.samples < 1:
        print(f"spec-compat doctor: unknown check {unknown} (known: {', '.join(CHECKS)})" if unknown else
              f"spec-compat doctor: --samples must be at least 1, not {args.samples}", file=sys.stderr)
        return 2
    inp = Inputs(target, draft, Path(args.data) if args.data else None, args.samples, args.prompts, args.k,
                 args.max_tokens, args.baseline)
    findings = run_checks(inp, args.check, None if args.json else lambda f: print(line(f), flush=True))
    problems = sum(1 for f in findings if f.status == "problem")
    if args.json:
        print(json.dumps(as_json(findings), default=str))
    else:
        print(f"{problems} problem(s) in {len(findings)} checks")
    return 1 if problems else 0
