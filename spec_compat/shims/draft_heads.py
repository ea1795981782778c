"""EAGLE-3 draft heads in other frameworks' formats: which target layers they read, and whether
they fit the target, decided from ``config.json`` and the safetensors headers (no weight is read).

Aux-layer id conventions (N = the target's ``num_hidden_layers``):

* ``input`` -- vLLM and speculators: id i is the *input* of decoder layer i (id N: the last layer's
  output before the final norm).  Where such a checkpoint names its ids: top-level
  ``eagle_aux_hidden_state_layer_ids`` (vLLM's own format, speculators' format).
* ``output`` -- SGLang, TorchSpec, SpecForge: id i is the *output* of decoder layer i, the input of
  layer i + 1 (SGLang captures ``layers_to_capture = [i + 1 for i in ids]``).  Where they name them:
  ``eagle_config.eagle_aux_hidden_state_layer_ids``.

A checkpoint that names no ids is served with the target's defaults, which the two conventions
share (SGLang's ``[1, N//2 - 1, N - 4]`` outputs are vLLM's ``(2, N//2, N - 3)`` inputs).
``SPEC_COMPAT_AUX_IDS`` overrides the guess: ``input`` or ``output`` for whatever ids the checkpoint
names; ``auto`` (or unset) decides by where they are.  The switch is parsed in
``spec_compat.core.switches`` and handed in by the patch (``served_ids(cfg, override)``): this
module reads no environment and imports nothing of spec_compat.
"""

from __future__ import annotations

import json
import struct
from collections.abc import Mapping
from pathlib import Path
from typing import Any

KEY = "eagle_aux_hidden_state_layer_ids"
#: the switch that overrides the convention (named in messages; parsed in spec_compat.core.switches)
VAR = "SPEC_COMPAT_AUX_IDS"
CONVENTIONS = {
    "input": "vLLM / speculators: id i = input of decoder layer i",
    "output": "SGLang / TorchSpec / SpecForge: id i = output of decoder layer i = input of layer i + 1",
}
#: header bytes read at most per safetensors file (a header is JSON of names, dtypes, shapes)
_MAX_HEADER = 64 << 20


class DraftFitError(ValueError):
    """A draft head that cannot serve this target; the message names both sides."""


def _as_dict(cfg: Any) -> Mapping[str, Any]:
    return cfg if isinstance(cfg, Mapping) else vars(cfg)


def named_ids(cfg: Any) -> tuple[list[Any] | None, str]:
    """The ids a draft config names and where: ``("top-level" | "eagle_config" | "none")``."""
    d = _as_dict(cfg)
    top = d.get(KEY)
    if top:
        return list(top), "top-level"
    nested = d.get("eagle_config")
    if isinstance(nested, Mapping) and nested.get(KEY):
        return list(nested[KEY]), "eagle_config"
    return None, "none"


def aux_count(cfg: Any) -> int:
    """How many aux states the draft's ``fc`` fuses (3 where the config names no ids)."""
    ids, _ = named_ids(cfg)
    return len(ids) if ids else 3


def served_ids(cfg: Any, override: str = "auto") -> tuple[tuple[int, ...] | None, str, str]:
    """(ids in vLLM's input convention or None for the target's defaults, the convention assumed,
    where the ids were)."""
    ids, where = named_ids(cfg)
    if ids is None:
        return None, "default", where
    convention = override if override != "auto" else ("output" if where == "eagle_config" else "input")
    if not all(isinstance(i, int) and not isinstance(i, bool) for i in ids):
        raise DraftFitError(f"spec_compat[eagle3-draft-fits-target]: the draft's {KEY} ({where}) = {ids!r} are not all integers")
    return tuple(i + 1 if convention == "output" else i for i in ids), convention, where


def _header(f: Path) -> tuple[dict[str, Any], int]:
    """A safetensors file's header and the offset of its data."""
    with open(f, "rb") as fh:
        raw = fh.read(8)
        if len(raw) != 8:
            raise DraftFitError(f"spec_compat[eagle3-draft-fits-target]: {f} is not a safetensors file (shorter than its header)")
        (size,) = struct.unpack("<Q", raw)
        if size > _MAX_HEADER:
            raise DraftFitError(f"spec_compat[eagle3-draft-fits-target]: {f} declares a {size}-byte header: not a safetensors file")
        try:
            return json.loads(fh.read(size)), 8 + size
        except ValueError as exc:
            raise DraftFitError(f"spec_compat[eagle3-draft-fits-target]: {f}: unreadable safetensors header ({exc})") from None


def tensor_shapes(draft_dir: str | Path) -> dict[str, tuple[int, ...]]:
    """Name -> shape of every tensor in the draft's ``*.safetensors`` files, from their headers."""
    out: dict[str, tuple[int, ...]] = {}
    for f in sorted(Path(draft_dir).glob("*.safetensors")):
        for name, meta in _header(f)[0].items():
            if name != "__metadata__" and isinstance(meta, Mapping):
                out[name] = tuple(int(x) for x in meta.get("shape", ()))
    return out


#: safetensors integer dtypes a d2t is written in -> struct format
_INT_FORMATS = {"I64": "q", "I32": "i", "I16": "h", "I8": "b", "U8": "B"}


def integer_tensor(draft_dir: str | Path, suffix: str) -> list[int] | None:
    """The values of the draft's 1-d integer tensor named ``suffix`` (``d2t``), read from its file
    alone (a few KB; no other weight is read), or None where there is none or it is not integer."""
    for f in sorted(Path(draft_dir).glob("*.safetensors")):
        header, data = _header(f)
        for name, meta in header.items():
            if name == "__metadata__" or not (name == suffix or name.endswith("." + suffix)):
                continue
            fmt = _INT_FORMATS.get(str(meta.get("dtype")))
            start, end = (int(x) for x in meta.get("data_offsets", (0, 0)))
            if fmt is None or len(meta.get("shape", ())) != 1:
                return None
            with open(f, "rb") as fh:
                fh.seek(data + start)
                raw = fh.read(end - start)
            return list(struct.unpack(f"<{len(raw) // struct.calcsize(fmt)}{fmt}", raw))
    return None


def d2t_problems(d2t: list[int] | None, target_vocab: int) -> list[str]:
    """A ``d2t`` (draft token i -> target token i + d2t[i], EAGLE-3's offsets) that names tokens outside
    the target's vocabulary: vLLM indexes the target's logits with it in the first draft step."""
    if not d2t:
        return []
    bad = [(i, i + off) for i, off in enumerate(d2t) if not 0 <= i + off < target_vocab]
    if not bad:
        return []
    i, t = bad[0]
    return [f"the draft's d2t maps {len(bad)} of its {len(d2t)} tokens outside the target's vocabulary of "
            f"{target_vocab} (first: draft token {i} -> target token {t})"]


def _find(shapes: Mapping[str, tuple[int, ...]], suffix: str) -> tuple[str, tuple[int, ...]] | None:
    for name, shape in shapes.items():
        if name == suffix or name.endswith("." + suffix):
            return name, shape
    return None


def fit_problems(draft: Any, shapes: Mapping[str, tuple[int, ...]], *, target_hidden: int, target_vocab: int,
                 target_layers: int, ids: tuple[int, ...] | None, convention: str) -> list[str]:
    """What keeps this head from serving the target, each naming both sides (empty: it fits)."""
    d = _as_dict(draft)
    problems: list[str] = []
    hidden = d.get("hidden_size")
    declared_target = d.get("target_hidden_size")
    n_aux = len(ids) if ids else aux_count(d)
    if declared_target is not None and int(declared_target) != target_hidden:
        problems.append(f"the draft's target_hidden_size is {declared_target}, the target's hidden size is {target_hidden}")
    fc = _find(shapes, "fc.weight")
    if fc is not None and len(fc[1]) == 2 and fc[1][1] != n_aux * target_hidden:
        problems.append(f"the draft's {fc[0]} reads {fc[1][1]} features, the target gives {n_aux} aux layers x "
                        f"hidden size {target_hidden} = {n_aux * target_hidden}")
    elif fc is None and declared_target is None and hidden is not None and int(hidden) != target_hidden:
        problems.append(f"the draft's hidden_size is {hidden} (no target_hidden_size), the target's hidden size is "
                        f"{target_hidden}")
    vocab = d.get("vocab_size")
    if vocab is not None and int(vocab) != target_vocab:
        problems.append(f"the draft's vocab_size is {vocab}, the target's vocabulary is {target_vocab}")
    draft_vocab = int(d.get("draft_vocab_size") or vocab or target_vocab)
    d2t, t2d = _find(shapes, "d2t"), _find(shapes, "t2d")
    if d2t is not None and d2t[1] != (draft_vocab,):
        problems.append(f"the draft's d2t has shape {list(d2t[1])}, its draft_vocab_size is {draft_vocab}")
    if t2d is not None and t2d[1] != (target_vocab,):
        problems.append(f"the draft's t2d has shape {list(t2d[1])}, the target's vocabulary is {target_vocab}")
    if d2t is None and draft_vocab != target_vocab:
        problems.append(f"the draft's draft_vocab_size is {draft_vocab} but it holds no d2t mapping to the target's "
                        f"vocabulary of {target_vocab}")
    head = _find(shapes, "lm_head.weight")
    if head is not None and len(head[1]) == 2 and head[1][0] != draft_vocab:
        problems.append(f"the draft's lm_head has {head[1][0]} rows, its draft vocabulary is {draft_vocab}")
    if ids and convention == "default":
        if len(set(ids)) != len(ids):  # vLLM's (2, N//2, N-3) on a target under 7 layers
            problems.append(f"the draft names no aux layer ids and vLLM's default for a {target_layers}-layer target, "
                            f"{tuple(ids)}, repeats a layer (fewer features than the draft's fc reads): name "
                            f"{n_aux} distinct ids in the draft's config ({KEY}, vLLM's convention)")
    elif ids:
        bad = [i for i in ids if not 0 <= i < target_layers]
        if bad:
            problems.append(f"the draft's aux layer ids {list(ids)} (as served: {convention} convention) include "
                            f"{bad}, outside 0..{target_layers - 1}: a served head reads the inputs of the target's "
                            f"{target_layers} decoder layers")
        if len(set(ids)) != len(ids):
            problems.append(f"the draft's aux layer ids {list(ids)} repeat a layer")
    return problems


def vllm_default_ids(num_layers: int) -> tuple[int, ...]:
    """vLLM's own default aux layers (its Llama-family models): ``(2, N // 2, N - 3)``."""
    return (2, num_layers // 2, num_layers - 3)
