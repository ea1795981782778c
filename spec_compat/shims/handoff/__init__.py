"""Hand-off of captured hidden states from a worker to the driver without pickling them
(performance goals P4 and P5 in benchmarks/RESULTS.md).

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

Modules: :mod:`.descriptor` (what is handed over, shared helpers), :mod:`.worker`,
:mod:`.driver` (reading, and speculators 0.3.x's per-call glue), :mod:`.recycling`.
Nothing here imports torch (or vllm) at module import time.
"""


from .descriptor import (
    DEFAULT_SEGMENT_BYTES, SEGMENT_PREFIX, HandoffDescriptor, HandoffError, live_segments, segment_prefix,
    unlink_segment,
)
from .driver import (
    assemble, descriptor_arrived, discard, materialize, note_request, spares_for, stop_adding, take_input_order,
)
from .recycling import pooled_segments, release_pool, reopen_pool, take_spares
from .worker import LayerWriter, SegmentedCapture

__all__ = [
    "DEFAULT_SEGMENT_BYTES", "HandoffDescriptor", "HandoffError", "LayerWriter", "SEGMENT_PREFIX", "SegmentedCapture",
    "assemble", "descriptor_arrived", "discard", "live_segments", "materialize", "note_request", "pooled_segments",
    "release_pool", "reopen_pool", "segment_prefix", "spares_for", "stop_adding", "take_input_order", "take_spares",
    "unlink_segment",
]
