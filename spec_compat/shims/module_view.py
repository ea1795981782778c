"""A stand-in for a module (``torch``, ``torch.cuda``, ``torch.distributed``, ...) inside one
consumer: a few attributes replaced, every other one the real module's."""

from __future__ import annotations

from typing import Any


class ModuleView:
    """``ModuleView(real, name=value, ...)``: ``view.name`` is ``value`` for each override, any
    other attribute is looked up on ``real`` at the time of access.  An override may itself be a
    view (``ModuleView(torch, cuda=ModuleView(torch.cuda, mem_get_info=...))``)."""

    def __init__(self, real: Any, /, **overrides: Any) -> None:
        vars(self).update(overrides)
        vars(self)["_real"] = real

    def __getattr__(self, name: str) -> Any:  # only names that are not overrides
        try:
            real = vars(self)["_real"]
        except KeyError:  # not initialised (copy, unpickling): no recursion
            raise AttributeError(name) from None
        return getattr(real, name)

    def __repr__(self) -> str:
        return f"<spec_compat view of {self._real!r}>"
