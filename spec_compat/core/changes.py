"""The undo log of one patch installation, and the wrappers it installs.

Every change a patch makes to a target goes through its :class:`Changes`: an attribute replaced,
wrapped or removed (:meth:`Changes.setattr`, :meth:`Changes.wrap`, :meth:`Changes.delattr`), an item
of a mapping the target reads (:meth:`Changes.setitem`: a registry entry, a pydantic validator,
``sys.modules``, ``os.environ``), a call of the target's own API with the call that reverses it
(:meth:`Changes.call`: a registry's ``register``, an entry on ``sys.meta_path``), a consumer's
binding adapted (:mod:`.bindings`).  Each is undone by :meth:`Changes.undo` and noted in :attr:`Changes.touched`,
which the registry reports (``Registry.touched``) and checks for undeclared stacks
(:mod:`.stacking`)."""

from __future__ import annotations

import logging
from collections.abc import Callable
from types import ModuleType
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
        #: (object, attribute or key) pairs this installation replaced, wrapped or adapted: the
        #: registry refuses a second patch on one of them unless its order is declared (``Patch.after``)
        self.touched: list[tuple[Any, str]] = []
        #: (id(object), name) -> how a message names it (:meth:`label`)
        self._labels: dict[tuple[int, str], str] = {}

    def touch(self, obj: Any, name: str, label: str | None = None) -> None:
        """Note that ``obj.name`` (or the item ``obj[name]``) is replaced, wrapped or adapted by this
        installation; ``label`` names it in messages and reports (default: ``module.Class.name``).
        :meth:`setattr`, :meth:`wrap`, :meth:`setitem` and :mod:`.bindings` call it."""
        self.touched.append((obj, name))
        if label is not None:
            self._labels[(id(obj), name)] = label

    def label(self, obj: Any, name: str) -> str:
        """How messages name ``obj.name``: the label given to :meth:`touch`, or the object's
        dotted name (module, class qualname) and the attribute."""
        given = self._labels.get((id(obj), name))
        return given if given is not None else f"{dotted_name(obj)}.{name}"

    def described(self) -> list[str]:
        """What this installation touched, each named once, in the order it was touched."""
        return list(dict.fromkeys(self.label(obj, name) for obj, name in self.touched))

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

    def delattr(self, obj: Any, name: str) -> None:
        """Remove ``obj``'s own attribute ``name`` (e.g. a method a class was given, so that the
        inherited one applies again); undo puts it back unless ``obj`` has one of its own again."""
        old = obj.__dict__[name]
        delattr(obj, name)
        self.touch(obj, name, f"{dotted_name(obj)}.{name} (removed)")

        def restore() -> None:
            if name in obj.__dict__:
                log.warning("spec_compat: %s: %s.%s was set again by someone else since it was removed; left as is",
                            self.patch_id, dotted_name(obj), name)
                return
            setattr(obj, name, old)

        self._undo.append(restore)

    def call(self, obj: Any, key: str, do: Callable[[], Any], undo: Callable[[], None], *, label: str) -> Any:
        """A change made through the target's own API where no one attribute or item can be set
        (a registry's ``register``, a finder put on ``sys.meta_path``): ``do()`` makes it, ``undo()``
        reverses it when the log is undone.  Noted as touching ``obj``/``key`` (named ``label``), like
        :meth:`setitem`: reported, and a second applied patch changing the same ``obj``/``key`` without
        a declared order is refused.  Returns what ``do()`` returned."""
        result = do()
        self._undo.append(undo)
        self.touch(obj, key, label)
        return result

    def setitem(self, mapping: Any, key: str, value: Any, *, label: str,
                then: Callable[[], None] | None = None) -> None:
        """``mapping[key] = value`` (a registry entry, a class's validator table), undone like
        :meth:`setattr`: the old item returns (a new key is removed), unless someone replaced the item
        since.  ``label`` names the item in messages and reports; ``then`` runs after the item is
        set and again after it is restored (e.g. rebuilding a class from the table it read)."""
        old = mapping.get(key, _MISSING) if hasattr(mapping, "get") else _MISSING
        if then is not None:
            # registered first, so it runs after the restore below (the log is undone in reverse)
            self._undo.append(then)

        def restore() -> None:
            now = mapping.get(key, _MISSING)
            # a string is compared by value: os.environ decodes a new one on every read
            if now is not value and not (isinstance(value, str) and now == value):
                log.warning("spec_compat: %s: %s was replaced by someone else since it was patched; left as is",
                            self.patch_id, label)
                return
            if old is _MISSING:
                del mapping[key]
            else:
                mapping[key] = old

        mapping[key] = value
        self._undo.append(restore)
        self.touch(mapping, key, label)
        if then is not None:
            then()

    def on_undo(self, fn: Callable[[], None]) -> None:
        """Run ``fn`` on undo: for the primitives themselves (:mod:`.bindings`, which notes what it
        changes with :meth:`touch`) and for steps that change nothing of a target.  A patch changes its
        target with :meth:`setattr`, :meth:`wrap`, :meth:`delattr`, :meth:`setitem` or :meth:`call`:
        what ``fn`` undoes is neither reported nor checked for stacking (tests/unit/test_every_change_logged.py
        refuses an ``on_undo`` in a patch's ``install``)."""
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


def dotted_name(obj: Any) -> str:
    """``module.Class`` for a class or function, the module's name for a module, else the type's name."""
    if isinstance(obj, ModuleType):
        return obj.__name__
    qual = getattr(obj, "__qualname__", None)
    if isinstance(qual, str):
        mod = getattr(obj, "__module__", None)
        return f"{mod}.{qual}" if isinstance(mod, str) and mod != "builtins" else qual
    return type(obj).__name__
