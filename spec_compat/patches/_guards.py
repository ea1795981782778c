"""Shape guards shared by patches: they raise TargetChanged, never touch anything."""

from __future__ import annotations

import inspect
from typing import Any

from ..core.registry import TargetChanged


def source(obj: Any, where: str) -> str:
    """The source text of ``obj`` (a shape guard reads what the target does)."""
    try:
        return inspect.getsource(obj)
    except (OSError, TypeError) as exc:
        raise TargetChanged(f"cannot read the source of {where}: {exc}") from None


def params(obj: Any, where: str) -> dict[str, inspect.Parameter]:
    try:
        return dict(inspect.signature(obj).parameters)
    except (TypeError, ValueError) as exc:
        raise TargetChanged(f"cannot read the signature of {where}: {exc}") from None


def has_params(obj: Any, where: str, *names: str) -> None:
    p = params(obj, where)
    missing = [n for n in names if n not in p]
    if missing:
        raise TargetChanged(f"{where} has no parameter {', '.join(missing)}")


def lacks_params(obj: Any, where: str, *names: str) -> None:
    p = params(obj, where)
    present = [n for n in names if n in p]
    if present:
        raise TargetChanged(f"{where} still takes {', '.join(present)}: the shim would change behaviour")


def exact_params(obj: Any, where: str, *names: str) -> None:
    """``obj`` takes exactly the parameters ``names``, in this order (none: a zero-argument
    callable): for a replacement with the same fixed signature, any drift is a change."""
    got = list(params(obj, where))
    if got != list(names):
        want = ", ".join(names) or "no parameters"
        raise TargetChanged(f"{where} takes ({', '.join(got)}), expected ({want})")


def has_attrs(obj: Any, where: str, *names: str) -> None:
    missing = [n for n in names if not hasattr(obj, n)]
    if missing:
        raise TargetChanged(f"{where} has no attribute {', '.join(missing)}")


def attr(module: Any, name: str) -> Any:
    from ..core.bindings import original

    if not hasattr(module, name):
        raise TargetChanged(f"{module.__name__} has no attribute {name!r}")
    return original(module, name)
