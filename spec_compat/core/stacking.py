"""Patches that change one target: their declared order (``Patch.after``) and the refusal of an
undeclared stack.

The registry installs patches in :func:`install_order` (registration order, except that a patch
comes after those it names in ``after``).  Each installation's :class:`~.changes.Changes` lists the
(object, attribute) pairs it replaced, wrapped or adapted: attributes, mapping items (a registry
entry, a validator table's), consumer bindings whose keyword arguments :mod:`.bindings` adapts, and
one wrapper chain per method of an adapted class.  The registry remembers which applied patch holds
each one (:func:`take_ownership`), and :func:`refuse_undeclared` raises :class:`UndeclaredStack` when
a patch touches one that another applied patch changed without ``after`` naming that patch
(directly or through the patches it names) -- the installation is then rolled back (``failed``).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, TypeVar

from .records import Ordered

if TYPE_CHECKING:
    from .changes import Changes

#: a patch as this module sees it (:class:`~.records.Ordered`: the registry imports this module,
#: so its ``Patch`` is not imported here)
Patch = TypeVar("Patch", bound=Ordered)

#: (id(object), attribute) -> (object, id of the applied patch that replaced it last)
Owners = dict[tuple[int, str], tuple[Any, str]]


class UndeclaredStack(RuntimeError):
    """A patch wrapped what another applied patch had replaced, and neither declares the order."""


def check_after(pid: str, after: tuple[str, ...]) -> None:
    """A declaration names other patches' ids (ValueError otherwise)."""
    from .switches import _ID

    if any(not _ID.match(other) or other == pid for other in after):
        raise ValueError(f"patch {pid}: after = {after!r} must name other patches' ids")


def install_order(patches: Mapping[str, Patch]) -> list[Patch]:
    """``patches`` (registration order) with every patch placed after those in its ``after``."""
    out: list[Patch] = []
    state: dict[str, int] = {}  # 1: being placed, 2: placed

    def place(p: Patch) -> None:
        if state.get(p.id) == 2:
            return
        if state.get(p.id) == 1:
            raise ValueError(f"patch {p.id}: its `after` declarations form a cycle")
        state[p.id] = 1
        for dep in p.after:
            if dep in patches:
                place(patches[dep])
        state[p.id] = 2
        out.append(p)

    for p in patches.values():
        place(p)
    return out


def declared_before(patches: Mapping[str, Patch], pid: str) -> set[str]:
    """The ids ``pid`` is declared to come after, transitively."""
    seen: set[str] = set()
    todo = list(patches[pid].after) if pid in patches else []
    while todo:
        dep = todo.pop()
        if dep not in seen:
            seen.add(dep)
            todo.extend(patches[dep].after if dep in patches else ())
    return seen


def refuse_undeclared(patches: Mapping[str, Patch], owners: Owners, applied: Mapping[str, Any],
                      patch: Patch, changes: Changes) -> None:
    """Raise :class:`UndeclaredStack` when ``patch``'s installation replaced, wrapped or adapted
    something an applied patch had changed, without declaring that patch in its ``after``."""
    allowed = declared_before(patches, patch.id)
    for obj, name in changes.touched:
        held = owners.get((id(obj), name))
        if held is None or held[0] is not obj:
            continue
        owner = held[1]
        if owner != patch.id and owner in applied and owner not in allowed:
            raise UndeclaredStack(
                f"it changes {changes.label(obj, name)}, which patch {owner} replaced first, without a "
                f"declared order: add after = ({owner!r},) to {type(patch).__name__} (or the reverse to {owner})")


def take_ownership(owners: Owners, pid: str, changes: Changes) -> None:
    """Note ``pid`` as the holder of every attribute its installation touched."""
    for obj, name in changes.touched:
        owners[(id(obj), name)] = (obj, pid)
