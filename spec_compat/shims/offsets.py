"""K6: character offsets for tokenizers that cannot return them (Python / tiktoken ones).

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

from collections.abc import Callable, Sequence
from typing import Any


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
