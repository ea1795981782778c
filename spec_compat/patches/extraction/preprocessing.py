"""Data-preparation patches: speculators' chat preprocessing
(``speculators.data_generation.preprocessing``) with tokenizers it does not expect."""

from __future__ import annotations

import functools
import inspect
import logging
from types import ModuleType
from typing import Any

from ...core.naming import through
from ...core.proof import Proof
from ...core.registry import Changes, Patch, TargetChanged, register
from ...shims.device import accelerator_available
from .. import _guards as guard
from ..ranges import SPEC_04

log = logging.getLogger("spec_compat")

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
        from ...shims.offsets import OffsetsTokenizer

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


CONFIG_GEN = "speculators.data_generation.config_generator"


@register
class DeviceNameWithoutAccelerator(Patch):
    """speculators 0.4.x writes its data_config.json metadata with ``get_device_name(0)``
    (config_generator.py ``_get_gpu_info`` -> utils/util.py), which trusts
    ``torch.accelerator.current_accelerator()``: a CUDA build of torch names 'cuda' even with
    no GPU, and ``torch.cuda.get_device_name`` raises 'no NVIDIA driver' after extraction."""

    id = "device-name-without-accelerator"
    proof = Proof("fails", "tests/engine/test_training.py::test_data_config_metadata_without_accelerator_needs_shim", r"in _get_gpu_info\n(?:  .*\n)*RuntimeError: Found no NVIDIA driver on your system")
    fixes = ("F2",)
    summary = ("the data-generation metadata names the device 'NO ACCELERATOR' (speculators' own value, "
               "recorded as 'CPU ONLY') when torch has no usable accelerator; with one unchanged")
    upstream = ("speculators 0.4.x data_generation/config_generator.py _get_gpu_info -> utils/util.py "
                "get_device_name(0) -> torch.cuda init error on a CUDA build without GPU")
    target = f"{CONFIG_GEN}:get_device_name"
    requires = {"speculators": SPEC_04}

    def check(self, module: ModuleType) -> None:
        guard.has_params(guard.attr(module, "get_device_name"), f"{CONFIG_GEN}.get_device_name", "idx")

    def install(self, module: ModuleType, changes: Changes) -> None:
        def get_device_name(wrapped: Any, _instance: Any, args: tuple, kwargs: dict) -> str:
            if not accelerator_available():
                return "NO ACCELERATOR"
            return wrapped(*args, **kwargs)

        changes.wrap(module, "get_device_name", get_device_name)
