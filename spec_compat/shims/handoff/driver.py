"""Driver side of the hand-off: :func:`materialize` reads a :class:`~.descriptor.HandoffDescriptor`
into per-layer tensors in input order, :func:`discard` unlinks one unread; and the per-call glue of
speculators 0.3.x's generator (patch rows-by-request-id): each call's request order, the spares for
the worker's next call, a reply assembled in input order."""

from __future__ import annotations

import bisect
import os
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from ..capture import assemble_in_order, check_row_counts
from .descriptor import HandoffDescriptor, HandoffError, load_torch, tensor_bytes, unlink_segment
from .recycling import recycle, recycle_when_unmapped, take_spares

if TYPE_CHECKING:  # pragma: no cover
    import torch


def discard(descriptor: HandoffDescriptor | None, *, skip: set[str] | frozenset[str] = frozenset()) -> None:
    """Unlink a descriptor's shared-memory segments and spares without reading them (but the
    names in ``skip``, which a reader has already unlinked or pooled)."""
    if descriptor is None:
        return
    for name in (*(descriptor.segments if descriptor.kind == "shm" else ()), *descriptor.spares):
        if name not in skip:
            unlink_segment(name)


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
    torch = load_torch()
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

    torch = load_torch()
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
        recycle(name, recycle_bytes)

    def done(name: str, shm: Any, mapped: bool, mm: Any) -> None:
        """The worker may write this segment again once nobody reads it."""
        handled.add(name)
        shm.close()
        if recycle_bytes <= 0:
            shm.unlink()
        elif mapped:  # back to the pool when the last tensor viewing it is gone
            if not recycle_when_unmapped(name, mm, recycle_bytes):
                shm.unlink()
        else:
            recycle(name, recycle_bytes)

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
                view = memoryview(tensor_bytes(host[layer], out_row * row_bytes, n * row_bytes)).cast("B")
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
    torch = load_torch()
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


# -- speculators 0.3.x generator calls (patch rows-by-request-id) ---------------------------------
#: request id and prompt length of every request added to a generator's current call, in input
#: order; keyed by id() of the generator's VllmConfig
requests_in_input_order: dict[int, list[tuple[str, int]]] = {}
#: generators (id() of the VllmConfig) whose current call is still adding requests
calls_adding_requests: set[int] = set()
_descriptor_arrived = False


def note_request(generator: int, request_id: str, prompt_tokens: int) -> None:
    """A request added to ``generator``'s call (the first one after :func:`stop_adding` starts a new call)."""
    if generator not in calls_adding_requests:
        requests_in_input_order[generator] = []
        calls_adding_requests.add(generator)
    requests_in_input_order[generator].append((request_id, prompt_tokens))


def stop_adding(generator: int) -> None:
    """``generator``'s call has added all its requests: the next one starts a new call."""
    calls_adding_requests.discard(generator)


def take_input_order(generator: int) -> list[tuple[str, int]]:
    """``[(request id, prompt length), ...]`` of ``generator``'s call, in input order (forgotten here)."""
    calls_adding_requests.discard(generator)
    return requests_in_input_order.pop(generator, [])


def descriptor_arrived() -> bool:
    """Whether a worker has handed this process a descriptor (:func:`assemble`) yet."""
    return _descriptor_arrived


def spares_for(executor: Any) -> list[str]:
    """Pooled segments for a one-worker executor's next call (none with several workers: each
    name must reach exactly one writer)."""
    if len(getattr(executor, "workers", None) or ()) != 1:
        return []
    return take_spares()


def assemble(payload: Any, order: list[tuple[str, int]], pool_bytes: Callable[[], int] | None = None) -> list[Any]:
    """Per-request rows from the worker in input order: tensors (pickled reply) or a
    shared-memory descriptor: a layer whose rows lie in input order is a view of its mapped
    segment, the others are read straight into the output.  ``pool_bytes`` (one worker): reads the
    pool's byte cap (``SPEC_COMPAT_SHM_POOL_MB``), segments read go to the pool for the next call;
    if it raises ValueError the descriptor's segments are unlinked first."""
    global _descriptor_arrived

    if isinstance(payload, HandoffDescriptor):
        _descriptor_arrived = True
        try:
            cap = pool_bytes() if pool_bytes is not None else 0
        except ValueError:
            discard(payload)  # the segments are unlinked, not left in /dev/shm
            raise
        return materialize(payload, order, recycle_bytes=cap)
    return assemble_in_order(payload, order)
