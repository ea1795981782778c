"""The undo log of one patch installation, and the wrappers it installs."""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

log = logging.getLogger("spec_compat")

_MISSING = object()

#: ``wrapper(wrapped, instance, args, kwargs)``: wrapt's convention
Wrapper = Callable[[Callable[..., Any], Any, tuple, dict], Any]

class Changes:
    """Undo log of one patch installation: every change made through it is reverted
    by :meth:`undo`, in reverse order.  A patch that raises half-way is rolled back."""

    def __init__(self, patch_id: str) -> None:
        self.patch_id = patch_id
        self._undo: list[Callable[[], None]] = []
        #: (object, attribute) pairs this installation replaced or wrapped: the registry refuses a
        #: second patch on one of them unless its order is declared (``Patch.after``)
        self.touched: list[tuple[Any, str]] = []

    def touch(self, obj: Any, name: str) -> None:
        """Note that ``obj.name`` is replaced or wrapped by this installation (setattr and wrap do)."""
        self.touched.append((obj, name))

    def setattr(self, obj: Any, name: str, value: Any) -> None:
        old = obj.__dict__.get(name, _MISSING) if hasattr(obj, "__dict__") else getattr(obj, name, _MISSING)
        setattr(obj, name, value)
        self.touch(obj, name)

        def restore() -> None:
            # compare the raw attribute too: a descriptor stored on a class
            # (staticmethod, classmethod, property) reads back as something else
            raw = obj.__dict__.get(name, _MISSING) if hasattr(obj, "__dict__") else _MISSING
            if raw is not value and getattr(obj, name, _MISSING) is not value:
                log.warning(
                    "spec_compat: %s: %r.%s was replaced by someone else since it was patched; left as is",
                    self.patch_id, obj, name,
                )
                return
            if old is _MISSING:
                delattr(obj, name)
            else:
                setattr(obj, name, old)

        self._undo.append(restore)

    def wrap(self, obj: Any, name: str, wrapper: Wrapper) -> Any:
        """Replace the function (or method, classmethod, staticmethod) ``obj.name`` with a
        ``wrapt.FunctionWrapper`` that calls ``wrapper(wrapped, instance, args, kwargs)``;
        undone like :meth:`setattr`.  Returns the wrapper object.  wrapt is imported here, not
        at ``import spec_compat``: its import (with asyncio) costs more than the whole
        import budget (docs/design/wrapt.md)."""
        import wrapt

        raw = obj.__dict__.get(name, _MISSING) if isinstance(obj, type) else _MISSING
        original = getattr(obj, name) if raw is _MISSING else raw
        wrapped = wrapt.FunctionWrapper(original, wrapper)
        self.setattr(obj, name, wrapped)
        return wrapped

    def on_undo(self, fn: Callable[[], None]) -> None:
        self._undo.append(fn)

    def undo(self) -> None:
        errors = []
        while self._undo:
            fn = self._undo.pop()
            try:
                fn()
            except Exception as exc:  # keep undoing the rest
                errors.append(exc)
                log.error("spec_compat: %s: undo step failed: %s", self.patch_id, exc)
        if errors:
            raise errors[0]
