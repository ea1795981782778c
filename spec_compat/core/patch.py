"""A patch's declaration: :class:`Patch`, the base class every registered patch subclasses.

Its class attributes say what it fixes, where (``target``), on which installed versions
(``requires``), in which order to other patches (``after``) and how it is shown to be needed
(``proof``); :meth:`Patch.check` guards the target's shape and :meth:`Patch.install` changes it
through :class:`~spec_compat.core.changes.Changes`.  What decides and installs is
:mod:`spec_compat.core.registry`.
"""

from __future__ import annotations

from collections.abc import Mapping
from types import ModuleType
from typing import TYPE_CHECKING, ClassVar, Protocol

from . import switches
from . import versions as _versions
from .changes import Changes

if TYPE_CHECKING:
    from .proof import Proof


class _Switches(Protocol):
    """What a patch asks of the registry that holds it (:class:`~.registry.Registry` is one)."""

    def switched_on(self, pid: str) -> bool: ...


class Patch:
    """Base class of a registered patch.  Subclasses set the class attributes and
    implement :meth:`check` (raise :class:`TargetChanged`) and :meth:`install`."""

    id: ClassVar[str]
    summary: ClassVar[str]
    #: upstream change answered: version, file, symptom
    upstream: ClassVar[str]
    #: ``"package.module:attribute"``
    target: ClassVar[str]
    #: distribution -> version specifier where the patch is needed (all must hold);
    #: a tuple of such mappings means "any of these combinations"
    requires: ClassVar[Mapping[str, str] | tuple[Mapping[str, str], ...]] = {}
    #: ids of patches made unnecessary while this one is applied (same failure, better fix)
    supersedes: ClassVar[tuple[str, ...]] = ()
    #: failure ids this patch answers (docs/failures.md)
    fixes: ClassVar[tuple[str, ...]] = ()
    #: where the shim acts: "driver" (the process running speculators), "worker"
    #: (vLLM worker processes, through the plugin) or "platform"
    side: ClassVar[str] = "driver"
    #: how the need is shown: the test that disables exactly this patch and the symptom it
    #: asserts (:mod:`spec_compat.core.proof`); every registered patch declares one
    proof: ClassVar[Proof | None] = None
    #: ids of other patches whose on/off state this one reads (:meth:`uses`), instead of
    #: parsing ``SPEC_COMPAT_DISABLE`` itself
    depends_on: ClassVar[tuple[str, ...]] = ()
    #: ids of patches installed before this one because it wraps what they put in place
    #: (:mod:`spec_compat.core.stacking`: an undeclared stack on one attribute is refused)
    after: ClassVar[tuple[str, ...]] = ()
    #: the value switches (``SPEC_COMPAT_*`` variables, :data:`spec_compat.core.switches.SWITCHES`)
    #: this patch reads through :func:`spec_compat.core.switches.value`: a malformed value is
    #: reported as ``spec_compat[<this id>]: VAR=...`` (the core names no patch itself)
    reads: ClassVar[tuple[str, ...]] = ()
    #: set by :meth:`Registry.register`
    _registry: _Switches | None = None

    def uses(self, pid: str) -> bool:
        """Whether ``pid`` (declared in :attr:`depends_on`) is switched on in this process."""
        if pid not in self.depends_on:
            raise ValueError(f"patch {self.id} reads {pid!r} without declaring it in depends_on")
        reg = self._registry
        return reg is not None and reg.switched_on(pid)

    @property
    def target_module(self) -> str:
        return self.target.split(":", 1)[0]

    @property
    def target_attr(self) -> str | None:
        parts = self.target.split(":", 1)
        return parts[1] if len(parts) == 2 else None

    @classmethod
    def alternatives(cls) -> tuple[Mapping[str, str], ...]:
        """The declared ranges as a tuple of alternative combinations."""
        return cls.requires if isinstance(cls.requires, tuple) else (cls.requires,)

    def needed(self, versions: Mapping[str, str | None] | None = None) -> tuple[bool, str]:
        """Whether installed versions fall inside the declared ranges, and why."""
        reasons = []
        for combo in self.alternatives():
            ok, why = self._within(combo, versions)
            if ok:
                return True, why
            reasons.append(why)
        return False, " and ".join(dict.fromkeys(reasons))

    @staticmethod
    def _within(combo: Mapping[str, str], versions: Mapping[str, str | None] | None) -> tuple[bool, str]:
        why = []
        for dist, spec in combo.items():
            # through the module: a test (or a caller) that replaces versions.installed_version is heard
            version = _versions.installed_version(dist) if versions is None else versions.get(dist)
            verdict = _versions.in_range(version, spec)
            if version is None:
                return False, f"{dist} is not installed (needed for {dist}{spec})"
            if verdict is None:
                return False, f"{dist} version {version!r} cannot be parsed (range {dist}{spec})"
            if not verdict:
                return False, f"{dist} {version} is outside {dist}{spec}"
            why.append(f"{dist} {version} in {spec}")
        return True, "; ".join(why) or "no version constraint"

    @classmethod
    def wanted_early(cls, environ: Mapping[str, str] | None = None) -> bool:
        """For code that runs before the registry applies (vLLM's platform plugins, which load
        before its general plugins): whether ``SPEC_COMPAT_DISABLE`` leaves this patch on and the
        installed versions fall inside its ranges -- the registry's own first two decisions, so
        that such code takes none of its own.  The target's shape is the caller's to probe."""
        return not switches.named_in_disable(cls.id, environ) and cls().needed()[0]

    def check(self, module: ModuleType) -> None:  # pragma: no cover - overridden
        """Raise TargetChanged when the target lacks the shape this shim relies on."""

    def install(self, module: ModuleType, changes: Changes) -> None:  # pragma: no cover
        raise NotImplementedError
