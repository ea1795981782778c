"""Batches for single-device bf16 training: features cast where they are built, and the next
batch copied to the device while the current step computes.

* :class:`Bf16Features` wraps a DataLoader's ``collate_fn``: in a loader worker (speculators'
  train.py runs 12, with ``pin_memory``) the collated ``hidden_states`` (consumed only by the
  draft's ``fc``, which bf16 autocast runs in bf16 anyway) leave the host in bf16: half the bytes
  to pin and copy, no cast kernel on the device, the same values (host and device both round
  fp32 to bf16 to nearest even).  Everything else keeps its dtype.
* :class:`DevicePrefetch` wraps a loader: iterating it yields batches whose tensors are on the
  device already, the copy of batch *n + 1* issued on a side stream before batch *n* is handed
  out.  ``len()`` and every other attribute (``batch_sampler``, ``dataset``) are the loader's.

Module-level classes (not closures): a DataLoader with workers pickles its ``collate_fn``.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

#: batch keys cast to bf16 on the host (fed to autocast matmuls only)
BF16_KEYS = ("hidden_states",)


class Bf16Features:
    """``collate_fn`` wrapper: the keys in ``keys`` of the collated dict, when floating point, in bf16."""

    def __init__(self, collate: Any, keys: tuple[str, ...] = BF16_KEYS) -> None:
        self.collate = collate
        self.keys = keys

    def __call__(self, samples: Any) -> Any:
        import torch

        batch = self.collate(samples)
        # only in a DataLoader worker (in parallel with the step, before pin_memory): in the main
        # process the cast would be host time in the step's path, where autocast's costs less
        if isinstance(batch, dict) and torch.utils.data.get_worker_info() is not None:
            for key in self.keys:
                value = batch.get(key)
                if isinstance(value, torch.Tensor) and value.is_floating_point() and value.dtype != torch.bfloat16:
                    batch[key] = value.to(torch.bfloat16)
        return batch


def _to(batch: Any, device: Any) -> Any:
    import torch

    if isinstance(batch, dict):
        return {k: v.to(device, non_blocking=True) if isinstance(v, torch.Tensor) else v for k, v in batch.items()}
    return batch


class DevicePrefetch:
    """A loader whose batches arrive on ``device`` (a CUDA device), each copied on a side stream
    one step ahead; the consuming stream waits for the copy and owns the memory after it."""

    def __init__(self, loader: Any, device: Any) -> None:
        self.loader = loader
        self.device = device

    def __len__(self) -> int:
        return len(self.loader)

    def __getattr__(self, name: str) -> Any:
        if name in ("loader", "device"):  # not set yet (unpickling): no recursion
            raise AttributeError(name)
        return getattr(self.loader, name)

    def __iter__(self) -> Iterator[Any]:
        import torch

        side = torch.cuda.Stream(device=self.device)
        host = iter(self.loader)

        def issue(batch: Any) -> Any:
            with torch.cuda.stream(side):
                return _to(batch, self.device)

        try:
            ahead = issue(next(host))
        except StopIteration:
            return
        while True:
            ready = ahead
            consumer = torch.cuda.current_stream(self.device)
            consumer.wait_stream(side)
            if isinstance(ready, dict):
                for value in ready.values():
                    if isinstance(value, torch.Tensor) and value.is_cuda:
                        value.record_stream(consumer)
            try:
                ahead = issue(next(host))
            except StopIteration:
                yield ready
                return
            yield ready
