"""``spec-compat evaluate --target T --draft A [--draft B ...]``: the command (its one-draft run is
:func:`spec_compat.cli.evaluate.evaluate`) and several EAGLE-3
drafts (any format vLLM + spec-compat serve) on the same prompts -- one reference run without
speculation, one run per draft, each checked lossless against the reference -- in one table (and a
per-position acceptance plot where matplotlib is installed).

The columns are what published draft cards report: acceptance length (1 + accepted tokens per
draft, the bonus token included) at k speculative tokens, greedy (top-k 1), and the acceptance
rate at each position.  A draft vLLM's config checks refuse (a spec-compat refusal such as a head
that does not fit the target) is reported in one line, exit status 2.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from .console import stdout_to_stderr
from .checkpoints import TRUST_FLAG, TRUST_HELP, CheckpointError, checked_target, eagle3_draft, model_dir
from .engine_runs import engine_kwargs, engine_settings, generate
from .evaluate import EvalResult, EvaluateError, evaluate, load_prompts, serving_unsupported, summarise, table

#: the commands this module defines (spec_compat.cli discovers them): name -> one-line help
COMMANDS = {
    'evaluate': 'serve EAGLE-3 drafts in vLLM: greedy outputs with and without each must be identical; prints acceptance length, acceptance rate and per-position acceptance, one row per draft',
}

log = logging.getLogger("spec_compat")


def evaluate_drafts(target: str, drafts: Sequence[str], prompts: str | None = None, k: int = 3,
                    max_tokens: int = 64, max_model_len: int = 2048, limit: int | None = None, eager: bool = True,
                    seed: int = 0, ignore_eos: bool = True, trust_remote_code: bool = False) -> list[EvalResult]:
    """``spec-compat evaluate`` for several drafts: the speculative runs first (in order: a draft or
    engine that cannot serve fails before the reference run), then one reference run."""
    import spec_compat  # noqa: F401  (registry applied in this process; the plugin does the engine's)

    if k < 1 or max_tokens < 1:
        raise EvaluateError(f"--k and --max-tokens must be at least 1, got {k} and {max_tokens}")
    if not drafts:
        raise EvaluateError("no draft to evaluate (--draft DIR, repeated)")
    model_dir(target, "target")
    ddirs = [model_dir(d, "draft") for d in drafts]
    for ddir in ddirs:
        eagle3_draft(ddir)
    tdir, trust = checked_target(target, "target", trust_remote_code)
    unsupported = serving_unsupported()
    if unsupported:
        raise EvaluateError(unsupported)
    from transformers import AutoTokenizer

    ids = load_prompts(prompts, AutoTokenizer.from_pretrained(str(tdir), trust_remote_code=trust), limit)
    too_long = [i for i, p in enumerate(ids) if len(p) + max_tokens > max_model_len]
    if too_long:
        raise EvaluateError(f"{len(too_long)} prompts do not fit max_model_len {max_model_len} with {max_tokens} new "
                            f"tokens (first: prompt {too_long[0]})")
    base_kw = engine_kwargs(tdir, trust, max_model_len, eager, seed)
    with engine_settings(tdir, trust):
        runs = [generate(dict(base_kw, speculative_config={"method": "eagle3", "model": str(d),
                                                             "num_speculative_tokens": int(k)}),
                         ids, max_tokens, ignore_eos)
                for d in ddirs]
        base, _, _, t_base = generate(base_kw, ids, max_tokens, ignore_eos)
    return [summarise(base, spec, before, after, k, {"no_spec": round(t_base, 3), "spec": round(t_spec, 3)})
            for spec, before, after, t_spec in runs]


def spec_compat_refusal(exc: BaseException) -> str | None:
    """The one-line ``spec_compat[<id>]: ...`` refusal inside an exception (vLLM wraps the errors of
    its config checks in pydantic's ValidationError), or None."""
    import re

    m = re.search(r"spec_compat\[[a-z0-9-]+\]: [^\n]*?(?= \[type=|$)", str(exc), re.MULTILINE)
    return m.group(0) if m else None


def names(drafts: Sequence[str]) -> list[str]:
    """Short unique names: each draft directory's name, its parent's where two names clash."""
    short = [Path(d).name or str(d) for d in drafts]
    if len(set(short)) == len(short):
        return short
    return [str(Path(d).parent.name + "/" + Path(d).name) for d in drafts]


def table_several(drafts: Sequence[str], results: Sequence[Any]) -> str:
    label = names(drafts)
    k = results[0].k
    width = max(12, *(len(n) for n in label))
    head = f"{'draft':<{width}}  lossless  acc.length  acc.rate  " + "  ".join(f"pos{i + 1:<3}" for i in range(k))
    rows = [f"{results[0].prompts} prompts, {results[0].output_tokens} output tokens each run, k = {k}, greedy", head]
    for n, r in zip(label, results):
        pos = "  ".join(f"{p:<6.3f}" for p in r.per_position)
        rows.append(f"{n:<{width}}  {'yes' if r.lossless else 'NO':<8}  {r.mean_acceptance_length:<10.3f}  "
                    f"{r.acceptance_rate:<8.3f}  {pos}")
    return "\n".join(rows)


def plot_positions(drafts: Sequence[str], results: Sequence[Any], path: str) -> bool:
    """Per-position acceptance, one line per draft; False (logged) without matplotlib."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        log.warning("spec-compat evaluate: --plot needs matplotlib (pip install matplotlib); no plot written")
        return False
    fig, ax = plt.subplots(figsize=(6, 4))
    for n, r in zip(names(drafts), results):
        ax.plot(range(1, r.k + 1), r.per_position, marker="o",
                label=f"{n} (acceptance length {r.mean_acceptance_length:.2f})")
    ax.set_xlabel("speculative position")
    ax.set_ylabel("accepted per draft")
    ax.set_xticks(range(1, results[0].k + 1))
    ax.set_ylim(0, 1)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    return True


def report_several(drafts: Sequence[str], results: Sequence[Any], as_json: bool, plot: str | None) -> int:
    if as_json:
        print(json.dumps({"drafts": [dict(r.as_dict(), draft=str(d)) for d, r in zip(drafts, results)]}))
    else:
        print(table_several(drafts, results))
    if plot:
        plot_positions(drafts, results, plot)
    bad = [str(d) for d, r in zip(drafts, results) if not r.lossless]
    if bad:
        print(f"spec-compat evaluate: outputs differ from the reference with {', '.join(bad)}", file=sys.stderr)
        return 1
    return 0


def add_arguments(command: str, e: argparse.ArgumentParser) -> None:
    e.epilog = "Exit status: 0 lossless (every draft), 1 outputs differ, 2 bad input or a draft refused."
    e.add_argument("--target", required=True, help="target (verifier) checkpoint directory")
    e.add_argument("--draft", required=True, action="append",
                   help="EAGLE-3 draft directory: speculators' format, vLLM's, or a published head's (TorchSpec, "
                        "SpecForge, ModelOpt); repeat for several drafts on the same prompts, one table")
    e.add_argument("--prompts", default=None, help="prompts file: .jsonl with prompt_token_ids, prompt or "
                                                   "messages/conversations per line, or one raw prompt per line "
                                                   "(default: spec-compat's 16 held-out chat prompts)")
    e.add_argument(TRUST_FLAG, action="store_true", help=TRUST_HELP)
    e.add_argument("--k", type=int, default=3, help="speculative tokens per draft (default 3)")
    e.add_argument("--max-tokens", type=int, default=64, help="new tokens per prompt (default 64)")
    e.add_argument("--max-model-len", type=int, default=2048, help="engine max_model_len (default 2048)")
    e.add_argument("--limit", type=int, default=None, help="use only the first N prompts")
    e.add_argument("--compile", action="store_true", help="let vLLM compile / capture graphs "
                                                         "(default: enforce_eager)")
    e.add_argument("--plot", default=None, metavar="PNG",
                   help="write the per-position acceptance plot, one line per draft (needs matplotlib)")
    e.add_argument("--json", action="store_true", help='one draft: {"lossless", "drafts", "draft_tokens", '
                                                      '"accepted_tokens", "acceptance_rate", '
                                                      '"mean_acceptance_length", "per_position", ...}; several: '
                                                      '{"drafts": [{"draft", "lossless", ...}, ...]}')
    e.set_defaults(func=cmd_evaluate)


def cmd_evaluate(args: argparse.Namespace) -> int:
    drafts = list(args.draft)
    try:
        with stdout_to_stderr():  # vLLM logs to stdout: stdout holds the table or the JSON only
            if len(drafts) == 1:
                results = [evaluate(args.target, drafts[0], prompts=args.prompts, k=args.k, max_tokens=args.max_tokens,
                                    max_model_len=args.max_model_len, limit=args.limit, eager=not args.compile,
                                    trust_remote_code=args.trust_remote_code)]
            else:
                results = evaluate_drafts(args.target, drafts, prompts=args.prompts, k=args.k,
                                          max_tokens=args.max_tokens, max_model_len=args.max_model_len,
                                          limit=args.limit, eager=not args.compile,
                                          trust_remote_code=args.trust_remote_code)
    except CheckpointError as exc:  # EvaluateError too
        print(f"spec-compat evaluate: {exc}", file=sys.stderr)
        return 2
    except Exception as exc:  # noqa: BLE001  (a spec-compat refusal raised inside vLLM's config checks)
        refusal = spec_compat_refusal(exc)
        if refusal is None:
            raise
        print(f"spec-compat evaluate: {refusal}", file=sys.stderr)
        return 2
    if len(drafts) > 1:
        return report_several(drafts, results, args.json, args.plot)
    res = results[0]
    print(json.dumps(res.as_dict()) if args.json else table(res))
    if args.plot:
        plot_positions(drafts, results, args.plot)
    if not res.lossless:
        print("spec-compat evaluate: outputs with the draft differ from outputs without it", file=sys.stderr)
        return 1
    return 0
