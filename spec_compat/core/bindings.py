"""Private adapters for names a consumer module bound at import time.

speculators does ``from vllm.config import SchedulerConfig`` and then calls
``SchedulerConfig(...)``.  Patching vLLM's class would change vLLM for every
caller in the process (including a real engine); instead the consumer's own
binding is replaced:

* :func:`adapt_call` - the binding becomes a factory that rewrites keyword
  arguments through a chain of adapters and returns a real instance of the
  original class (right for validated config dataclasses);
* :func:`wrap_method` - the binding becomes a private subclass whose methods run
  through a chain of wrappers ``wrapper(wrapped, instance, args, kwargs)``
  (right for behavioural classes such as the scheduler and the executor).

Several patches may share one binding; each adds its link under its own id and
removes it on undo.  When the last link goes, the original binding returns.  Each link is noted
in the patch's undo log (:meth:`Changes.touch`): the registry reports it, and refuses two
patches on one chain unless their order is declared (``Patch.after``).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from types import ModuleType
from typing import Any

from .naming import through
from .registry import Changes

KwargsAdapter = Callable[[dict[str, Any]], dict[str, Any]]
MethodWrapper = Callable[[Callable[..., Any], Any, tuple, dict], Any]

_ADAPTERS: dict[tuple[str, str], "_Binding"] = {}


class _Binding:
    def __init__(self, module: ModuleType, name: str, kind: str) -> None:
        self.module = module
        self.name = name
        self.kind = kind
        self.original = getattr(module, name)
        self.kwargs: dict[str, KwargsAdapter] = {}
        self.methods: dict[str, dict[str, MethodWrapper]] = {}
        self.replacement = self._factory() if kind == "factory" else self._subclass()
        setattr(module, name, self.replacement)

    # factory: a function returning an instance of the original class
    def _factory(self) -> Callable[..., Any]:
        original = self.original

        @functools.wraps(original, updated=())
        def factory(*args: Any, **kwargs: Any) -> Any:
            ids = list(self.kwargs)
            for adapt in list(self.kwargs.values()):
                kwargs = adapt(dict(kwargs))
            with through(ids, f"adapted call to {self.module.__name__}.{self.name}"):
                return original(*args, **kwargs)

        factory.__spec_compat_binding__ = self  # type: ignore[attr-defined]
        return factory

    # subclass: methods dispatch through the wrapper chains
    def _subclass(self) -> type:
        binding = self
        original = self.original

        def __init__(inst: Any, *args: Any, **kwargs: Any) -> None:
            for adapt in list(binding.kwargs.values()):
                kwargs = adapt(dict(kwargs))
            ids = [*binding.kwargs, *binding.methods.get("__init__", {})]
            call = functools.partial(original.__init__, inst)
            for wrapper in reversed(list(binding.methods.get("__init__", {}).values())):
                call = functools.partial(wrapper, call, inst)  # type: ignore[assignment]
                call = _unpack(call)
            with through(dict.fromkeys(ids), f"adapted {binding.module.__name__}.{binding.name}()"):
                call(*args, **kwargs)

        ns = {"__init__": __init__, "__module__": original.__module__,
              "__qualname__": original.__qualname__, "__doc__": original.__doc__,
              "__spec_compat_binding__": self}
        return type(original.__name__, (original,), ns)

    def add_method(self, method: str, pid: str, wrapper: MethodWrapper) -> None:
        chain = self.methods.setdefault(method, {})
        chain[pid] = wrapper
        if method == "__init__":
            return
        binding = self
        cls = self.replacement
        parent_method = getattr(self.original, method)

        @functools.wraps(parent_method)
        def dispatch(inst: Any, *args: Any, **kwargs: Any) -> Any:
            call: Callable[..., Any] = getattr(super(cls, inst), method)
            chain = binding.methods.get(method, {})
            for w in reversed(list(chain.values())):
                call = _unpack(functools.partial(w, call, inst))
            with through(list(chain), f"wrapped {binding.name}.{method}"):
                return call(*args, **kwargs)

        if method not in cls.__dict__:
            setattr(cls, method, dispatch)

    def remove(self, pid: str) -> None:
        self.kwargs.pop(pid, None)
        for method, chain in list(self.methods.items()):
            chain.pop(pid, None)
            if not chain:
                del self.methods[method]
                if method != "__init__" and method in self.replacement.__dict__:
                    delattr(self.replacement, method)
        if not self.kwargs and not self.methods:
            if getattr(self.module, self.name, None) is self.replacement:
                setattr(self.module, self.name, self.original)
            key = (self.module.__name__, self.name)
            if _ADAPTERS.get(key) is self:  # a newer binding of the same name stays
                _ADAPTERS.pop(key)


def _unpack(partial_wrapper: Callable[..., Any]) -> Callable[..., Any]:
    """Turn ``wrapper(wrapped, instance, args, kwargs)`` into ``f(*args, **kwargs)``."""

    def call(*args: Any, **kwargs: Any) -> Any:
        return partial_wrapper(args, kwargs)

    return call


def _binding(module: ModuleType, name: str, kind: str) -> _Binding:
    key = (module.__name__, name)
    b = _ADAPTERS.get(key)
    if b is not None and getattr(module, name, None) is not b.replacement:
        _ADAPTERS.pop(key)  # module reloaded or rebound by someone else
        b = None
    if b is None:
        b = _ADAPTERS[key] = _Binding(module, name, kind)
    elif b.kind != kind:
        raise RuntimeError(f"{module.__name__}.{name} is already adapted as a {b.kind}")
    return b


def adapt_call(changes: Changes, module: ModuleType, name: str, adapter: KwargsAdapter,
               kind: str = "factory") -> None:
    """Route keyword arguments of calls to ``module.name`` through ``adapter``.

    The adapters of one binding run in installation order, so two patches adapting one name
    declare their order (``Patch.after``): the binding is noted as touched, and the registry
    refuses an undeclared second adapter (:mod:`.stacking`)."""
    b = _binding(module, name, kind)
    changes.on_undo(lambda: b.remove(changes.patch_id))
    b.kwargs[changes.patch_id] = adapter
    changes.touch(module, name, f"{module.__name__}.{name} (keyword arguments adapted)")


def wrap_method(changes: Changes, module: ModuleType, name: str, method: str,
                wrapper: MethodWrapper) -> None:
    """Run ``method`` of the class bound at ``module.name`` through ``wrapper``
    (``wrapper(wrapped, instance, args, kwargs)``), for instances the module creates."""
    b = _binding(module, name, "subclass")
    # the undo goes first: add_method may raise (no such method) after the
    # binding was replaced, and the rollback must still restore it
    changes.on_undo(lambda: b.remove(changes.patch_id))
    b.add_method(method, changes.patch_id, wrapper)
    # one wrapper chain: its order is the patches' declared order
    changes.touch(b, method, f"{module.__name__}.{name}.{method} (wrapper chain)")


def original(module: ModuleType, name: str) -> Any:
    """The object bound at ``module.name`` before any adapter."""
    obj = getattr(module, name)
    b = getattr(obj, "__spec_compat_binding__", None)
    return b.original if b is not None else obj
