"""matrix/ modules loaded by path (matrix/ is not a package): ``load_cells()`` -> ``CELLS`` of
matrix/cells.py, ``load_records()`` -> matrix/records.py (the recording and rendering functions)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

ROOT = Path(__file__).resolve().parents[2]


def _load(name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(f"_spec_compat_matrix_{name}", ROOT / "matrix" / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod  # dataclasses look their module up
    try:
        spec.loader.exec_module(mod)
    finally:
        sys.modules.pop(spec.name, None)
    return mod


def load_cells() -> dict:
    return _load("cells").CELLS


def load_records() -> ModuleType:
    return _load("records")
