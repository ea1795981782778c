"""``spec-compat fixture NAME OUT_DIR``: write a deterministic tiny checkpoint."""

from __future__ import annotations

import argparse
import sys


def cmd_fixture(args: argparse.Namespace) -> int:
    from ..fixtures import FIXTURES, build

    if args.name not in FIXTURES:
        print(f"spec-compat fixture: unknown fixture {args.name!r}; known: {', '.join(FIXTURES)}", file=sys.stderr)
        return 2
    try:
        out = build(args.name, args.out_dir, seed=args.seed, llama_4_scaling=args.llama_4_scaling, layers=args.layers)
    except ValueError as exc:
        print(f"spec-compat fixture: {exc}", file=sys.stderr)
        return 2
    print(out)
    return 0
