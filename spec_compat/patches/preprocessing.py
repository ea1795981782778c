"""Data-preparation patches: speculators' chat preprocessing
(``speculators.data_generation.preprocessing``) with tokenizers it does not expect."""

from __future__ import annotations

import functools
import inspect
import logging
from types import ModuleType
from typing import Any

from ..registry import Changes, Patch, TargetChanged, register
from . import _guards as g

log = logging.getLogger("spec_compat")

PRE = "speculators.data_generation.preprocessing"


@register
class SlowTokenizerOffsets(Patch):
    """speculators' preprocessing (0.3.0 preprocessing.py:218, 0.4.0.1 :310) asks the tokenizer for
    ``return_offsets_mapping``; Python tokenizers such as Kimi-K2.5's tiktoken one raise
    NotImplementedError, which the per-conversation ``except`` turns into a log line:
    every Kimi conversation is dropped and the dataset is silently empty."""

    id = "slow-tokenizer-offsets"
    fixes = ("K6",)
    summary = ("tokenizers without offset support (Python/tiktoken, e.g. Kimi-K2.5) get offsets recovered "
               "by decoding the ids, checked against the text; fast tokenizers unchanged")
    upstream = ("speculators 0.3.0-0.4.x data_generation/preprocessing.py _preprocess_batch: "
                "return_offsets_mapping on a slow tokenizer -> every conversation dropped")
    target = f"{PRE}:_preprocess_batch"
    requires = {"speculators": ">=0.3,<0.5"}

    def check(self, module: ModuleType) -> None:
        fn = g.attr(module, "_preprocess_batch")
        g.has_params(fn, "_preprocess_batch", "examples", "tokenizer")
        try:
            src = inspect.getsource(fn)
        except (OSError, TypeError) as exc:
            raise TargetChanged(f"cannot read _preprocess_batch: {exc}") from None
        if "return_offsets_mapping=True" not in src:
            raise TargetChanged("_preprocess_batch no longer asks for offsets")

    def install(self, module: ModuleType, changes: Changes) -> None:
        from ..shims.offsets import OffsetsTokenizer

        inner = module._preprocess_batch
        names = list(inspect.signature(inner).parameters)

        @functools.wraps(inner)
        def _preprocess_batch(*args: Any, **kwargs: Any) -> Any:
            pos = names.index("tokenizer")
            tok = kwargs["tokenizer"] if "tokenizer" in kwargs else args[pos] if len(args) > pos else None
            if tok is not None and getattr(tok, "is_fast", True) is False:
                wrapped = OffsetsTokenizer(tok)
                if "tokenizer" in kwargs:
                    kwargs["tokenizer"] = wrapped
                else:
                    args = args[:pos] + (wrapped,) + args[pos + 1:]
            return inner(*args, **kwargs)

        changes.setattr(module, "_preprocess_batch", _preprocess_batch)
