"""What a demo run produced (:class:`DemoResult`) and the two steps both demos end with: the saved
draft reloaded with speculators' loader, and the registry's report (``spec-compat demo``, tiny fixtures
in :mod:`.demo`, the real model in :mod:`.demo_real`)."""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

log = logging.getLogger("spec_compat")


@dataclass
class DemoResult:
    out: Path
    model_dir: Path
    data_dir: Path
    draft_dir: Path
    samples: int = 0
    tokens: int = 0
    layer_ids: list[int] = field(default_factory=list)
    aux_layer_ids: list[int] | None = None
    losses: list[float] = field(default_factory=list)
    val_losses: list[float] = field(default_factory=list)
    timings: dict[str, float] = field(default_factory=dict)
    regenerated: dict[str, int] | None = None
    evaluation: dict[str, Any] | None = None
    #: why the serving step did not run (vLLM without speculative decoding on this platform)
    evaluation_skipped: str | None = None
    #: patch statuses counted (``report``) and the ids applied in this process
    patches: dict[str, Any] | None = None
    #: the log file of the run (None with ``--verbose``)
    log: Path | None = None

    def as_dict(self) -> dict[str, Any]:
        d = dict(self.__dict__)
        for k in ("out", "model_dir", "data_dir", "draft_dir", "log"):
            d[k] = None if d[k] is None else str(d[k])
        return d


def reload_draft(draft_dir: Path) -> tuple[Path, list[int] | None]:
    """The last epoch's draft under ``draft_dir`` reloaded with speculators' loader: (its directory,
    its ``eagle_aux_hidden_state_layer_ids``)."""
    from speculators.models.eagle3 import Eagle3DraftModel

    last = max((d for d in draft_dir.iterdir() if d.name.isdigit()), key=lambda d: int(d.name))
    draft = Eagle3DraftModel.from_pretrained(str(last))
    return last, draft.config.eagle_aux_hidden_state_layer_ids


def patch_report() -> dict[str, Any]:
    """The registry's statuses counted, and the ids applied in this process (logged too)."""
    from .report import report_data

    data = report_data()
    counts: dict[str, int] = {}
    for r in data["patches"]:
        counts[r["status"]] = counts.get(r["status"], 0) + 1
    applied = [r["id"] for r in data["patches"] if r["status"] == "applied"]
    log.info("patches: %s; applied here: %s", counts, ", ".join(applied))
    return {"counts": counts, "applied": applied}
