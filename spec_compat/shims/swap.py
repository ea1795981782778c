"""One attribute of a module (or of one object's own namespace) swapped for one call."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

_MISSING = object()


@contextlib.contextmanager
def swapped(owner: Any, name: str, value: Any) -> Iterator[Any]:
    """Inside the ``with`` block ``owner.name`` is ``value``: written into ``vars(owner)``, so a
    module's global as its own functions see it, or one instance's attribute in front of its
    class's.  On exit what was there before returns (or the name goes, if it was absent) -
    unless someone replaced ``value`` meanwhile: their replacement is left as is."""
    namespace = vars(owner)
    old = namespace.get(name, _MISSING)
    namespace[name] = value
    try:
        yield value
    finally:
        if namespace.get(name, _MISSING) is value:
            if old is _MISSING:
                del namespace[name]
            else:
                namespace[name] = old
