"""The statements of a target function, for shape guards that compare a body line by line."""

from __future__ import annotations

import ast
import textwrap
from typing import Any

from ..core.registry import TargetChanged
from . import _guards as guard


def function_statements(fn: Any, where: str) -> list[str]:
    """The statements of a function, normalised through ``ast.unparse``."""
    tree = ast.parse(textwrap.dedent(guard.source(fn, where)))
    node = tree.body[0]
    if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
        raise TargetChanged(f"{where} is not a plain function")
    return [ast.unparse(stmt) for stmt in node.body]
