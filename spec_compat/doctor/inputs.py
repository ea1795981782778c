"""What the doctor's checks read (the target, the draft, a sample of the data), each loaded once and
only when a check asks for it; never written to."""

from __future__ import annotations

import json
from collections.abc import Callable, Hashable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .findings import Skip


@dataclass
class Inputs:
    """What the checks read, loaded once and only when a check asks for it."""

    target: Path
    draft: Path
    data: Path | None = None
    samples: int = 6
    prompts: str | None = None  # the measured check: held-out prompts served through vLLM
    k: int = 3
    max_tokens: int = 64
    baseline: float | None = None  # a clean draft's mean acceptance length on those prompts
    _cache: dict[Hashable, Any] = field(default_factory=dict, repr=False)

    def _once(self, key: Hashable, load: Callable[[], Any]) -> Any:
        if key not in self._cache:
            self._cache[key] = load()
        return self._cache[key]

    def draft_config(self) -> dict[str, Any]:
        return self._once("draft_config", lambda: _json(self.draft / "config.json", "draft"))

    def target_text_config(self) -> dict[str, Any]:
        def load() -> dict[str, Any]:
            cfg = _json(self.target / "config.json", "target")
            return cfg.get("text_config") or cfg
        return self._once("target_config", load)

    def tokenizer(self) -> Any:
        def load() -> Any:
            from transformers import AutoTokenizer
            return AutoTokenizer.from_pretrained(str(self.target))
        return self._once("tokenizer", load)

    def target_model(self) -> Any:
        def load() -> Any:
            from ..verify.reference import load_reference_model
            return load_reference_model(self.target)
        return self._once("model", load)

    def target_states(self, ids: list[int]) -> dict[str, Any]:
        """The target's states for ``ids`` (:func:`spec_compat.doctor.rows.target_states`), computed once."""
        def load() -> dict[str, Any]:
            from .rows import target_states
            return target_states(self.target_model(), ids)
        return self._once(("states", tuple(ids)), load)

    def data_sample(self) -> Any:
        if self.data is None:
            raise Skip("no --data given")

        def load() -> Any:
            from .data import DataError, read_sample
            try:
                return read_sample(self.data, self.samples)
            except DataError as exc:
                raise Skip(str(exc)) from None
        return self._once("data", load)


def _json(path: Path, what: str) -> dict[str, Any]:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise Skip(f"the {what}'s {path} is not readable: {exc}") from None
