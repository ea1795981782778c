"""``spec-compat fixture NAME OUT_DIR``: write a deterministic tiny checkpoint
(``--quantize int4``: the kimi-k25 fixture with W4A16 experts, fixtures/kimi_k25_int4.py)."""

from __future__ import annotations

import argparse
import sys


def cmd_fixture(args: argparse.Namespace) -> int:
    from ..fixtures import FIXTURES, build

    if args.name not in FIXTURES:
        print(f"spec-compat fixture: unknown fixture {args.name!r}; known: {', '.join(FIXTURES)}", file=sys.stderr)
        return 2
    quantize = getattr(args, "quantize", None)
    group_size = getattr(args, "group_size", None)
    try:
        if quantize is None and group_size is not None:
            raise ValueError("--group-size needs --quantize int4")
        if quantize is not None:
            if args.name != "kimi-k25" or args.layers is not None:
                raise ValueError("--quantize applies to the kimi-k25 fixture only")
            from ..fixtures.kimi_k25_int4 import build_kimi_k25_int4

            out = build_kimi_k25_int4(args.out_dir, seed=args.seed, group_size=group_size or 32,
                                      llama_4_scaling=args.llama_4_scaling)
        else:
            out = build(args.name, args.out_dir, seed=args.seed, llama_4_scaling=args.llama_4_scaling,
                        layers=args.layers)
    except ValueError as exc:
        print(f"spec-compat fixture: {exc}", file=sys.stderr)
        return 2
    print(out)
    return 0
