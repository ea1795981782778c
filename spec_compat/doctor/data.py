"""Reading a sample of a draft's training data, in the layouts the stock pipelines write, without
touching the rest of it (and never writing into it).

* speculators >= 0.5 (``prepare-data`` + offline rows): a ``datasets`` directory (``input_ids``,
  ``loss_mask``) beside ``hidden_states/hs_{i}.safetensors`` (``hidden_states`` [T, L, H], the last of
  the L being the target's last layer before the final norm; ``token_ids`` [T]);
* speculators 0.3 / 0.4 (``data_generation_offline.py``): ``data_{i}.pt`` (``input_ids``,
  ``hidden_states`` a list of [T, H], ``loss_mask``) and ``data_config.json`` (the captured layer ids).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any


class DataError(ValueError):
    """The data directory cannot be read as training data (the message names the file)."""


@dataclass
class Sample:
    """One training sample: ``rows`` [R, L, H] (float32; R may differ from the tokens when the data is
    broken), the token ids the rows were saved with, the dataset's ids and loss mask."""

    index: int
    input_ids: list[int]
    loss_mask: list[int]
    rows: Any
    row_token_ids: list[int] | None = None
    source: str = ""


@dataclass
class DataSample:
    layout: str
    directory: Path
    total: int
    samples: list[Sample] = field(default_factory=list)
    layer_ids: list[int] | None = None  # what the data's metadata says it captured (0.3 / 0.4)
    token_freq: dict[int, int] | None = None


def _indices(total: int, n: int) -> list[int]:
    """The first ``n`` samples: the defects of a generator call show from its second sample on."""
    return list(range(min(n, total)))


def _natural(p: Path) -> int:
    m = re.search(r"(\d+)", p.stem)
    return int(m.group(1)) if m else -1


def read_sample(directory: str | Path, n: int = 6) -> DataSample:
    """``n`` samples of the data in ``directory`` (either layout), or :class:`DataError`."""
    import torch

    d = Path(directory)
    if not d.is_dir():
        raise DataError(f"data directory {str(d)!r} does not exist")
    freq_file = d / "token_freq.pt"
    token_freq = None
    if freq_file.is_file():
        try:
            token_freq = {int(k): int(v) for k, v in torch.load(freq_file, weights_only=True).items()}
        except Exception as exc:  # noqa: BLE001 - a bad side file is named, the rows can still be read
            raise DataError(f"{freq_file}: not a token-frequency dict ({exc})") from None
    if (d / "hidden_states").is_dir() and (d / "dataset_info.json").is_file():
        return _read_offline(d, n, token_freq)
    pts = sorted(d.glob("data_*.pt"), key=_natural)
    if pts or (d / "data_config.json").is_file():
        return _read_pt(d, pts, n, token_freq)
    if not any(d.iterdir()):  # speculators 0.3 / 0.4 with no sample to generate: the directory, nothing in it
        return DataSample("empty", d, 0)
    raise DataError(f"{str(d)!r} holds neither a dataset with hidden_states/ (speculators >= 0.5) nor data_*.pt "
                    "files (speculators 0.3 / 0.4)")


def _read_offline(d: Path, n: int, token_freq: dict[int, int] | None) -> DataSample:
    from datasets import load_from_disk
    from safetensors import safe_open

    try:
        ds = load_from_disk(str(d))
    except Exception as exc:  # noqa: BLE001
        raise DataError(f"{d}: the dataset cannot be loaded ({exc})") from None
    out = DataSample("offline (speculators >= 0.5)", d, len(ds), token_freq=token_freq)
    for i in _indices(len(ds), n):
        f = d / "hidden_states" / f"hs_{i}.safetensors"
        if not f.is_file():
            raise DataError(f"{f} is missing (the dataset has {len(ds)} samples)")
        with safe_open(str(f), framework="pt") as h:
            rows = h.get_tensor("hidden_states").float()
            ids = h.get_tensor("token_ids").tolist() if "token_ids" in h.keys() else None
        if rows.dim() != 3:
            raise DataError(f"{f}: hidden_states has shape {list(rows.shape)}, not [tokens, layers, hidden]")
        row = ds[i]
        out.samples.append(Sample(i, [int(x) for x in row["input_ids"]], [int(x) for x in row["loss_mask"]],
                                  rows, ids, str(f)))
    return out


def _read_pt(d: Path, pts: list[Path], n: int, token_freq: dict[int, int] | None) -> DataSample:
    import torch

    layer_ids = None
    cfg = d / "data_config.json"
    if cfg.is_file():
        try:
            meta = json.loads(cfg.read_text())
            layer_ids = list(meta.get("hidden_states", {}).get("layer_ids") or []) or None
        except (OSError, ValueError, AttributeError) as exc:
            raise DataError(f"{cfg}: not readable JSON ({exc})") from None
    out = DataSample("data_*.pt (speculators 0.3 / 0.4)", d, len(pts), layer_ids=layer_ids, token_freq=token_freq)
    for f in pts[:n]:
        try:
            obj = torch.load(f, weights_only=True)
            hs = obj["hidden_states"]
            rows = torch.stack([h.float() for h in hs], dim=1) if isinstance(hs, (list, tuple)) else hs.float()
            ids = [int(x) for x in obj["input_ids"]]
            mask = obj.get("loss_mask")
            mask = [int(x) for x in mask] if mask is not None else [1] * len(ids)
        except Exception as exc:  # noqa: BLE001
            raise DataError(f"{f}: not a speculators sample ({exc})") from None
        out.samples.append(Sample(_natural(f), ids, mask, rows, ids, str(f)))
    return out
