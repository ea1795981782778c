"""Worker side of the hand-off: :class:`SegmentedCapture` copies every step's captured rows into
shared-memory (or CUDA) segments at once and hands over a :class:`~.descriptor.HandoffDescriptor`."""

from __future__ import annotations

import os
import secrets
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from ..capture import RowCountError
from .descriptor import (
    DEFAULT_SEGMENT_BYTES, SEGMENT_PREFIX, HandoffDescriptor, HandoffError, load_torch, tensor_bytes, unlink_segment,
    untrack,
)

if TYPE_CHECKING:  # pragma: no cover
    import torch


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

    def abort_writer(self) -> None:
        """Forget the blocks of a forward that failed or was never closed (its rows were never
        committed); nothing if no writer is open."""
        if self._writer_open:
            del self._blocks[self._mark:]
            self._writer_open = False

    def _add_layer(self, writer: LayerWriter, h: torch.Tensor) -> None:
        try:
            self._add_layer_checked(writer, h)
        except Exception:
            self.abort_writer()
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
            self.abort_writer()
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
            unlink_segment(name)  # too small for this row size: not worth keeping
        return None

    def _new_segment(self, key: int, row_bytes: int, wanted: int) -> list[int]:
        if self._kind == "cuda":  # device memory is committed at once: no larger than needed
            size = max(row_bytes, min(self.segment_bytes, wanted))
            torch = load_torch()
            self._segments.append(torch.empty(size, dtype=torch.uint8, device=self._device))
        else:  # a /dev/shm file's untouched tail costs nothing
            from multiprocessing import shared_memory

            size = max(self.segment_bytes, row_bytes)
            full = self._chains.get(key)
            if full is not None:
                self._segments[full[0]].close()  # keeps its name; one open descriptor per chain
            shm = self._recycled(row_bytes)
            if shm is None:
                name = f"{SEGMENT_PREFIX}{os.getpid()}_{secrets.token_hex(6)}_{len(self._segments)}"
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
        flat = src.reshape(-1).view(load_torch().uint8)
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
                self._pwrite(index, tensor_bytes(flat, done * row_bytes, nbytes), used)
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
        self.abort_writer()  # a forward that was never closed owns no rows
        if self._kind is None or not self._rows:
            self.discard()
            return None
        requests = {rid: tuple((s, c) for s, c in pieces) for rid, pieces in self._requests.items()}
        blocks = tuple(self._blocks)
        dtype = str(self._dtype).removeprefix("torch.")
        if self._kind == "cuda":
            segments: tuple[Any, ...] = tuple(self._segments)
            self._handed.extend(self._segments)
            device = self._device.index if self._device.index is not None else load_torch().cuda.current_device()
        else:
            for shm in self._segments:
                shm.close()
                untrack(shm)  # ownership passes with the descriptor
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
            unlink_segment(name)
        self._spares = []
        self._reset()
