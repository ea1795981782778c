"""T1 on transformers >= 5.24: ``transformers.modeling_attn_mask_utils`` is gone.

speculators 0.3.x/0.4.x ``models/eagle.py`` (the EAGLE-1/HASS speculator, which
``import speculators`` auto-imports) does
``from transformers.modeling_attn_mask_utils import _prepare_4d_causal_attention_mask``.
Without that module ``import speculators`` itself fails, whatever model is trained.

:class:`StandInFinder` serves a stand-in module under the removed name only when
no other finder finds the real one (it sits last on ``sys.meta_path``), holding
:func:`prepare_4d_causal_attention_mask`: the same mask contract, written here.
"""

from __future__ import annotations

import importlib.abc
import importlib.util
import sys
from collections.abc import Callable
from types import ModuleType
from typing import Any

from ...core.proof import Proof, T1_STEPS
from ...core.registry import Changes, Patch, TargetChanged, register
from ._transformers5 import SPEC_T1


def prepare_4d_causal_attention_mask(
    attention_mask: Any,
    input_shape: Any,
    inputs_embeds: Any,
    past_key_values_length: int,
    sliding_window: int | None = None,
) -> Any:
    """Additive 4-D attention mask ``(batch, 1, query_len, past + query_len)`` in
    ``inputs_embeds``' dtype and device: 0 where a query may attend a key, the dtype's
    minimum where it may not.

    Query ``i`` sits at absolute position ``past_key_values_length + i``; it may attend
    key ``j`` when ``j`` is not after it, when ``j`` is at most ``sliding_window``
    positions back (if given), and when the 2-D padding ``attention_mask`` (batch, keys)
    is non-zero at ``j``.  A 4-D 0/1 mask of the full shape is turned into the additive
    form as it is.  ``attention_mask=None`` gives the causal (windowed) mask alone.
    """
    import torch

    batch, query_len = int(input_shape[0]), int(input_shape[-1])
    key_len = int(past_key_values_length) + query_len
    dtype, device = inputs_embeds.dtype, inputs_embeds.device
    lowest = torch.finfo(dtype).min
    full = (batch, 1, query_len, key_len)

    if attention_mask is not None and attention_mask.dim() == 4:
        if tuple(attention_mask.shape) != full:
            raise ValueError(f"4-D attention mask should be of shape {full}, got {tuple(attention_mask.shape)}")
        blocked = attention_mask.to(dtype) == 0
        return torch.zeros(full, dtype=dtype, device=device).masked_fill(blocked.to(device), lowest)

    query_pos = torch.arange(query_len, device=device).unsqueeze(1) + int(past_key_values_length)
    key_pos = torch.arange(key_len, device=device).unsqueeze(0)
    allowed = key_pos <= query_pos
    if sliding_window is not None:
        allowed = allowed & (query_pos - key_pos <= int(sliding_window))
    allowed = allowed.view(1, 1, query_len, key_len).expand(full)
    if attention_mask is not None:
        if tuple(attention_mask.shape) != (batch, key_len):
            raise ValueError(
                f"2-D attention mask should be of shape {(batch, key_len)} "
                f"(batch, past + query length), got {tuple(attention_mask.shape)}"
            )
        allowed = allowed & attention_mask.to(device=device).ne(0).view(batch, 1, 1, key_len)
    return torch.zeros(full, dtype=dtype, device=device).masked_fill(~allowed, lowest)


class StandInFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Serves module ``name`` (filled by ``populate``) to an import that no other
    finder answered.  Append it to ``sys.meta_path``; :meth:`remove` undoes it."""

    def __init__(self, name: str, populate: Callable[[ModuleType], None]) -> None:
        self.name = name
        self.populate = populate

    def find_spec(self, fullname: str, path: Any = None, target: Any = None) -> Any:
        if fullname != self.name:
            return None
        return importlib.util.spec_from_loader(fullname, self, origin="spec-compat stand-in")

    def create_module(self, spec: Any) -> None:
        return None  # the default module

    def exec_module(self, module: ModuleType) -> None:
        self.populate(module)

    def served(self) -> ModuleType | None:
        """The module this finder made, if it is still the imported one."""
        module = sys.modules.get(self.name)
        spec = getattr(module, "__spec__", None)
        return module if spec is not None and spec.loader is self else None

    def remove(self) -> None:
        """Leave ``sys.meta_path``; forget the served module (and its parent's attribute)."""
        if self in sys.meta_path:
            sys.meta_path.remove(self)
        module = self.served()
        if module is None:
            return
        del sys.modules[self.name]
        parent_name, _, child = self.name.rpartition(".")
        parent = sys.modules.get(parent_name) if parent_name else None
        if parent is not None and getattr(parent, child, None) is module:
            delattr(parent, child)

    def __repr__(self) -> str:
        return f"<spec_compat stand-in finder for {self.name}>"


ATTN_MASK_UTILS = "transformers.modeling_attn_mask_utils"


def _populate_attn_mask_utils(module: ModuleType) -> None:
    module.__doc__ = ("spec-compat stand-in for the module transformers 5.24 removed: only "
                      "_prepare_4d_causal_attention_mask, which speculators < 0.5 imports")
    module._prepare_4d_causal_attention_mask = prepare_4d_causal_attention_mask  # type: ignore[attr-defined]


@register
class AttnMaskUtilsModule(Patch):
    """transformers 5.24 removed ``modeling_attn_mask_utils``; speculators 0.3.x/0.4.x
    ``models/eagle.py:24`` imports ``_prepare_4d_causal_attention_mask`` from it and
    ``import speculators`` auto-imports that module -> ModuleNotFoundError."""

    id = "attn-mask-utils-module"
    proof = Proof("fails", T1_STEPS, r"ModuleNotFoundError: No module named 'transformers.modeling_attn_mask_utils'", using="import")
    fixes = ("T1",)
    summary = ("transformers.modeling_attn_mask_utils importable again (only when transformers lacks it), "
               "with a _prepare_4d_causal_attention_mask of the same mask contract")
    upstream = ("transformers 5.24 removed modeling_attn_mask_utils; speculators models/eagle.py:24 imports it "
                "-> import speculators: ModuleNotFoundError")
    target = "transformers:__version__"  # the package: the stand-in is served from then on
    requires = {"speculators": SPEC_T1, "transformers": ">=5.24"}

    def check(self, module: ModuleType) -> None:
        try:
            spec = importlib.util.find_spec(ATTN_MASK_UTILS)
        except (ImportError, ValueError) as exc:
            raise TargetChanged(f"cannot look up {ATTN_MASK_UTILS}: {exc}") from None
        if spec is not None:
            raise TargetChanged(f"transformers ships {ATTN_MASK_UTILS} ({spec.origin})")

    def install(self, module: ModuleType, changes: Changes) -> None:
        finder = StandInFinder(ATTN_MASK_UTILS, _populate_attn_mask_utils)
        # what `import transformers.modeling_attn_mask_utils` gives: touched as that sys.modules item,
        # so another patch serving the name (Changes.setitem on sys.modules) must declare its order
        changes.call(sys.modules, ATTN_MASK_UTILS, lambda: sys.meta_path.append(finder), finder.remove,
                     label=f"sys.modules[{ATTN_MASK_UTILS!r}] (served by a sys.meta_path finder)")
