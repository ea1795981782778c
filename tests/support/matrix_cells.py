"""matrix/cells.py loaded by path (matrix/ is not a package): ``load_cells()`` -> ``CELLS``."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def load_cells() -> dict:
    spec = importlib.util.spec_from_file_location("_spec_compat_matrix_cells", ROOT / "matrix" / "cells.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod  # dataclasses look their module up
    try:
        spec.loader.exec_module(mod)
    finally:
        sys.modules.pop(spec.name, None)
    return mod.CELLS
