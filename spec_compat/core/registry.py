"""The version-keyed patch registry.

A :class:`~spec_compat.core.patch.Patch` (``core/patch.py``) declares a stable id, the upstream change it answers, its
target (``module:attribute``), the installed-version ranges where it is needed
and a shape guard.  :class:`Registry` decides, per patch, one status:

``applied``         installed on its target
``not-needed``      installed versions are outside the patch's ranges
``disabled``        switched off with ``SPEC_COMPAT_DISABLE``
``target-changed``  the guard found a different shape: nothing was touched
``failed``          installing raised: every partial change was rolled back
``pending``         the target module is not imported yet (a post-import hook waits)

Application is lazy (post-import hooks), idempotent, thread-safe and
reversible (:meth:`Registry.revert`).
"""

from __future__ import annotations

import importlib
import logging
import sys
import threading
from collections.abc import Callable, Iterable, Mapping
from types import ModuleType
from . import stacking, switches
from .changes import Changes
from .patch import Patch
from .records import NotNeeded, PatchError, Record, Status, TargetChanged

__all__ = ["Changes", "NotNeeded", "Patch", "PatchError", "Record", "Registry", "REGISTRY", "Status",
           "TargetChanged", "register"]

log = logging.getLogger("spec_compat")


class Registry:
    def __init__(self) -> None:
        self._patches: dict[str, Patch] = {}
        self._records: dict[str, Record] = {}
        self._changes: dict[str, Changes] = {}
        self._hooked: set[tuple[int, str]] = set()
        self._declare: Callable[[], None] | None = None  # loads the patch modules (spec_compat.patches)
        #: pending patches whose version ranges are not read yet -> the disabled ids of that apply()
        self._undecided: dict[str, set[str] | frozenset[str]] = {}
        self._generation = 0
        self._warned: set[tuple[str, Status, str]] = set()  # logged once, not on every re-apply
        self._disabled: frozenset[str] = frozenset()  # what SPEC_COMPAT_DISABLE switched off at the last apply()
        self._owners: stacking.Owners = {}  # who replaced each touched attribute last
        self._order: list[Patch] | None = None
        self._lock = threading.RLock()

    # -- declaration -------------------------------------------------------
    def register(self, cls: type[Patch]) -> type[Patch]:
        pid = getattr(cls, "id", None)
        if not pid or not switches._ID.match(pid):
            raise ValueError(f"patch {cls.__name__}: id {pid!r} must be kebab-case")
        if pid in self._patches:
            raise ValueError(f"duplicate patch id {pid!r}")
        for attr in ("summary", "upstream", "target"):
            if not getattr(cls, attr, None):
                raise ValueError(f"patch {pid}: missing {attr}")
        from .versions import check_spec

        for combo in cls.alternatives():
            for spec in combo.values():
                check_spec(spec)
        stacking.check_after(pid, cls.after)
        for var in cls.reads:
            switches.claim(var, pid)
        inst = cls()
        inst._registry = self
        self._patches[pid] = inst
        self._order = None
        return cls

    def ordered(self) -> list[Patch]:
        """Every patch in installation order (:func:`stacking.install_order`)."""
        self._declared()
        if self._order is None:
            self._order = stacking.install_order(self._patches)
        return self._order

    def switched_on(self, pid: str) -> bool:
        """Whether ``pid`` is a declared patch not switched off by ``SPEC_COMPAT_DISABLE``
        (as parsed at the last :meth:`apply`).  A patch this registry does not hold is off
        (a registry built for a test may hold one patch alone)."""
        self._declared()
        return pid in self._patches and pid not in self._disabled

    def patches(self) -> list[Patch]:
        self._declared()
        return list(self._patches.values())

    def get(self, pid: str) -> Patch:
        self._declared()
        return self._patches[pid]

    def declare_lazily(self, load: Callable[[], None], target_modules: Iterable[str],
                       environ: Mapping[str, str] | None = None) -> None:
        """``import spec_compat``: the patch classes are loaded by ``load()`` (and the
        registry applied) when one of ``target_modules`` is imported, or when the registry
        is inspected - not before."""
        def declare_and_apply() -> None:
            load()
            self.apply(environ, records=False)

        self._declare = declare_and_apply

        def on_target_import(_module: ModuleType) -> None:
            self.apply(environ, records=False)

        from .import_hooks import register_post_import_hook

        for name in target_modules:
            register_post_import_hook(on_target_import, name)

    def _declared(self) -> None:
        load, self._declare = self._declare, None
        if load is not None:
            load()

    # -- application -------------------------------------------------------
    def apply(self, environ: Mapping[str, str] | None = None, *, records: bool = True) -> list[Record]:
        """Decide every patch; install those whose target is imported, hook the rest.

        ``records=False`` (``import spec_compat``) returns nothing and leaves the version
        ranges of not-yet-imported targets unread until a record is asked for."""
        self._declared()
        disabled = switches.disabled_ids(self._patches, environ)
        strict = switches.strict(environ)
        with self._lock:
            self._disabled = disabled
            for patch in self.ordered():
                rec = self._records.get(patch.id)
                if rec is not None and rec.status in (Status.APPLIED, Status.PENDING):
                    continue
                if patch.id in disabled:
                    self._set(patch, Status.DISABLED, "disabled by SPEC_COMPAT_DISABLE")
                    continue
                mod = sys.modules.get(patch.target_module)
                if mod is None:
                    # decided when its target is imported or its record is read (versions are
                    # read lazily: `import spec_compat` needs neither metadata nor packaging)
                    self._undecided[patch.id] = disabled
                    self._set(patch, Status.PENDING, f"waiting for import of {patch.target_module}")
                    self._hook(patch.target_module, strict)
                elif self._decide(patch, disabled):
                    self._install(patch, mod, strict)
            return self.records() if records else []

    def _decide(self, patch: Patch, disabled: set[str] | frozenset[str]) -> bool:
        """Version ranges and supersession: False (record set to not-needed) or True."""
        self._undecided.pop(patch.id, None)
        needed, why = patch.needed()
        if not needed:
            self._set(patch, Status.NOT_NEEDED, why)
            return False
        by = [o.id for o in self._patches.values()
              if patch.id in o.supersedes and o.id not in disabled and o.needed()[0]]
        if by:
            self._set(patch, Status.NOT_NEEDED, f"superseded by {', '.join(by)} ({why})")
            return False
        self._set(patch, Status.PENDING, f"waiting for import of {patch.target_module} ({why})")
        return True

    def _decide_all(self) -> None:
        for pid, disabled in list(self._undecided.items()):
            self._decide(self._patches[pid], disabled)

    def _hook(self, module_name: str, strict: bool) -> None:
        key = (self._generation, module_name)
        if key in self._hooked:
            return
        self._hooked.add(key)
        generation = self._generation

        def on_import(module: ModuleType) -> None:
            with self._lock:
                if generation != self._generation:
                    return  # reverted since this hook was registered
                for patch in self.ordered():
                    rec = self._records.get(patch.id)
                    if patch.target_module == module_name and rec and rec.status is Status.PENDING:
                        if patch.id in self._undecided and not self._decide(patch, self._undecided[patch.id]):
                            continue
                        self._install(patch, module, strict)

        from .import_hooks import register_post_import_hook

        register_post_import_hook(on_import, module_name)

    def _install(self, patch: Patch, module: ModuleType, strict: bool) -> None:
        attr = patch.target_attr
        try:
            if attr is not None and not hasattr(module, attr):
                raise TargetChanged(f"{patch.target_module} has no attribute {attr!r}")
            patch.check(module)
        except NotNeeded as exc:
            self._set(patch, Status.NOT_NEEDED, str(exc))
            return
        except TargetChanged as exc:
            self._set(patch, Status.TARGET_CHANGED, str(exc))
            self._maybe_raise(patch, strict)
            return
        except AttributeError as exc:  # the guard reached for a member the target no longer has
            self._set(patch, Status.TARGET_CHANGED, f"guard raised AttributeError: {exc}")
            self._maybe_raise(patch, strict)
            return
        except Exception as exc:
            self._set(patch, Status.FAILED, f"guard raised {type(exc).__name__}: {exc}")
            self._maybe_raise(patch, strict)
            return
        changes = Changes(patch.id)
        try:
            patch.install(module, changes)
            stacking.refuse_undeclared(self._patches, self._owners, self._changes, patch, changes)
        except Exception as exc:
            try:
                changes.undo()
            except Exception as undo_exc:  # pragma: no cover - reported in the reason
                exc = RuntimeError(f"{exc}; rollback also failed: {undo_exc}")
            self._set(patch, Status.FAILED, f"install raised {type(exc).__name__}: {exc} (rolled back)")
            self._maybe_raise(patch, strict)
            return
        self._changes[patch.id] = changes
        stacking.take_ownership(self._owners, patch.id, changes)
        self._set(patch, Status.APPLIED, patch.summary, tuple(changes.described()))

    def _maybe_raise(self, patch: Patch, strict: bool) -> None:
        rec = self._records[patch.id]
        if (rec.id, rec.status, rec.reason) not in self._warned:
            self._warned.add((rec.id, rec.status, rec.reason))
            log.warning("spec_compat: patch %s %s: %s", patch.id, rec.status.value, rec.reason)
        if strict:
            raise PatchError(f"spec_compat: patch {patch.id} is {rec.status.value}: {rec.reason}")

    def _set(self, patch: Patch, status: Status, reason: str, touched: tuple[str, ...] = ()) -> None:
        self._records[patch.id] = Record(patch.id, status, patch.target, reason, touched)
        log.debug("spec_compat: %s -> %s (%s)", patch.id, status.value, reason)

    def revert(self) -> None:
        """Undo every applied patch and forget pending hooks; apply() may be called again."""
        with self._lock:
            self._generation += 1
            errors = []
            for pid in reversed(list(self._changes)):
                try:
                    self._changes.pop(pid).undo()
                except Exception as exc:  # keep reverting the other patches
                    errors.append(exc)
            self._records.clear()
            self._warned.clear()
            self._undecided.clear()
            self._owners.clear()
            if errors:
                raise errors[0]

    # -- inspection --------------------------------------------------------
    def records(self) -> list[Record]:
        self._declared()
        with self._lock:
            self._decide_all()
            return [self._records[p] for p in self._patches if p in self._records]

    def status(self, pid: str) -> Status | None:
        self._declared()
        with self._lock:
            self._decide_all()
            rec = self._records.get(pid)
        return rec.status if rec else None

    def resolve_pending(self, modules: Iterable[str] | None = None,
                        environ: Mapping[str, str] | None = None) -> None:
        """Import the target modules of pending patches (inside a guard) so they resolve.

        A target module that does not exist while its package does (moved or removed
        upstream) makes its pending patches ``target-changed`` (strict mode raises); any
        other import failure (e.g. a missing dependency) leaves them pending with the reason."""
        strict = switches.strict(environ)
        names = modules or sorted({p.target_module for p in self._patches.values()
                                   if self.status(p.id) is Status.PENDING})
        for name in names:
            try:
                importlib.import_module(name)
            except Exception as exc:
                gone = _module_gone(name, exc)
                with self._lock:
                    for patch in self._patches.values():
                        if patch.target_module == name and self.status(patch.id) is Status.PENDING:
                            if gone:
                                self._set(patch, Status.TARGET_CHANGED,
                                          f"target module {name} does not exist ({type(exc).__name__}: {exc}) "
                                          f"although {name.split('.')[0]} is installed: moved or removed upstream")
                                self._maybe_raise(patch, strict)
                            else:
                                self._set(patch, Status.PENDING,
                                          f"target module {name} failed to import: {type(exc).__name__}: {exc}")


def _module_gone(name: str, exc: BaseException) -> bool:
    """Whether importing ``name`` failed because ``name`` itself, or one of its parent packages
    below the top-level one, does not exist in a package that was imported."""
    missing = getattr(exc, "name", None) if isinstance(exc, ModuleNotFoundError) else None
    if not missing or "." not in missing or not (name == missing or name.startswith(missing + ".")):
        return False
    parent = sys.modules.get(missing.rpartition(".")[0])
    return parent is not None and hasattr(parent, "__path__")


REGISTRY = Registry()
register = REGISTRY.register
