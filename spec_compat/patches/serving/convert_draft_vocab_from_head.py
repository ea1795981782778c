"""``speculators convert --algorithm eagle3`` of a published full-vocabulary head (S3 in
docs/failures.md): the head's config names no ``draft_vocab_size`` (TorchSpec's
``kimi_k25_eagle3.json`` does not) and speculators builds a 32000-token LM head for it."""

from __future__ import annotations

import logging
from pathlib import Path
from types import ModuleType
from typing import Any

from ...core.proof import Proof
from ...core.registry import Changes, Patch, TargetChanged, register
from .. import _guards as guard

log = logging.getLogger("spec_compat")

CONVERTER = "speculators.convert.eagle.eagle3_converter"


@register
class ConvertDraftVocabFromHead(Patch):
    """speculators >=0.3 ``convert/eagle/eagle3_converter.py`` ``_build_eagle3_speculator_config``:
    ``draft_vocab_size=eagle_config.get("draft_vocab_size", 32000)`` -- a head without that key
    fails to load its own weights: "size mismatch for lm_head.weight ... [32000, H]"."""

    id = "convert-draft-vocab-from-head"
    proof = Proof("fails", "tests/engine/test_published_heads.py::test_stock_convert_needs_the_patch",
                  r"size mismatch for lm_head\.weight: copying a param with shape\s+torch\.Size\(\[512, 256\]\) from "
                  r"checkpoint, the shape in current model is\s+torch\.Size\(\[32000, 256\]\)", using="kimi-k25")
    summary = ("speculators convert reads a head's draft vocabulary size from its lm_head (safetensors header) "
               "where its config.json names none")
    upstream = "speculators >=0.3 convert/eagle/eagle3_converter.py: draft_vocab_size defaults to 32000 (S3)"
    fixes = ("S3",)
    target = f"{CONVERTER}:load_checkpoint_config"
    requires = {"speculators": ">=0.3,<0.10"}
    side = "driver"

    def check(self, module: ModuleType) -> None:
        fn = guard.attr(module, "load_checkpoint_config")
        names = list(guard.params(fn, f"{CONVERTER}.load_checkpoint_config"))
        if names != ["checkpoint_dir"]:
            raise TargetChanged(f"load_checkpoint_config takes ({', '.join(names)}), expected (checkpoint_dir)")
        conv = guard.attr(module, "Eagle3Converter")
        src = guard.source(conv, "Eagle3Converter")
        if 'eagle_config.get("draft_vocab_size", 32000)' not in src:
            raise TargetChanged("Eagle3Converter no longer defaults draft_vocab_size to 32000")
        if "load_checkpoint_config(" not in src:
            raise TargetChanged("Eagle3Converter no longer reads the config through load_checkpoint_config")

    def install(self, module: ModuleType, changes: Changes) -> None:
        def load_checkpoint_config(wrapped: Any, instance: Any, args: tuple, kwargs: dict) -> Any:
            cfg = wrapped(*args, **kwargs)
            path = args[0] if args else kwargs.get("checkpoint_dir")
            if isinstance(cfg, dict) and "draft_vocab_size" not in cfg and path is not None:
                rows = _head_rows(Path(path))
                if rows is not None:
                    log.info("spec_compat[%s]: %s names no draft_vocab_size; its lm_head has %d rows: using %d",
                             ConvertDraftVocabFromHead.id, path, rows, rows)
                    cfg = dict(cfg, draft_vocab_size=rows)
            return cfg

        changes.wrap(module, "load_checkpoint_config", load_checkpoint_config)


def _head_rows(path: Path) -> int | None:
    from ...shims.draft_heads import tensor_shapes

    if not path.is_dir():
        return None
    for name, shape in tensor_shapes(path).items():
        if name.endswith("lm_head.weight") and len(shape) == 2:
            return shape[0]
    return None
