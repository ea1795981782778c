"""slow-tokenizer-offsets (K6): character offsets for tokenizers that cannot return them (Python /
tiktoken ones), in speculators' chat preprocessing (``speculators.data_generation.preprocessing``).

speculators builds its loss mask from ``tokenizer(text, return_offsets_mapping=True)``;
only "fast" (Rust) tokenizers implement that.  Kimi-K2.5's tokenizer is remote-code
tiktoken (a Python ``PreTrainedTokenizer``), which raises NotImplementedError - and
speculators' preprocessing catches it per conversation, so every conversation is
dropped with a log line and the dataset comes out empty.

:func:`offsets_by_decoding` recovers the offsets from the token ids by decoding:
each token's text is appended in turn and must reproduce the input text; where a
token does not decode to whole characters (a multi-byte character split across
tokens) the prefix decode is used instead.  A mismatch is an error, never a guess.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable, Sequence
from types import ModuleType
from typing import Any

from ...core.naming import through
from ...core.proof import Proof
from ...core.registry import Changes, Patch, TargetChanged, register
from .. import _guards as guard

#: speculators' chat preprocessing module
PREPROCESSING = "speculators.data_generation.preprocessing"


#: the name of ``_preprocess_batch``'s tokenizer argument: ``tokenizer`` (0.3-0.5), ``processor`` (0.6-0.7)
TOKENIZER_PARAMS = ("tokenizer", "processor")
#: the chat preprocessing that asks for offsets: speculators 0.3.0 up to 0.7.x (0.8 dropped the offsets)
SPEC_WITH_OFFSETS = ">=0.3,<0.8"


def tokenizer_param(fn: object, where: str) -> str:
    """Which of :data:`TOKENIZER_PARAMS` ``fn`` takes (TargetChanged when none)."""
    names = guard.params(fn, where)
    for name in TOKENIZER_PARAMS:
        if name in names:
            return name
    raise TargetChanged(f"{where} takes neither {' nor '.join(TOKENIZER_PARAMS)} (parameters: {', '.join(names)})")


@register
class SlowTokenizerOffsets(Patch):
    """speculators 0.3.0-0.7.x chat preprocessing (0.4.0.1 preprocessing.py:310, 0.7.0.2 :413
    ``_get_input_ids_loss_mask``) asks the tokenizer for ``return_offsets_mapping``; Python tokenizers
    such as Kimi-K2.5's tiktoken one raise NotImplementedError, which the per-conversation ``except``
    turns into a log line: every Kimi conversation is dropped (0.7: 'No samples remain after preprocessing')."""

    id = "slow-tokenizer-offsets"
    proof = Proof("fails", "tests/unit/test_chat_offsets.py::test_kimi_chats_need_offsets_shim", r"Failed to process conversation \d+(?: \(assistant_pattern=\w+\))?: (?:NotImplementedError: )?return_offset_mapping is not available when using Python tokenizers")
    fixes = ("K6",)
    summary = ("tokenizers without offset support (Python/tiktoken, e.g. Kimi-K2.5) get offsets recovered "
               "by decoding the ids, checked against the text; fast tokenizers unchanged")
    upstream = ("speculators 0.3.0-0.7.x data_generation/preprocessing.py (_preprocess_batch, from 0.6 "
                "_get_input_ids_loss_mask): return_offsets_mapping on a slow tokenizer -> every conversation dropped")
    target = f"{PREPROCESSING}:_preprocess_batch"
    requires = {"speculators": SPEC_WITH_OFFSETS}

    def check(self, module: ModuleType) -> None:
        fn = guard.attr(module, "_preprocess_batch")
        guard.has_params(fn, "_preprocess_batch", "examples")
        tokenizer_param(fn, "_preprocess_batch")
        if "return_offsets_mapping" not in guard.source(module, PREPROCESSING):
            raise TargetChanged(f"{PREPROCESSING} no longer asks for offsets")

    def install(self, module: ModuleType, changes: Changes) -> None:
        inner = module._preprocess_batch
        names = list(inspect.signature(inner).parameters)
        param = tokenizer_param(inner, "_preprocess_batch")
        pos = names.index(param)

        # a plain function, not changes.wrap: speculators hands it (through a lambda) to datasets'
        # map, which hashes and, with num_proc > 1, pickles it - a wrapt proxy does neither
        @functools.wraps(inner)
        def _preprocess_batch(*args: Any, **kwargs: Any) -> Any:
            tok = kwargs[param] if param in kwargs else args[pos] if len(args) > pos else None
            # a Python tokenizer (is_fast False); processors (ProcessorMixin, 0.6+) take their own path
            if tok is not None and getattr(tok, "is_fast", True) is False:
                wrapped = OffsetsTokenizer(tok, SlowTokenizerOffsets.id)
                if param in kwargs:
                    kwargs[param] = wrapped
                else:
                    args = args[:pos] + (wrapped,) + args[pos + 1:]
            with through(SlowTokenizerOffsets.id, "speculators' _preprocess_batch"):
                return inner(*args, **kwargs)

        changes.setattr(module, "_preprocess_batch", _preprocess_batch)


class OffsetsMismatch(ValueError):
    pass


def offsets_by_decoding(text: str, ids: Sequence[int], decode: Callable[[list[int]], str],
                        patch_id: str) -> list[tuple[int, int]]:
    """(start, end) character span of each token of ``ids`` in ``text`` (ids tokenize a prefix of text);
    a mismatch raises :class:`OffsetsMismatch` naming ``patch_id``."""
    offsets: list[tuple[int, int]] = []
    pos = 0
    for i, tok in enumerate(ids):
        piece = decode([int(tok)])
        if "\ufffd" not in piece and text.startswith(piece, pos):
            offsets.append((pos, pos + len(piece)))
            pos += len(piece)
            continue
        # a partial character: the prefix decode says where this token ends
        prefix = decode([int(t) for t in ids[: i + 1]])
        end = len(prefix.rstrip("\ufffd"))
        if not text.startswith(prefix.rstrip("\ufffd"), 0):
            raise OffsetsMismatch(f"spec_compat[{patch_id}]: token {i} (id {tok}) does not decode to the text "
                                  f"at character {pos}")
        offsets.append((pos, max(pos, end)))
        pos = max(pos, end)
    return offsets


class OffsetsTokenizer:
    """A tokenizer that answers ``return_offsets_mapping=True`` by decoding; everything else
    goes to the wrapped tokenizer unchanged."""

    def __init__(self, tokenizer: Any, patch_id: str) -> None:
        self._tokenizer = tokenizer
        self._patch_id = patch_id

    def __call__(self, text: Any, *args: Any, return_offsets_mapping: bool = False, **kwargs: Any) -> Any:
        if not return_offsets_mapping or not isinstance(text, str):
            if return_offsets_mapping:
                kwargs["return_offsets_mapping"] = True
            return self._tokenizer(text, *args, **kwargs)
        enc = self._tokenizer(text, *args, **kwargs)
        ids = enc["input_ids"]
        enc["offset_mapping"] = offsets_by_decoding(text, ids, self._tokenizer.decode, self._patch_id)
        return enc

    def __getattr__(self, name: str) -> Any:
        return getattr(self._tokenizer, name)
