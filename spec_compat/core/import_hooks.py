"""Post-import hooks: call a function once a named module has been imported.

A small ``sys.meta_path`` finder, so that ``import spec_compat`` stays cheap (wrapt's
importer pulls in asyncio, ~50 ms).  For a watched name the finder asks the other finders
for the spec and wraps its loader: after the module body has run, every hook registered
for the name is called with the module object found in ``sys.modules``.  A module that
is already imported gets its hooks called at once.  Hooks run once per import; the
registry's hook raises only in strict mode (``SPEC_COMPAT_STRICT=1``), and that error
reaches the importing code, as intended.
"""

from __future__ import annotations

import sys
import threading
from collections.abc import Callable
from types import ModuleType
from typing import Any

Hook = Callable[[ModuleType], None]

_lock = threading.RLock()
_hooks: dict[str, list[Hook]] = {}
_resolving = threading.local()


def _run(name: str, module: ModuleType) -> None:
    with _lock:
        hooks = _hooks.pop(name, [])
    error: BaseException | None = None
    for hook in hooks:
        try:
            hook(module)
        except Exception as exc:  # the other hooks still run; the first error reaches the import
            error = error or exc
    if error is not None:
        raise error


def register_post_import_hook(hook: Hook, name: str) -> None:
    """Call ``hook(module)`` after ``name`` is imported (now, if it already is)."""
    module = sys.modules.get(name)
    with _lock:
        if module is None:
            _hooks.setdefault(name, []).append(hook)
            _install_finder()
            return
    hook(module)


def discard_hooks() -> None:
    """Forget every hook not yet run (the registry's revert)."""
    with _lock:
        _hooks.clear()


class _Loader:
    """Delegates to the real loader, then runs the hooks of the module's name."""

    def __init__(self, loader: Any, name: str) -> None:
        self._loader = loader
        self._name = name

    def create_module(self, spec: Any) -> Any:
        create = getattr(self._loader, "create_module", None)
        return create(spec) if create is not None else None

    def exec_module(self, module: ModuleType) -> None:
        self._loader.exec_module(module)
        _run(self._name, sys.modules.get(self._name, module))

    def __getattr__(self, attr: str) -> Any:  # get_resource_reader, is_package, get_code, ...
        return getattr(self._loader, attr)


class _Finder:
    def find_spec(self, fullname: str, path: Any = None, target: Any = None) -> Any:
        if fullname not in _hooks or getattr(_resolving, "name", None) == fullname:
            return None
        _resolving.name = fullname
        try:
            import importlib.util

            spec = importlib.util.find_spec(fullname)
        except (ImportError, ValueError):
            return None
        finally:
            _resolving.name = None
        loader = getattr(spec, "loader", None) if spec is not None else None
        if loader is None or not hasattr(loader, "exec_module"):
            return spec  # namespace package or legacy loader: leave the import as it is
        spec.loader = _Loader(loader, fullname)
        return spec

    def invalidate_caches(self) -> None:
        pass


_FINDER = _Finder()


def _install_finder() -> None:
    if not any(f is _FINDER for f in sys.meta_path):
        sys.meta_path.insert(0, _FINDER)
