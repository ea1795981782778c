"""Shared code of the fault suite (fixtures are in conftest.py): fake version metadata,
identity snapshots of real target modules, the watched full run."""

from __future__ import annotations

import importlib
import importlib.metadata
import itertools
import os
import secrets
import sys
import types
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from faults_helpers import Background, child_env

import spec_compat  # noqa: F401  (before anything it patches, as users do)
from spec_compat import REGISTRY
from spec_compat.core import bindings
from spec_compat.core.registry import Patch

_counter = itertools.count()

#: every registered patch, as the suite saw them at collection
PATCHES: list[Patch] = REGISTRY.patches()


def unique(prefix: str) -> str:
    return f"_sc_faults_{prefix}_{os.getpid()}_{next(_counter)}"


# -- versions -----------------------------------------------------------------

class FakeMetadata:
    """Stands in for ``importlib.metadata`` where ``spec_compat.core.versions`` reads it:
    ``version(dist)`` answers from a mapping; an absent (or None) entry raises the real
    ``PackageNotFoundError``."""

    PackageNotFoundError = importlib.metadata.PackageNotFoundError

    def __init__(self, dists: Mapping[str, str | None]) -> None:
        self.dists = dict(dists)
        self.asked: list[str] = []

    def version(self, dist: str) -> str:
        self.asked.append(dist)
        v = self.dists.get(dist)
        if v is None:
            raise self.PackageNotFoundError(dist)
        return v


# -- real targets -------------------------------------------------------------

def target_modules() -> list[str]:
    return sorted({p.target_module for p in PATCHES})


def import_targets() -> tuple[dict[str, types.ModuleType], dict[str, str]]:
    imported, failed = {}, {}
    for name in target_modules():
        try:
            imported[name] = importlib.import_module(name)
        except Exception as exc:  # not in this environment (e.g. vllm in a training-only cell)
            failed[name] = f"{type(exc).__name__}: {exc}"[:300]
    return imported, failed


def target_state(modules: Mapping[str, types.ModuleType]) -> dict[tuple, Any]:
    """Identity snapshot of what patches may touch: every attribute of each target module,
    every attribute of the classes defined in (or targeted in) them, the import system's
    meta path.  Values are kept (alive), compared with ``is``."""
    state: dict[tuple, Any] = {("sys.meta_path",): tuple(sys.meta_path)}
    classes: dict[int, tuple[str, type]] = {}
    for mname, mod in modules.items():
        for k, v in list(vars(mod).items()):
            state[("module", mname, k)] = v
            if isinstance(v, type) and v.__module__ == mname:
                classes[id(v)] = (f"{mname}.{k}", v)
    for p in PATCHES:
        mod = modules.get(p.target_module)
        obj = getattr(mod, p.target_attr, None) if mod is not None and p.target_attr else None
        orig = bindings.original(mod, p.target_attr) if obj is not None else None
        for o in (obj, orig):
            if isinstance(o, type):
                classes[id(o)] = (f"{p.target_module}:{p.target_attr}", o)
                for sub in o.__subclasses__():
                    if "__spec_compat_binding__" not in vars(sub):  # spec_compat's own binding classes
                        classes[id(sub)] = (f"{sub.__module__}.{sub.__qualname__}", sub)
    for where, cls in classes.values():
        pydantic = "__pydantic_validator__" in vars(cls)
        for k, v in list(vars(cls).items()):
            # a pydantic dataclass gets a new generated __init__ when its schema is rebuilt
            state[("class", where, k)] = REBUILT_MARK if pydantic and k == "__init__" else v
        decorators = vars(cls).get("__pydantic_decorators__")
        for k, v in dict(getattr(decorators, "model_validators", {}) or {}).items():
            state[("pydantic-validator", where, k)] = v
    return state


REBUILT_MARK = object()

#: attributes that a revert legitimately rebuilds (pydantic regenerates its schema objects
#: when a model validator is put back: eagle3-deepseek-allow-list) - compared by presence only
REBUILT = ("__pydantic_validator__", "__pydantic_serializer__", "__pydantic_core_schema__",
           "__pydantic_fields__", "__pydantic_complete__", "__signature__", "__pydantic_computed_fields__",
           "__pydantic_fields_complete__")


def state_diff(a: Mapping[tuple, Any], b: Mapping[tuple, Any]) -> list[str]:
    out = []
    for key in sorted(set(a) | set(b), key=repr):
        if key[-1] in REBUILT and key in a and key in b:
            continue
        if key not in a:
            out.append(f"added {key}")
        elif key not in b:
            out.append(f"removed {key}")
        elif a[key] is not b[key] and not (key == ("sys.meta_path",) and list(a[key]) == list(b[key])):
            out.append(f"changed {key}")
    return out


@dataclass
class RealTargets:
    modules: dict[str, types.ModuleType]
    failed: dict[str, str]
    global_before: dict[str, tuple[str, str]]
    stock: dict[tuple, Any] = field(default_factory=dict)

    def module(self, name: str) -> types.ModuleType:
        if name not in self.modules:
            pytest.skip(f"target module {name} does not import here: {self.failed.get(name)}")
        return self.modules[name]


_SKIP_MODULE_KEYS = {"__name__", "__spec__", "__loader__", "__package__", "__path__", "__builtins__"}


def copy_module(real: types.ModuleType, name: str) -> types.ModuleType:
    """A new module object holding the same objects as ``real`` (not in sys.modules)."""
    mod = types.ModuleType(name, real.__doc__)
    for k, v in vars(real).items():
        if k not in _SKIP_MODULE_KEYS:
            mod.__dict__[k] = v
    return mod


def records_of(registry: Any) -> dict[str, tuple[str, str]]:
    return {r.id: (r.status.value, r.reason) for r in registry.records()}


# -- the watched full run (test_security.py; started by conftest.py) --------------

SECRET_VARS = ("HF_TOKEN", "HUGGING_FACE_HUB_TOKEN", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "OPENAI_API_KEY",
               "WANDB_API_KEY", "GITHUB_TOKEN", "ANTHROPIC_API_KEY", "MY_APP_PASSWORD")

WORKLOAD = r"""
import contextlib, io, json, sys
from pathlib import Path
out = Path(sys.argv[1])
from spec_compat.cli import main
for name, argv in (("report.json", ["report", "--json"]), ("report.txt", ["report"]), ("patches.txt", ["patches"])):
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        rc = main(argv)
    (out / name).write_text(buf.getvalue())
    assert rc == 0, (name, rc)
# a CPU workload through an applied shim, called as vLLM calls it
import torch
from spec_compat import REGISTRY
try:
    import vllm.v1.sample.rejection_sampler as rs
except Exception:
    rs = None
if rs is not None and REGISTRY.status("cpu-rejection-sampler").value == "applied":
    o = torch.full((3, 4), -1, dtype=torch.int32)
    rs.rejection_greedy_sample_kernel[(3,)](o, torch.tensor([3, 3, 5]), torch.tensor([7, 8, 9, 4, 5]),
                                             torch.tensor([7, 1, 9, 4, 5]), torch.tensor([[11], [12], [13]]), None, 3)
    result = o.tolist()
else:
    result = (torch.ones(64, 64) @ torch.ones(64, 64)).sum().item()
(out / "workload.json").write_text(json.dumps(result))
"""


def full_run_command(out: Path) -> Background:
    """Start the watched full non-engine run: apply + report (json, text) + patches +
    a CPU workload through an applied shim, with secret-looking variables set."""
    values = {var: f"sc-secret-{secrets.token_hex(12)}" for var in SECRET_VARS}
    env = child_env({**values, "SPEC_COMPAT_LOG": "DEBUG"})
    handle = Background([[sys.executable, "-c", WORKLOAD, str(out)]], env=env, cwd=out, timeout=540)
    handle.out, handle.values = out, values
    return handle
