"""What speculators' training code sees in place of its local rank, ``torch``,
``torch.distributed`` and ``torch.optim`` where the stock objects assume CUDA or NCCL."""

from __future__ import annotations

from types import ModuleType
from typing import Any


class CpuRank(str):
    """The local rank as the stock script and Trainer use it on a machine without CUDA:
    a device name (``torch.device(r)``, ``.to(r)`` -> "cpu") that still compares equal
    to its rank number (the batch sampler's ``rank == bin.rank``, ``local_rank == 0``)."""

    rank: int

    def __new__(cls, rank: int) -> "CpuRank":
        obj = super().__new__(cls, "cpu")
        obj.rank = int(rank)
        return obj

    def __eq__(self, other: object) -> bool:
        if isinstance(other, int) and not isinstance(other, bool):
            return other == self.rank
        return str.__eq__(self, other)

    def __ne__(self, other: object) -> bool:
        return not self.__eq__(other)

    __hash__ = str.__hash__

    def __repr__(self) -> str:
        return f"CpuRank({self.rank})"


class TorchLoadView:
    """``torch`` as checkpointer.py sees it: ``load(map_location="cuda:0")`` without CUDA loads to cpu."""

    def __init__(self, torch: ModuleType) -> None:
        self._torch = torch

    def load(self, *args: Any, **kwargs: Any) -> Any:
        loc = kwargs.get("map_location")
        if isinstance(loc, str) and loc.startswith("cuda") and not self._torch.cuda.is_available():
            kwargs["map_location"] = "cpu"
        return self._torch.load(*args, **kwargs)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._torch, name)


class DistView:
    """``torch.distributed`` as trainer.py sees it: ``reduce(op=AVG)``, which gloo lacks, is a SUM
    followed by a division on the destination rank when the backend is gloo."""

    def __init__(self, dist: ModuleType) -> None:
        self._dist = dist

    def reduce(self, tensor: Any, dst: int = 0, op: Any = None, *args: Any, **kwargs: Any) -> Any:
        d = self._dist
        if op is not None and op == d.ReduceOp.AVG and d.get_backend() == "gloo":
            out = d.reduce(tensor, dst, d.ReduceOp.SUM, *args, **kwargs)
            if d.get_rank() == dst:
                tensor.div_(d.get_world_size())
            return out
        if op is None:
            return d.reduce(tensor, dst, *args, **kwargs)
        return d.reduce(tensor, dst, op, *args, **kwargs)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._dist, name)


class _FusedAdamWOptim:
    """``torch.optim`` whose AdamW defaults to ``fused=True``."""

    def __init__(self, optim: Any) -> None:
        self._optim = optim

    def AdamW(self, *args: Any, **kwargs: Any) -> Any:  # noqa: N802 - torch's name
        kwargs.setdefault("fused", True)
        return self._optim.AdamW(*args, **kwargs)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._optim, name)


class TorchFusedAdamWView:
    """``torch`` as trainer.py's setup_optimizer sees it on one CUDA device: AdamW is fused."""

    def __init__(self, torch: ModuleType) -> None:
        self._torch = torch
        self.optim = _FusedAdamWOptim(torch.optim)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._torch, name)
