"""The rows check: a sample of the training rows against a fresh transformers forward of the target.

For every layer slot of the rows it finds which state of the target the slot holds (the input of
decoder layer l, the last layer's output before the final norm, or after it), and for every row
whether it is the state of its own token, of another position of the same sequence (and how far:
multiples of the 16-token KV block point at prefix caching) or of no position of it (another
sequence's rows).  Rows are compared by cosine similarity: the same state saved in bf16 scores above
0.999, a state of another position or layer well below :data:`SAME`.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

#: cosine at or above which a saved row is taken for the reference state
SAME = 0.99
#: tokens of each sample compared (a longer sample is cut: the forward runs on CPU)
MAX_TOKENS = 384


@dataclass
class SlotFinding:
    slot: int
    holds: str  # "input:L", "prenorm", "postnorm" or "unknown"
    cosine: float


@dataclass
class RowsFinding:
    samples: int = 0
    rows: int = 0
    own: int = 0  # rows equal to their own token's state
    shifted: Counter = field(default_factory=Counter)  # shift (rows) -> count
    foreign: int = 0  # rows matching no position of the sequence
    short: list[tuple[int, int, int]] = field(default_factory=list)  # (sample, rows, tokens)
    ids_differ: list[int] = field(default_factory=list)  # samples whose rows were saved for other tokens
    slots: list[SlotFinding] = field(default_factory=list)
    # rows of the deepest slot that are no state of their own sequence but one of another sampled sequence
    other_sequences: int = 0


def target_states(model: Any, ids: list[int]) -> dict[str, Any]:
    """name -> [T, H] float32 states of the target for ``ids``: ``input:L`` (the input of decoder layer L),
    ``prenorm`` / ``postnorm`` (the last layer's output before / after the final norm)."""
    import torch

    from ..verify.reference import decoder_layers, layer_states

    n = len(decoder_layers(model))
    taps = [(i, "input") for i in range(n)] + [(n - 1, "output")]
    states = layer_states(model, ids, taps)
    out = {f"input:{i}": states[i].float() for i in range(n)}
    out["prenorm"] = states[n].float()
    norm = getattr(getattr(model, "model", model), "norm", None)
    if norm is not None:
        with torch.no_grad():
            out["postnorm"] = norm(states[n].unsqueeze(0))[0].float()
    return out


def _unit(x: Any) -> Any:
    return x / x.norm(dim=-1, keepdim=True).clamp_min(1e-12)


def compare(states: Callable[[list[int]], dict[str, Any]], samples: list[Any]) -> RowsFinding:
    """The rows of ``samples`` (:class:`spec_compat.doctor.data.Sample`) against the target's states
    (``states(ids)``, as :func:`target_states` gives them)."""
    import torch

    f = RowsFinding()
    # the last layer's state of every sampled sequence: a row of none of its own positions may be another's
    pool = [_unit(states(list(s.row_token_ids or s.input_ids)[:MAX_TOKENS])["prenorm"]) for s in samples
            if len(s.row_token_ids or s.input_ids) and s.rows.shape[0]]
    pool_all = torch.cat(pool) if pool else None
    per_slot: dict[int, Counter] = {}
    cos_slot: dict[int, list[float]] = {}
    for s in samples:
        ids = list(s.row_token_ids or s.input_ids)[:MAX_TOKENS]
        if s.row_token_ids is not None and list(s.row_token_ids) != list(s.input_ids):
            f.ids_differ.append(s.index)
        rows = s.rows[:MAX_TOKENS]
        r, t = rows.shape[0], len(ids)
        if s.rows.shape[0] < len(s.row_token_ids or s.input_ids):
            f.short.append((s.index, int(s.rows.shape[0]), len(s.row_token_ids or s.input_ids)))
        if r == 0 or t == 0:
            continue
        cands = states(ids)
        names = list(cands)
        ref = _unit(torch.stack([cands[k] for k in names]))  # [C, T, H]
        f.samples += 1
        placed = None
        for slot in range(rows.shape[1]):
            sims = torch.einsum("rh,cth->crt", _unit(rows[:, slot]), ref)  # [C, R, T]
            row_best = sims.max(dim=2).values  # [C, R]: each row's best match among a candidate's states
            # the state a slot holds: the candidate that explains the most rows (at any position: rows
            # out of place still show which layer they were taken at)
            hits = (row_best >= SAME).sum(dim=1)
            c = int(hits.argmax())
            per_slot.setdefault(slot, Counter())[names[c] if int(hits[c]) >= max(1, 0.3 * r) else "unknown"] += 1
            cos_slot.setdefault(slot, []).append(float(row_best[c].median()))
            if slot == rows.shape[1] - 1:  # rows placed by the deepest slot: its states differ per position
                placed = (sims[c], r, t)
                if pool_all is not None:
                    own = sims[names.index("prenorm")].max(dim=1).values if "prenorm" in names else None
                    anywhere = (_unit(rows[:, slot]) @ pool_all.T).max(dim=1).values
                    f.other_sequences += int(((anywhere >= SAME) & ((own < SAME) if own is not None else True)).sum())
        if placed is None:
            continue
        sim, r, t = placed
        val, pos = sim.max(dim=1)
        for row in range(r):
            f.rows += 1
            if row < t and float(sim[row, row]) >= SAME:
                f.own += 1
            elif float(val[row]) < SAME:
                f.foreign += 1
            elif int(pos[row]) == row:
                f.own += 1
            else:
                f.shifted[int(pos[row]) - row] += 1
    for slot, counts in sorted(per_slot.items()):
        holds, _ = counts.most_common(1)[0]
        f.slots.append(SlotFinding(slot, holds, round(sum(cos_slot[slot]) / len(cos_slot[slot]), 4)))
    return f


def describe(holds: str) -> str:
    if holds.startswith("input:"):
        i = int(holds.split(":")[1])
        return f"the input of layer {i}" + (f" (the output of layer {i - 1})" if i else " (the embeddings)")
    return {"prenorm": "the last layer's output before the final norm",
            "postnorm": "the last layer's output after the final norm", "unknown": "no state of the target"}[holds]
