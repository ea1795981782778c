"""Hand-off of captured hidden states from a worker to the driver without pickling them
(issue #7, P4 and P5).

Upstream (speculators 0.3.x) keeps one list of step tensors per layer in the worker,
``torch.cat``-s them at the end (about 2x the captured bytes at peak) and returns them
through ``collective_rpc``, i.e. pickled by vLLM's message queue and unpickled in the
driver (several more full copies).  Here:

Worker side - :class:`SegmentedCapture`
    Same inputs as :class:`~spec_compat.shims.capture.PerRequestStore`
    (``begin_step`` / ``store(layers, req_ids)`` / ``end_step``).  Every step's rows are
    copied at once into fixed-size segments, so the step tensors can be freed right
    away (streaming: peak = captured bytes + one step; with ``forward(req_ids).add(h)``
    per layer as it is computed, + one layer of one step and no clone):

    * CPU tensors (``kind="shm"``): POSIX shared memory
      (:class:`multiprocessing.shared_memory.SharedMemory`, ``/dev/shm``), written with
      ``os.pwrite`` (a full ``/dev/shm`` is an ``OSError``, never a ``SIGBUS``); a new
      segment is added when one is full, nothing is ever reallocated.  Every captured
      layer has its own chain of segments, so a layer's rows from consecutive steps lie
      next to each other (a call that ran in several steps is still one piece per layer).
    * CUDA tensors (``kind="cuda"``): device segments (``torch.empty(uint8)``) handed over
      as CUDA IPC handles (``torch.multiprocessing.reductions.reduce_tensor``).

    :meth:`SegmentedCapture.finish` returns a :class:`HandoffDescriptor`: segment names
    (or IPC handles), a block table and per-request row ranges - a few bytes per
    request, whatever the payload.  That descriptor is what the worker returns through
    ``collective_rpc``.

Driver side - :func:`materialize`
    ``materialize(descriptor, order)`` with ``order = [(request id, prompt length), ...]``
    in input order: checks every request's row count first (raises
    :class:`~spec_compat.shims.capture.RowCountError` naming the requests), preallocates
    the final per-layer tensors and fills them segment by segment, unlinking each shared
    memory segment as soon as it is consumed (driver peak = output + nothing: the rows
    are read with ``os.preadv`` straight into the output).  A layer whose rows already lie
    in one piece in input order (the steps scheduled the requests in input order, none
    split out of turn) is not copied at all: its tensor is a view of the mapped segment,
    whose pages are freed with the tensor.  All
    segments are unlinked even when it raises; :func:`discard` unlinks them without reading.

Recycling (driver side, opt-in: ``SPEC_COMPAT_SHM_POOL_MB``)
    ``materialize(..., recycle_bytes=N)`` keeps a segment, once its rows are copied out or
    the last tensor mapping it is gone (a ``weakref.finalize`` on the mapping), in a pool of
    at most N allocated bytes instead of unlinking it; :func:`take_spares` hands the pool to
    the worker's next call (:meth:`SegmentedCapture.adopt`), which writes over those pages
    (a plain copy, no fresh tmpfs page faults); unused spares come back in the descriptor.
    A segment any live tensor still views is never handed out.  :func:`release_pool` (also
    at exit) unlinks the pool.

Lifetime rules
    * shm: ownership of the segments passes with the descriptor.  The worker closes its
      file descriptors in ``finish()`` and stops tracking the names; the driver registers
      them with its own ``multiprocessing`` resource tracker before reading (a crashed
      driver's segments are unlinked by that tracker) and unlinks each one.  A descriptor
      that is never materialized must be passed to :func:`discard`.
    * cuda: the worker keeps the segments alive until the driver has copied them (CUDA
      IPC maps the worker's memory; freeing it early lets the caching allocator reuse it
      under the driver).  ``materialize`` returns only after its copies have completed
      (it synchronizes), so the driver then tells the worker, and the worker calls
      :meth:`SegmentedCapture.release` - also when ``materialize`` raised.  Driver and
      worker must see the same CUDA device numbering (vLLM's executor processes do).
      The descriptor holds the segment tensors until it is pickled, when each becomes an
      IPC handle; a driver in the worker's own process (nothing pickled, e.g. vLLM's
      UniProcExecutor) uses the tensors directly.  Pickle a CUDA descriptor once: every
      pickling takes a new IPC reference.  CUDA segments are sized to the forward's
      remaining rows (at most ``segment_bytes``), since device memory is committed at
      allocation.

Nothing here imports torch (or vllm) at module import time.
"""

from __future__ import annotations

import atexit
import bisect
import os
import secrets
import threading
import weakref
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from .capture import RowCountError, check_row_counts

if TYPE_CHECKING:  # pragma: no cover
    import torch

__all__ = [
    "DEFAULT_SEGMENT_BYTES", "HandoffDescriptor", "HandoffError", "LayerWriter", "SegmentedCapture",
    "discard", "live_segments", "materialize", "segment_prefix",
]

#: size of one segment; a step larger than that spans several segments
DEFAULT_SEGMENT_BYTES = 64 << 20
_PREFIX = "spec_compat_"


def segment_prefix() -> str:
    """Prefix of every shared-memory segment name (``/dev/shm/<prefix>...``)."""
    return _PREFIX


def live_segments(pid: int | None = None) -> set[str]:
    """Names of the capture segments now in /dev/shm (those written by worker ``pid`` only, if
    given): after every call has been materialized or discarded there are none."""
    prefix = _PREFIX + (f"{pid}_" if pid is not None else "")
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


def _torch() -> Any:
    import torch

    return torch


def _buffer(tensor: torch.Tensor, byte_offset: int, nbytes: int) -> Any:
    """A writable ctypes view of ``nbytes`` of a contiguous CPU tensor's memory."""
    import ctypes

    return (ctypes.c_char * nbytes).from_address(tensor.data_ptr() + byte_offset)


def _untrack(shm: Any) -> None:
    try:
        from multiprocessing import resource_tracker

        resource_tracker.unregister(shm._name, "shared_memory")
    except Exception:  # pragma: no cover - tracker internals differ
        pass


def _unlink(name: str) -> None:
    from multiprocessing import shared_memory

    try:
        shm = shared_memory.SharedMemory(name=name)
    except FileNotFoundError:
        return
    try:
        shm.close()
    finally:
        shm.unlink()


class LayerWriter:
    """Rows of one forward, added layer by layer (see :meth:`SegmentedCapture.forward`)."""

    __slots__ = ("store", "slices", "rows", "layers")

    def __init__(self, store: SegmentedCapture, slices: list[tuple[str, int]]) -> None:
        self.store, self.slices = store, slices
        self.rows = sum(c for _, c in slices)
        self.layers = 0

    def add(self, h: torch.Tensor) -> None:
        """Copy this layer's first ``rows`` rows now; ``h`` may be freed right after."""
        self.store._add_layer(self, h)

    def close(self) -> None:
        self.store._close_writer(self)


class SegmentedCapture:
    """Worker-side store: copies every step's captured rows into shared segments at once.

    ``store(layers, req_ids)`` takes the step's per-layer tensors (rows in batch order,
    possibly padded) and the batch's request ids; ``begin_step(num_scheduled_tokens)``
    gives the rows of each request in this step.  ``store_rows(layers, [(request id,
    rows), ...])`` does the same with explicit counts.  ``forward(req_ids)`` /
    ``rows_writer(slices)`` return a :class:`LayerWriter` that takes the layers one at a
    time as the forward computes them (peak: captured bytes + one layer of one step).
    ``mode``: ``"auto"`` (CUDA IPC for
    CUDA tensors, shared memory otherwise), ``"shm"`` (always shared memory; CUDA rows are
    copied to the host) or ``"cuda"``.
    """

    def __init__(self, segment_bytes: int = DEFAULT_SEGMENT_BYTES, mode: str = "auto") -> None:
        if mode not in ("auto", "shm", "cuda"):
            raise ValueError(f"spec_compat[capture-handoff-shm]: mode must be 'auto', 'shm' or 'cuda', not {mode!r}")
        if segment_bytes <= 0:
            raise ValueError("spec_compat[capture-handoff-shm]: segment_bytes must be positive")
        self.segment_bytes = int(segment_bytes)
        self.mode = mode
        self.step_tokens: dict[str, int] | None = None
        self._handed: list[Any] = []  # CUDA segments handed over, kept until release()
        self._spares: list[str] = []  # recycled shm segments given by the driver (adopt())
        self._reset()

    # -- state -----------------------------------------------------------------------
    def _reset(self) -> None:
        self._kind: str | None = None
        self._dtype: Any = None
        self._hidden = 0
        self._num_layers = 0
        self._device: Any = None
        # every segment in creation order (its index is the one in ``blocks``): SharedMemory
        # objects (shm, only the open end of each chain has a file descriptor) or CUDA tensors
        self._segments: list[Any] = []
        # chain key -> [segment index, size, bytes used]; shm: one chain per layer (a layer's
        # rows stay contiguous across steps), cuda: one chain for all layers
        self._chains: dict[int, list[int]] = {}
        self._blocks: list[tuple[int, int, int, int, int]] = []
        self._requests: dict[str, list[list[int]]] = {}
        self._rows = 0
        self._writer_open = False
        self._mark = 0

    @property
    def rows(self) -> int:
        """Rows captured so far (per layer)."""
        return self._rows

    @property
    def captured_bytes(self) -> int:
        if self._dtype is None:
            return 0
        return self._rows * self._hidden * self._dtype.itemsize * self._num_layers

    # -- PerRequestStore-compatible interface ----------------------------------------
    def begin_step(self, num_scheduled_tokens: Mapping[str, int]) -> None:
        self.step_tokens = dict(num_scheduled_tokens)

    def end_step(self) -> None:
        self.step_tokens = None

    def store(self, layers: Sequence[torch.Tensor], req_ids: Sequence[str]) -> None:
        if self.step_tokens is None:
            return  # a warm-up / profiling forward outside any scheduled step: no request owns it
        self.store_rows(layers, [(r, self.step_tokens[r]) for r in req_ids])

    def store_rows(self, layers: Sequence[torch.Tensor], slices: Sequence[tuple[str, int]]) -> None:
        """Copy the first ``sum(rows)`` rows of every layer; rows beyond are padding."""
        if not layers:
            return
        writer = self.rows_writer(slices)
        for h in layers:
            writer.add(h)
        writer.close()

    def forward(self, req_ids: Sequence[str]) -> LayerWriter | None:
        """A writer for one forward's layers, to call ``add(h)`` on as each captured layer
        is computed (so no clone or per-step list is needed), then ``close()``; ``None``
        outside a scheduled step."""
        if self.step_tokens is None:
            return None
        return self.rows_writer([(r, self.step_tokens[r]) for r in req_ids])

    def rows_writer(self, slices: Sequence[tuple[str, int]]) -> LayerWriter:
        if self._writer_open:
            raise HandoffError("spec_compat[capture-handoff-shm]: the previous forward's writer was not closed")
        self._writer_open = True
        self._mark = len(self._blocks)
        return LayerWriter(self, [(rid, int(c)) for rid, c in slices])

    def _abort_writer(self) -> None:
        """Forget the blocks of a forward that failed (its rows were never committed)."""
        if self._writer_open:
            del self._blocks[self._mark:]
            self._writer_open = False

    def _add_layer(self, writer: LayerWriter, h: torch.Tensor) -> None:
        try:
            self._add_layer_checked(writer, h)
        except Exception:
            self._abort_writer()
            raise

    def _add_layer_checked(self, writer: LayerWriter, h: torch.Tensor) -> None:
        n = writer.rows
        if h.dim() != 2 or int(h.shape[0]) < n:
            raise RowCountError(
                f"spec_compat[capture-handoff-shm]: step scheduled {n} tokens for {len(writer.slices)} requests "
                f"but the forward produced {tuple(h.shape)} for layer {writer.layers}"
            )
        if self._kind is None:
            kind = "cuda" if self.mode == "cuda" or (self.mode == "auto" and h.is_cuda) else "shm"
            if kind == "cuda" and not h.is_cuda:
                raise HandoffError("spec_compat[capture-handoff-shm]: mode 'cuda' needs CUDA tensors")
            self._kind, self._dtype, self._device, self._hidden = kind, h.dtype, h.device, int(h.shape[1])
        elif (h.dtype, int(h.shape[1]), h.device) != (self._dtype, self._hidden, self._device):
            raise HandoffError(
                "spec_compat[capture-handoff-shm]: dtype / hidden size / device changed between layers or "
                f"steps: {(h.dtype, int(h.shape[1]), h.device)} after "
                f"{(self._dtype, self._hidden, self._device)}"
            )
        if self._num_layers and writer.layers >= self._num_layers:
            raise HandoffError(f"spec_compat[capture-handoff-shm]: more than {self._num_layers} layers in a forward")
        if n:
            row_bytes = self._hidden * self._dtype.itemsize
            later = max(self._num_layers - writer.layers - 1, 0) * n * row_bytes
            self._write(writer.layers, h[:n], n, row_bytes, later)
        writer.layers += 1

    def _close_writer(self, writer: LayerWriter) -> None:
        if not writer.layers:
            self._writer_open = False
            return
        if not self._num_layers:
            self._num_layers = writer.layers
        elif writer.layers != self._num_layers:
            self._abort_writer()
            raise HandoffError(f"spec_compat[capture-handoff-shm]: a forward captured {writer.layers} layers, "
                               f"earlier ones {self._num_layers}")
        start = self._rows
        for rid, c in writer.slices:
            if not c:
                continue
            pieces = self._requests.setdefault(rid, [])
            if pieces and pieces[-1][0] + pieces[-1][1] == start:
                pieces[-1][1] += c
            else:
                pieces.append([start, c])
            start += c
        self._rows += writer.rows
        self._writer_open = False

    def adopt(self, names: Sequence[str]) -> None:
        """Take recycled segments from the driver (see :func:`take_spares`): new segments are
        these, written over from byte 0 (their pages are already allocated, so the write is a
        plain copy), before any fresh one is created.  Unused ones go back in the descriptor's
        ``spares``, or are unlinked by :meth:`discard`."""
        self._spares.extend(names)

    # -- writing ---------------------------------------------------------------------
    def _recycled(self, size: int) -> Any:
        """A spare segment of at least ``size`` bytes, attached (None if there is none)."""
        from multiprocessing import shared_memory

        while self._spares:
            name = self._spares.pop()
            try:
                shm = shared_memory.SharedMemory(name=name)
            except FileNotFoundError:
                continue
            if shm.size >= size:
                return shm
            shm.close()
            _unlink(name)  # too small for this row size: not worth keeping
        return None

    def _new_segment(self, key: int, row_bytes: int, wanted: int) -> list[int]:
        if self._kind == "cuda":  # device memory is committed at once: no larger than needed
            size = max(row_bytes, min(self.segment_bytes, wanted))
            torch = _torch()
            self._segments.append(torch.empty(size, dtype=torch.uint8, device=self._device))
        else:  # a /dev/shm file's untouched tail costs nothing
            from multiprocessing import shared_memory

            size = max(self.segment_bytes, row_bytes)
            full = self._chains.get(key)
            if full is not None:
                self._segments[full[0]].close()  # keeps its name; one open descriptor per chain
            shm = self._recycled(row_bytes)
            if shm is None:
                name = f"{_PREFIX}{os.getpid()}_{secrets.token_hex(6)}_{len(self._segments)}"
                shm = shared_memory.SharedMemory(name=name, create=True, size=size)
            size = shm.size
            self._segments.append(shm)
        chain = self._chains[key] = [len(self._segments) - 1, size, 0]
        return chain

    def _write(self, layer: int, src: torch.Tensor, n: int, row_bytes: int, later: int) -> None:
        """Copy ``n`` rows; ``later``: bytes the rest of this forward will add."""
        if not src.is_contiguous():
            src = src.contiguous()
        if self._kind == "shm" and src.device.type != "cpu":
            src = src.to("cpu")
        flat = src.reshape(-1).view(_torch().uint8)
        key = layer if self._kind == "shm" else 0
        # a CUDA segment is sized for this forward's remaining bytes (all layers share one chain);
        # an shm chain holds one layer, its segments have the fixed size
        chain = self._chains.get(key)
        done = 0
        while done < n:
            fit = (chain[1] - chain[2]) // row_bytes if chain is not None else 0
            if fit <= 0:
                chain = self._new_segment(key, row_bytes, (n - done) * row_bytes + later)
                continue
            index, _, used = chain
            k = min(fit, n - done)
            nbytes = k * row_bytes
            if self._kind == "cuda":
                seg = self._segments[index]
                seg[used:used + nbytes].copy_(flat[done * row_bytes:done * row_bytes + nbytes])
            else:
                self._pwrite(index, _buffer(flat, done * row_bytes, nbytes), used)
            self._blocks.append((index, used, layer, self._rows + done, k))
            chain[2] = used + nbytes
            done += k

    def _pwrite(self, index: int, data: Any, offset: int) -> None:
        shm = self._segments[index]
        fd = getattr(shm, "_fd", -1)
        view = memoryview(data).cast("B")
        try:
            if fd >= 0 and hasattr(os, "pwrite"):
                while view:
                    written = os.pwrite(fd, view, offset)
                    view, offset = view[written:], offset + written
            else:  # pragma: no cover - platforms without a segment file descriptor
                shm.buf[offset:offset + len(view)] = view
        except OSError as e:
            self.discard()
            raise HandoffError(
                f"spec_compat[capture-handoff-shm]: cannot write captured states to shared memory ({e}); "
                "/dev/shm is too small for the capture (e.g. docker --shm-size / --ipc=host)"
            ) from e

    # -- hand-off --------------------------------------------------------------------
    def finish(self) -> HandoffDescriptor | None:
        """The descriptor of everything stored (``None`` if nothing was); clears the store.

        shm: the segments now belong to whoever holds the descriptor (:func:`materialize`
        or :func:`discard` must be called once).  cuda: the segments stay alive here until
        :meth:`release`.
        """
        self._abort_writer()  # a forward that was never closed owns no rows
        if self._kind is None or not self._rows:
            self.discard()
            return None
        requests = {rid: tuple((s, c) for s, c in pieces) for rid, pieces in self._requests.items()}
        blocks = tuple(self._blocks)
        dtype = str(self._dtype).removeprefix("torch.")
        if self._kind == "cuda":
            segments: tuple[Any, ...] = tuple(self._segments)
            self._handed.extend(self._segments)
            device = self._device.index if self._device.index is not None else _torch().cuda.current_device()
        else:
            for shm in self._segments:
                shm.close()
                _untrack(shm)  # ownership passes with the descriptor
            segments, device = tuple(shm.name for shm in self._segments), None
        spares, self._spares = tuple(self._spares), []
        desc = HandoffDescriptor(self._kind, dtype, self._hidden, self._num_layers, segments,
                                 blocks, requests, device, spares)
        self._reset()
        return desc

    def release(self) -> None:
        """Free CUDA segments handed over by :meth:`finish` (after the driver's copies)."""
        self._handed.clear()

    def discard(self) -> None:
        """Drop everything stored and not yet handed over (unlinks its segments)."""
        if self._kind == "shm":
            for shm in self._segments:
                shm.close()
                try:
                    shm.unlink()
                except FileNotFoundError:  # pragma: no cover
                    pass
        for name in self._spares:
            _unlink(name)
        self._spares = []
        self._reset()


# -- driver side ---------------------------------------------------------------------
def discard(descriptor: HandoffDescriptor | None, *, skip: set[str] | frozenset[str] = frozenset()) -> None:
    """Unlink a descriptor's shared-memory segments and spares without reading them (but the
    names in ``skip``, which a reader has already unlinked or pooled)."""
    if descriptor is None:
        return
    for name in (*(descriptor.segments if descriptor.kind == "shm" else ()), *descriptor.spares):
        if name not in skip:
            _unlink(name)


# -- recycling (driver side) -----------------------------------------------------------
# A segment the driver has read (copied out) or whose last mapping has died may be written
# again by the worker: its pages stay allocated, so the next write is a plain copy instead of
# faulting in fresh tmpfs pages (measured: 7.9 vs 19.8 ms for 32 MiB).  The pool holds the
# names, registered with this process's resource tracker (a crash still unlinks them), up to
# a byte cap of allocated pages; take_spares() empties it for the next call.
# re-entrant: a finalizer (_recycle) may run on this thread while it holds the lock, if a
# garbage collection in the locked section frees the last tensor viewing a segment
_pool_lock = threading.RLock()
_pool: dict[str, int] = {}  # name -> allocated bytes
_live: dict[str, Any] = {}  # name -> finalizer of the mapping that still views it
_pool_closed = False


def _allocated(name: str) -> int:
    try:
        return os.stat(os.path.join("/dev/shm", name)).st_blocks * 512
    except OSError:
        return -1


def _recycle(name: str, cap: int) -> None:
    """Put a segment nobody reads any more in the pool (unlinked if over ``cap`` bytes)."""
    with _pool_lock:
        _live.pop(name, None)
        size = _allocated(name) if not _pool_closed else -1
        if 0 <= size and sum(_pool.values()) + size <= cap:
            _pool[name] = size
            return
    _unlink(name)


def take_spares() -> list[str]:
    """Every pooled segment name, removed from the pool: hand them to the worker for its next
    call (:meth:`SegmentedCapture.adopt`); they come back in that call's descriptor."""
    with _pool_lock:
        names = list(_pool)
        _pool.clear()
    return names


def pooled_segments() -> dict[str, int]:
    """The pool now: name -> allocated bytes."""
    with _pool_lock:
        return dict(_pool)


def release_pool() -> None:
    """Unlink every pooled segment, and the names of segments still mapped (their pages go
    with the mapping); later returns are unlinked.  Runs at interpreter exit."""
    global _pool_closed
    with _pool_lock:
        _pool_closed = True
        names = list(_pool) + list(_live)
        for fin in _live.values():
            fin.detach()
        _pool.clear()
        _live.clear()
    for name in names:
        _unlink(name)


def reopen_pool() -> None:
    """Allow pooling again after :func:`release_pool` (tests)."""
    global _pool_closed
    with _pool_lock:
        _pool_closed = False


atexit.register(release_pool)

def _check_rows(descriptor: HandoffDescriptor | None, order: Sequence[tuple[str, int]]) -> None:
    counts = descriptor.row_counts() if descriptor is not None else {}
    check_row_counts(counts, order, "capture-handoff-shm")


def _runs(descriptor: HandoffDescriptor, order: Sequence[tuple[str, int]]) -> list[tuple[int, int, int]]:
    """(first stream row, rows, first output row), sorted and merged where contiguous."""
    runs = []
    out = 0
    for rid, _ in order:
        for start, n in descriptor.requests[rid]:
            runs.append((start, n, out))
            out += n
    runs.sort()
    merged: list[tuple[int, int, int]] = []
    for s, n, o in runs:
        if merged and merged[-1][0] + merged[-1][1] == s and merged[-1][2] + merged[-1][1] == o:
            ps, pn, po = merged[-1]
            merged[-1] = (ps, pn + n, po)
        else:
            merged.append((s, n, o))
    return merged


def materialize(descriptor: HandoffDescriptor | None, order: Sequence[tuple[str, int]],
                device: Any = None, *, threads: int | None = None, map_pages: bool = True,
                recycle_bytes: int = 0) -> list[torch.Tensor]:
    """The per-layer tensors with the rows of ``order``'s requests in that order.

    ``order`` is ``[(request id, prompt length), ...]``.  Raises ``RowCountError`` (before
    any copy) if a request has no rows or a row count other than its prompt length.  The
    output lies on ``device`` (default: CPU for shm, the segments' GPU for cuda).  shm
    segments are unlinked in every case; for cuda the caller then lets the worker
    :meth:`~SegmentedCapture.release` its segments.  ``threads``: shm segments read at
    once (default: up to 4, by CPU count).  ``map_pages`` (shm): a layer whose
    rows lie in one piece of one segment, in ``order`` (steps that kept the input order), is
    returned as a view of the segment's pages instead of a copy - the name is unlinked all
    the same and the pages are freed with the last tensor viewing them; ``False`` copies
    every layer into fresh tensors.  ``recycle_bytes`` > 0 (shm): instead of unlinking a
    segment once its rows are copied out (or, when mapped, once the last tensor viewing it
    is gone), keep it in the driver's pool, up to that many allocated bytes in all, for the
    worker to write again (:func:`take_spares`); the descriptor's unused spares go back too.
    """
    handled: set[str] = set()  # names unlinked or recycled by the reader
    try:
        _check_rows(descriptor, order)
        if descriptor is None:
            return []
        if descriptor.kind == "cuda":
            return _materialize_cuda(descriptor, order, device)
        return _materialize_shm(descriptor, order, device, threads, map_pages, recycle_bytes, handled)
    finally:
        discard(descriptor, skip=handled)  # whatever the reader did not hand on (an error, unpooled spares)


def _outputs(descriptor: HandoffDescriptor, total: int, device: Any) -> list[torch.Tensor]:
    torch = _torch()
    dtype = getattr(torch, descriptor.dtype)
    return [torch.empty((total, descriptor.hidden), dtype=dtype, device=device)
            for _ in range(descriptor.num_layers)]


def _segment_copies(descriptor: HandoffDescriptor, runs: list[tuple[int, int, int]], row_bytes: int):
    """Per segment index: [(layer, source byte offset, output row, rows), ...]."""
    starts = [s for s, _, _ in runs]
    by_segment: dict[int, list[tuple[int, int, int, int]]] = {}
    for seg, offset, layer, first, n in descriptor.blocks:
        i = max(bisect.bisect_right(starts, first) - 1, 0)
        end = first + n
        while i < len(runs) and runs[i][0] < end:
            s, rn, o = runs[i]
            lo, hi = max(s, first), min(s + rn, end)
            if lo < hi:
                by_segment.setdefault(seg, []).append(
                    (layer, offset + (lo - first) * row_bytes, o + (lo - s), hi - lo))
            i += 1
    return by_segment


def _whole_layers(copies: dict[int, list[tuple[int, int, int, int]]], total: int,
                  row_bytes: int) -> dict[int, tuple[int, int]]:
    """{layer: (segment index, byte offset)} for every layer whose output is one contiguous
    range of one segment, already in output order (e.g. steps that scheduled the requests
    in input order: each step's rows follow the previous step's in the layer's segment)."""
    pieces: dict[int, list[tuple[int, int, int, int]]] = {}
    for seg, parts in copies.items():
        for layer, offset, out_row, n in parts:
            pieces.setdefault(layer, []).append((out_row, seg, offset, n))
    whole = {}
    for layer, ps in pieces.items():
        ps.sort()
        out_row, seg, offset, n = ps[0]
        if out_row != 0:
            continue
        for o, s, off, k in ps[1:]:  # each piece must continue the previous one in the same segment
            if (o, s, off) != (out_row + n, seg, offset + n * row_bytes):
                break
            n += k
        else:
            if n == total and total > 0:
                whole[layer] = (seg, ps[0][2])
    return whole


def _map_rows(fd: int, length: int) -> Any:
    """A shared mapping of a segment's first ``length`` bytes, all written by the worker (no
    page is allocated by touching it).  Not pre-faulted (``MAP_POPULATE``): measured slower
    here than the faults of the first read (an ad-hoc run, 32 MiB: map + speculators' clone
    3.7 + 8.8 ms populated against 0.3 + 6.7 ms not)."""
    import mmap

    return mmap.mmap(fd, length, flags=mmap.MAP_SHARED, prot=mmap.PROT_READ | mmap.PROT_WRITE)


def _default_threads() -> int:
    return max(1, min(4, os.cpu_count() or 1))


def _materialize_shm(descriptor: HandoffDescriptor, order: Sequence[tuple[str, int]],
                     device: Any, threads: int | None, map_pages: bool, recycle_bytes: int,
                     handled: set[str]) -> list[torch.Tensor]:
    from multiprocessing import shared_memory

    torch = _torch()
    total = sum(n for _, n in order)
    target = torch.device(device) if device is not None else torch.device("cpu")
    dtype = getattr(torch, descriptor.dtype)
    row_bytes = descriptor.hidden * dtype.itemsize
    copies = _segment_copies(descriptor, _runs(descriptor, order), row_bytes)
    # a layer whose rows lie in one piece, in order (steps that kept the input order), is returned
    # as a view of the segment's pages: mapped, then the name is unlinked (or pooled once the last
    # view is gone), and the pages live as long as the tensor (no copy); the other layers are read
    # into fresh tensors
    whole = _whole_layers(copies, total, row_bytes) if map_pages else {}
    host: list[Any] = [None if layer in whole else torch.empty((total, descriptor.hidden), dtype=dtype)
                       for layer in range(descriptor.num_layers)]
    names = descriptor.segments
    # attach once (registers every name with this process's resource tracker, so a crash
    # from here on still unlinks them), then read and unlink one segment at a time
    for name in names:
        try:
            shared_memory.SharedMemory(name=name).close()
        except FileNotFoundError as e:
            raise HandoffError(f"spec_compat[capture-handoff-shm]: shared-memory segment {name} is gone "
                               "(already materialized or discarded?)") from e
    for name in descriptor.spares if recycle_bytes > 0 else ():  # untouched: straight back to the pool
        try:
            shared_memory.SharedMemory(name=name).close()  # registered here again, as pooled names are
        except FileNotFoundError:
            continue
        handled.add(name)
        _recycle(name, recycle_bytes)

    def done(name: str, shm: Any, mapped: bool, mm: Any) -> None:
        """The worker may write this segment again once nobody reads it."""
        handled.add(name)
        shm.close()
        if recycle_bytes <= 0:
            shm.unlink()
        elif mapped:  # back to the pool when the last tensor viewing it is gone
            with _pool_lock:
                if not _pool_closed:
                    _live[name] = weakref.finalize(mm, _recycle, name, recycle_bytes)
                    return
            shm.unlink()
        else:
            _recycle(name, recycle_bytes)

    def read(index: int) -> None:
        name = names[index]
        shm = shared_memory.SharedMemory(name=name)
        mm = None
        try:
            fd = getattr(shm, "_fd", -1)
            mapped = [(layer, offset) for layer, (seg, offset) in whole.items() if seg == index]
            if mapped and fd >= 0:
                mm = _map_rows(fd, max(offset for _, offset in mapped) + total * row_bytes)
                for layer, offset in mapped:
                    host[layer] = torch.frombuffer(mm, dtype=dtype, count=total * descriptor.hidden,
                                                   offset=offset).view(total, descriptor.hidden)
            for layer, offset, out_row, n in copies.get(index, ()):
                if layer in whole and fd >= 0:
                    continue
                if host[layer] is None:  # pragma: no cover - a whole layer, but no file descriptor to map
                    host[layer] = torch.empty((total, descriptor.hidden), dtype=dtype)
                view = memoryview(_buffer(host[layer], out_row * row_bytes, n * row_bytes)).cast("B")
                if fd >= 0 and hasattr(os, "preadv"):
                    while view:  # straight from the segment into the output, no mapping
                        got = os.preadv(fd, [view], offset)
                        if got <= 0:
                            raise HandoffError(f"spec_compat[capture-handoff-shm]: segment {name} is short")
                        view, offset = view[got:], offset + got
                else:  # pragma: no cover
                    view[:] = shm.buf[offset:offset + len(view)]
                del view
        except BaseException:
            shm.close()
            shm.unlink()
            raise
        done(name, shm, mm is not None, mm)
        del mm  # the tensors hold the mapping

    threads = min(threads if threads else _default_threads(), len(names))
    if threads <= 1:
        for index in range(len(names)):
            read(index)
    else:  # preadv releases the GIL; the page faults of the fresh output pages scale with cores
        from concurrent.futures import ThreadPoolExecutor

        with ThreadPoolExecutor(threads, thread_name_prefix="spec_compat_handoff") as pool:
            for future in [pool.submit(read, i) for i in range(len(names))]:
                future.result()
    if target.type != "cpu":
        return [h.to(target) for h in host]
    return host


def _materialize_cuda(descriptor: HandoffDescriptor, order: Sequence[tuple[str, int]],
                      device: Any) -> list[torch.Tensor]:
    torch = _torch()
    total = sum(n for _, n in order)
    target = torch.device(device) if device is not None else torch.device("cuda", descriptor.device)
    out = _outputs(descriptor, total, target)
    row_bytes = descriptor.hidden * out[0].element_size() if out else 0
    flat = [o.view(-1).view(torch.uint8) for o in out]
    copies = _segment_copies(descriptor, _runs(descriptor, order), row_bytes)
    for index, segment in enumerate(descriptor.segments):
        parts = copies.get(index)
        if not parts:
            continue
        seg = segment[0](*segment[1]) if isinstance(segment, tuple) else segment
        for layer, offset, out_row, n in parts:
            nbytes = n * row_bytes
            flat[layer][out_row * row_bytes:out_row * row_bytes + nbytes].copy_(
                seg[offset:offset + nbytes], non_blocking=True)
        del seg
    torch.cuda.synchronize(descriptor.device)  # copies done: the worker may release now
    return out
