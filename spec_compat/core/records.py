"""What the registry decides for a patch: its :class:`Status` and :class:`Record`, the
exceptions a patch's guard raises, and :class:`Ordered`, what the installation order reads of a
patch (so that :mod:`.stacking` needs no import of the registry, which imports it)."""

from __future__ import annotations

import enum
from typing import Protocol


class Status(str, enum.Enum):
    APPLIED = "applied"
    NOT_NEEDED = "not-needed"
    DISABLED = "disabled"
    TARGET_CHANGED = "target-changed"
    FAILED = "failed"
    PENDING = "pending"

    def __str__(self) -> str:  # pragma: no cover - trivial
        return self.value


class TargetChanged(Exception):
    """Raised by a guard: the target does not have the shape the shim relies on."""


class NotNeeded(Exception):
    """Raised by a guard: the installed versions are in range, but this process does
    not need the shim (e.g. a CPU-only shim on a GPU platform).  Nothing is touched."""


class PatchError(RuntimeError):
    """Strict mode: a patch ended ``target-changed`` or ``failed``."""


class Record(tuple):
    """What the registry decided for one patch: ``Record(id, status, target, reason, touched)``
    (immutable; compares by value).  ``touched`` names what an applied patch changed through its
    undo log (attributes, mapping items, adapted bindings; :meth:`.changes.Changes.described`),
    empty otherwise.  A plain tuple subclass rather than a dataclass:
    ``dataclasses`` (and ``inspect``) would be most of ``import spec_compat``'s cost."""

    __slots__ = ()

    def __new__(cls, id: str, status: Status, target: str, reason: str, touched: tuple[str, ...] = ()) -> Record:
        return tuple.__new__(cls, (id, status, target, reason, tuple(touched)))

    id = property(lambda self: self[0], doc="patch id")
    status = property(lambda self: self[1], doc="its Status")
    target = property(lambda self: self[2], doc="module:attribute it patches")
    reason = property(lambda self: self[3], doc="why it has this status")
    touched = property(lambda self: self[4], doc="what an applied patch changed, each named once")

    def __repr__(self) -> str:
        return (f"Record(id={self.id!r}, status={self.status!r}, target={self.target!r}, reason={self.reason!r}, "
                f"touched={self.touched!r})")

    def __getnewargs__(self) -> tuple[str, Status, str, str, tuple[str, ...]]:
        return (self.id, self.status, self.target, self.reason, self.touched)

    def as_dict(self) -> dict[str, object]:
        return {"id": self.id, "status": self.status.value, "target": self.target, "reason": self.reason,
                "touched": list(self.touched)}


class Ordered(Protocol):
    """A patch as :mod:`.stacking` sees it: its id and the ids it is installed after
    (:class:`~.registry.Patch` is one)."""

    @property
    def id(self) -> str: ...

    @property
    def after(self) -> tuple[str, ...]: ...
