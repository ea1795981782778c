"""What the worker hands to the driver (:class:`HandoffDescriptor`), and the helpers both sides
share: segment names, torch loading, raw byte views, unlinking a segment."""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # pragma: no cover
    import torch

#: size of one segment; a step larger than that spans several segments
DEFAULT_SEGMENT_BYTES = 64 << 20
#: first characters of every segment name in /dev/shm
SEGMENT_PREFIX = "spec_compat_"


def segment_prefix() -> str:
    """Prefix of every shared-memory segment name (``/dev/shm/<prefix>...``)."""
    return SEGMENT_PREFIX


def live_segments(pid: int | None = None) -> set[str]:
    """Names of the capture segments now in /dev/shm (those written by worker ``pid`` only, if
    given): after every call has been materialized or discarded there are none."""
    prefix = SEGMENT_PREFIX + (f"{pid}_" if pid is not None else "")
    try:
        return {name for name in os.listdir("/dev/shm") if name.startswith(prefix)}
    except FileNotFoundError:
        return set()


class HandoffError(RuntimeError):
    """The hand-off could not be made (segments missing, /dev/shm full, mixed inputs)."""


@dataclass(frozen=True)
class HandoffDescriptor:
    """What the worker returns instead of the tensors; pickles to a few bytes per request.

    ``blocks`` lists ``(segment index, byte offset, layer, first row, rows)``: rows
    ``first row .. first row + rows`` of ``layer`` in the capture's row stream (every
    step's kept rows appended in order; the same for all layers) lie contiguously at that
    byte offset of that segment.  ``requests`` maps a request id to its
    ``(first row, rows)`` pieces in the row stream, in capture order (a chunked prefill
    has one piece per step).
    """

    kind: str  #: "shm" (segments are shared-memory names) or "cuda" (device segments)
    dtype: str  #: torch dtype name, e.g. "bfloat16"
    hidden: int
    num_layers: int
    #: shm: segment names.  cuda: the segment tensors in the worker's process; pickling the
    #: descriptor turns each into an IPC handle ``(rebuild fn, args)`` (reduce_tensor), so a
    #: driver in the same process uses the tensors and one elsewhere opens the handles
    segments: tuple[Any, ...]
    blocks: tuple[tuple[int, int, int, int, int], ...]
    requests: dict[str, tuple[tuple[int, int], ...]]
    device: int | None = None  #: CUDA device index of the segments (kind "cuda")
    #: shm: names of recycled segments the worker was given and did not need (go back to the pool)
    spares: tuple[str, ...] = ()

    def __reduce__(self) -> tuple[Any, tuple[Any, ...]]:
        segments = self.segments
        if self.kind == "cuda":
            from torch.multiprocessing.reductions import reduce_tensor

            segments = tuple(s if isinstance(s, tuple) else reduce_tensor(s) for s in segments)
        return (HandoffDescriptor, (self.kind, self.dtype, self.hidden, self.num_layers, segments,
                                    self.blocks, self.requests, self.device, self.spares))

    @property
    def rows(self) -> int:
        return sum(n for pieces in self.requests.values() for _, n in pieces)

    def row_counts(self) -> dict[str, int]:
        return {rid: sum(n for _, n in pieces) for rid, pieces in self.requests.items()}


def load_torch() -> Any:
    """torch, imported when first needed (nothing here imports it at module import)."""
    import torch

    return torch


def tensor_bytes(tensor: torch.Tensor, byte_offset: int, nbytes: int) -> Any:
    """A writable ctypes view of ``nbytes`` of a contiguous CPU tensor's memory."""
    import ctypes

    return (ctypes.c_char * nbytes).from_address(tensor.data_ptr() + byte_offset)


def untrack(shm: Any) -> None:
    """Stop this process's resource tracker from unlinking ``shm`` at exit (ownership moves on)."""
    try:
        from multiprocessing import resource_tracker

        resource_tracker.unregister(shm._name, "shared_memory")
    except Exception:  # pragma: no cover - tracker internals differ
        pass


def unlink_segment(name: str) -> None:
    """Unlink the shared-memory segment ``name`` (nothing if it is gone already)."""
    from multiprocessing import shared_memory

    try:
        shm = shared_memory.SharedMemory(name=name)
    except FileNotFoundError:
        return
    try:
        shm.close()
    finally:
        shm.unlink()
