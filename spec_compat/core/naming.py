"""Errors that say which patch they passed through: ``spec_compat[<patch-id>]``.

spec-compat's own errors carry ``spec_compat[<patch-id>]`` in their message.  An exception
raised by upstream code that a patch wraps (the original function a shim calls) keeps its
type, its message and its traceback - callers that catch it or read ``str(exc)`` see exactly
what upstream raised - and gets a note (``BaseException.add_note``, shown under the
traceback; ``__notes__`` on Python 3.10) naming each patch it went through.
"""

from __future__ import annotations

from collections.abc import Iterable
from types import TracebackType


def note_through(exc: BaseException, patch_ids: str | Iterable[str], what: str = "") -> BaseException:
    """Add ``raised through spec_compat[<id>] (<what>)`` to ``exc`` for each id that neither
    its message nor an earlier note names already; returns ``exc``."""
    ids = [patch_ids] if isinstance(patch_ids, str) else list(patch_ids)
    try:
        text = str(exc)
    except Exception:  # a broken __str__ is upstream's; the note still goes on
        text = ""
    notes = list(getattr(exc, "__notes__", None) or [])
    new = [i for i in ids if f"spec_compat[{i}]" not in text and not any(f"spec_compat[{i}]" in n for n in notes)]
    if not new:
        return exc
    note = "raised through " + ", ".join(f"spec_compat[{i}]" for i in new) + (f" ({what})" if what else "")
    if hasattr(exc, "add_note"):
        exc.add_note(note)
    else:  # Python 3.10: the attribute add_note would fill
        try:
            exc.__notes__ = [*notes, note]  # type: ignore[attr-defined]
        except (AttributeError, TypeError):
            pass
    return exc


class through:
    """``with through(patch_id, what): return original(...)``: an ``Exception`` leaving the
    block gets :func:`note_through` and propagates unchanged (``BaseException``s such as
    ``KeyboardInterrupt`` are left alone)."""

    __slots__ = ("patch_ids", "what")

    def __init__(self, patch_ids: str | Iterable[str], what: str = "") -> None:
        self.patch_ids = patch_ids
        self.what = what

    def __enter__(self) -> through:
        return self

    def __exit__(self, typ: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> bool:
        if isinstance(exc, Exception):
            note_through(exc, self.patch_ids, self.what)
        return False
