"""What speculators' training code sees in place of its local rank, ``torch``,
``torch.distributed`` and ``torch.optim`` where the stock objects assume CUDA or NCCL."""

from __future__ import annotations

from types import ModuleType
from typing import Any

from .module_view import ModuleView


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


def TorchLoadView(torch: ModuleType) -> ModuleView:  # noqa: N802 - the view's name
    """``torch`` as checkpointer.py sees it: ``load(map_location="cuda:0")`` without CUDA loads to cpu."""

    def load(*args: Any, **kwargs: Any) -> Any:
        loc = kwargs.get("map_location")
        if isinstance(loc, str) and loc.startswith("cuda") and not torch.cuda.is_available():
            kwargs["map_location"] = "cpu"
        return torch.load(*args, **kwargs)

    return ModuleView(torch, load=load)


def DistView(dist: ModuleType) -> ModuleView:  # noqa: N802 - the view's name
    """``torch.distributed`` as trainer.py sees it: ``reduce(op=AVG)``, which gloo lacks, is a SUM
    followed by a division on the destination rank when the backend is gloo."""

    def reduce(tensor: Any, dst: int = 0, op: Any = None, *args: Any, **kwargs: Any) -> Any:
        d = dist
        if op is not None and op == d.ReduceOp.AVG and d.get_backend() == "gloo":
            out = d.reduce(tensor, dst, d.ReduceOp.SUM, *args, **kwargs)
            if d.get_rank() == dst:
                tensor.div_(d.get_world_size())
            return out
        if op is None:
            return d.reduce(tensor, dst, *args, **kwargs)
        return d.reduce(tensor, dst, op, *args, **kwargs)

    return ModuleView(dist, reduce=reduce)


def TorchFusedAdamWView(torch: ModuleType) -> ModuleView:  # noqa: N802 - the view's name
    """``torch`` as trainer.py's setup_optimizer sees it on one CUDA device: ``optim.AdamW``
    defaults to ``fused=True``."""
    optim = torch.optim

    def AdamW(*args: Any, **kwargs: Any) -> Any:  # noqa: N802 - torch's name
        kwargs.setdefault("fused", True)
        return optim.AdamW(*args, **kwargs)

    return ModuleView(torch, optim=ModuleView(optim, AdamW=AdamW))
