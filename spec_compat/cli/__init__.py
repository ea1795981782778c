"""Command line: ``spec-compat`` / ``python -m spec_compat``.  One module per command.

  report [--json] [--strict]       installed versions and every patch's status      (report.py)
  patches [--markdown]             the registered patches and their version ranges  (report.py)
  run SCRIPT [ARGS...]             run an unmodified script with the registry applied  (run.py)
  selftest [--model DIR|llama]     stock extraction vs a transformers reference    (selftest.py)
  fixture NAME OUT_DIR [--seed N]  write a deterministic tiny checkpoint            (fixture.py)
  demo [--model llama|kimi-k25] [--json] [--verbose]
                                   the whole pipeline on a tiny fixture, ending with evaluate
                                   (demo.py; its steps in demo_steps.py)
  evaluate --target DIR --draft DIR [--prompts FILE] [--k N] [--json]
                                   serve the draft: lossless check and acceptance counters
                                   (evaluate.py)

``--json`` writes exactly one JSON document on stdout; logs go to stderr (console.py).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from .. import SwitchError, __version__
from .demo import cmd_demo
from .evaluate import cmd_evaluate
from .fixture import cmd_fixture
from .report import cmd_patches, cmd_report, report_data
from .run import cmd_run
from .selftest import cmd_selftest


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="spec-compat",
        description="Run stock speculators on newer vLLM through a version-keyed registry of run-time patches.",
        epilog="Switches: SPEC_COMPAT_DISABLE=id,id|*  SPEC_COMPAT_STRICT=1  SPEC_COMPAT_LOG=DEBUG  "
               "SPEC_COMPAT_DRIVER_WAIT=spin|sleep  SPEC_COMPAT_DRIVER_THREADS=1|N|keep  "
               "SPEC_COMPAT_SHM_POOL_MB=0|N  SPEC_COMPAT_NONFINITE=raise|warn",
    )
    p.add_argument("--version", action="version", version=f"spec-compat {__version__}")
    sub = p.add_subparsers(dest="command", required=True)

    r = sub.add_parser("report", help="installed versions and the status of every patch")
    r.add_argument("--json", action="store_true", help="machine-readable output")
    r.add_argument("--strict", action="store_true", help="exit 1 if any patch is target-changed or failed")
    r.set_defaults(func=cmd_report)

    pt = sub.add_parser("patches", help="list the registered patches (nothing is imported or applied)")
    pt.add_argument("--markdown", action="store_true", help="print the README table")
    pt.set_defaults(func=cmd_patches)

    u = sub.add_parser("run", help="run a script with the registry applied (like ddtrace-run)")
    u.add_argument("script", help="path of the Python script, run as __main__")
    u.add_argument("args", nargs=argparse.REMAINDER, help="arguments passed to the script")
    u.set_defaults(func=cmd_run)

    s = sub.add_parser("selftest", help="stock extraction in this environment vs a transformers reference")
    s.add_argument("--model", default=None,
                   help="checkpoint directory, or a fixture name (default: build the llama fixture)")
    s.add_argument("--checks", default="", help="comma list of workloads to run (default: all)")
    s.add_argument("--seed", type=int, default=0)
    s.add_argument("--tensor-parallel-size", "--tp", type=int, default=1,
                   help="tensor parallel size of the engine (on vLLM's CPU platform also set "
                        "VLLM_CPU_OMP_THREADS_BIND, e.g. '0|1' for 2 ranks on one NUMA node)")
    s.set_defaults(func=cmd_selftest)

    d = sub.add_parser("demo", help="the stock pipeline on a tiny fixture: regenerate chats with the target, "
                                     "preprocess, extract (vLLM), vocab mapping, train an EAGLE-3 draft, reload "
                                     "it, serve it (evaluate), report")
    d.add_argument("--model", default="llama", choices=["llama", "kimi-k25"], help="fixture to use (default llama)")
    d.add_argument("--out", default=None, help="output directory, must not hold earlier results "
                                               "(default ./spec-compat-demo/MODEL)")
    d.add_argument("--epochs", type=int, default=24, help="training epochs (default 24)")
    d.add_argument("--lr", type=float, default=3e-3, help="learning rate (default 3e-3)")
    d.add_argument("--regenerate", action=argparse.BooleanOptionalAction, default=True,
                   help="rewrite the chats' assistant turns with the target (vLLM, greedy) before extraction, "
                        "so the draft learns the target's own distribution (default: on)")
    d.add_argument("--evaluate", action=argparse.BooleanOptionalAction, default=True,
                   help="serve the trained draft as EAGLE-3 speculator and print the evaluate table (default: on)")
    d.add_argument("--k", type=int, default=3, help="speculative tokens when evaluating (default 3)")
    d.add_argument("--json", action="store_true", help="print the result as one JSON document on stdout "
                                                      "(everything else goes to stderr or the log file)")
    d.add_argument("--verbose", action="store_true", help="show the output of every step as it comes "
                                                         "(default: one line per step; the rest in OUT/demo.log)")
    d.set_defaults(func=cmd_demo)

    e = sub.add_parser("evaluate", help="serve an EAGLE-3 draft in vLLM: greedy outputs with and without it "
                                         "must be identical; prints drafts, accepted tokens, acceptance rate, "
                                         "mean acceptance length, per-position acceptance",
                       epilog="Exit status: 0 lossless, 1 outputs differ, 2 bad input.")
    e.add_argument("--target", required=True, help="target (verifier) checkpoint directory")
    e.add_argument("--draft", required=True, help="EAGLE-3 draft directory (speculators format)")
    e.add_argument("--prompts", default=None, help="prompts file: .jsonl with prompt_token_ids, prompt or "
                                                   "messages/conversations per line, or one raw prompt per line "
                                                   "(default: spec-compat's 16 held-out chat prompts)")
    e.add_argument("--k", type=int, default=3, help="speculative tokens per draft (default 3)")
    e.add_argument("--max-tokens", type=int, default=64, help="new tokens per prompt (default 64)")
    e.add_argument("--max-model-len", type=int, default=2048, help="engine max_model_len (default 2048)")
    e.add_argument("--limit", type=int, default=None, help="use only the first N prompts")
    e.add_argument("--compile", action="store_true", help="let vLLM compile / capture graphs "
                                                         "(default: enforce_eager)")
    e.add_argument("--json", action="store_true", help='print {"lossless", "drafts", "draft_tokens", '
                                                      '"accepted_tokens", "acceptance_rate", '
                                                      '"mean_acceptance_length", "per_position", ...}')
    e.set_defaults(func=cmd_evaluate)

    f = sub.add_parser("fixture", help="write a deterministic tiny checkpoint")
    f.add_argument("name", help="fixture name: llama, kimi-k25, deepseek-v3")
    f.add_argument("out_dir")
    f.add_argument("--seed", type=int, default=0)
    f.add_argument("--llama-4-scaling", action="store_true",
                   help="kimi-k25 only: set text_config.llama_4_scaling (position-dependent query scaling)")
    f.add_argument("--layers", type=int, default=None, help="llama only: decoder layers (default 4)")
    f.add_argument("--quantize", choices=["int4"], default=None,
                   help="kimi-k25 only: routed experts as compressed-tensors pack-quantized W4A16 "
                        "(symmetric int4, group strategy); dequantized fp32 copy in OUT_DIR/reference")
    f.add_argument("--group-size", type=int, default=None, help="with --quantize: 32 (default) or 64")
    f.set_defaults(func=cmd_fixture)
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args = parser().parse_args(argv)
    try:
        return int(args.func(args) or 0)
    except SwitchError as exc:
        print(f"spec-compat: {exc}", file=sys.stderr)
        return 2
