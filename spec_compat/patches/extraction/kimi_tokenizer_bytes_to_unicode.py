"""Kimi-K2.5's remote tokenizer code imports a helper that transformers 5 moved.

The checkpoint's ``tokenization_kimi.py`` (as in Moonshot's Kimi-K2/K2.5/Kimi-Linear repositories)
does ``from transformers.models.gpt2.tokenization_gpt2 import bytes_to_unicode``; transformers 5
keeps ``bytes_to_unicode`` in ``convert_slow_tokenizer`` only, so loading the tokenizer with
``trust_remote_code`` fails with ImportError - ``vllm serve`` of Kimi-K2.5 on vLLM >= 0.17 with
transformers 5 dies at startup.  The patch puts the same function back under the old name.
"""

from __future__ import annotations

import importlib
from types import ModuleType

from ...core.proof import Proof
from ...core.registry import Changes, NotNeeded, Patch, TargetChanged, register
from .. import _guards as guard

NAME = "bytes_to_unicode"
HOME = "transformers.convert_slow_tokenizer"


@register
class KimiTokenizerBytesToUnicode(Patch):
    """Kimi-K2.5's remote ``tokenization_kimi.py`` imports ``bytes_to_unicode`` from
    ``transformers.models.gpt2.tokenization_gpt2``, which transformers 5 no longer defines - loud:
    ``ImportError: cannot import name 'bytes_to_unicode'`` when the tokenizer loads (``vllm serve`` of
    Kimi-K2.5 on vLLM >= 0.17, speculators preprocessing)."""

    id = "kimi-tokenizer-bytes-to-unicode"
    proof = Proof("fails", "tests/unit/test_kimi_tokenizer_tf5.py::test_tokenizer_fails_with_only_this_patch_disabled",
                  r"ImportError: cannot import name 'bytes_to_unicode' from 'transformers\.models\.gpt2\.tokenization_gpt2'")
    summary = ("transformers 5: transformers.models.gpt2.tokenization_gpt2.bytes_to_unicode is "
               "transformers.convert_slow_tokenizer's again, for Kimi-K2.5's remote tokenizer code")
    upstream = ("transformers 5.x removed bytes_to_unicode from models/gpt2/tokenization_gpt2.py; Kimi-K2.5's "
                "tokenization_kimi.py imports it there -> ImportError loading the tokenizer")
    # the module that defined bytes_to_unicode next to GPT2Tokenizer (the name itself is what is missing)
    target = "transformers.models.gpt2.tokenization_gpt2:GPT2Tokenizer"
    requires = {"transformers": ">=5.0,<5.20"}
    side = "driver"

    def check(self, module: ModuleType) -> None:
        # still gpt2's byte-level BPE tokenizer module (the name belonged next to it)
        tok = guard.attr(module, "GPT2Tokenizer")
        if not isinstance(tok, type):
            raise TargetChanged("GPT2Tokenizer is no longer a class")
        guard.has_params(tok.__init__, "GPT2Tokenizer.__init__", "vocab", "merges", "errors")
        if hasattr(module, NAME):
            raise NotNeeded(f"{module.__name__} defines {NAME}")
        try:
            home = importlib.import_module(HOME)
        except ImportError as exc:
            raise TargetChanged(f"{HOME} does not import: {exc}") from None
        guard.exact_params(guard.attr(home, NAME), f"{HOME}.{NAME}")
        table = home.bytes_to_unicode()
        if not (isinstance(table, dict) and len(table) == 256 and set(table) == set(range(256))):
            raise TargetChanged(f"{HOME}.{NAME}() no longer maps the 256 byte values")

    def install(self, module: ModuleType, changes: Changes) -> None:
        changes.setattr(module, NAME, importlib.import_module(HOME).bytes_to_unicode)
