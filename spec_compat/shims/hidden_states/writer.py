"""Write hidden-states files off the engine step: one background thread, bounded.

The engine step only does the part whose outcome the answer needs: it removes a stale file or
``.error`` marker of the same name and creates ``<path>.lock`` holding ``LOCK_EX`` (a storage
directory that is gone or unwritable fails here, inside the step, so the request's answer can name
it).  The safetensors write runs on a writer thread: temp file, rename into place, then the lock is
released (vLLM 0.32's order; readers that know the lock protocol wait on it, the API server's wait
of ``ehs-write-error-status`` polls for the file).  A write that fails leaves no final file, writes
``<path>.error`` and releases the lock; the engine keeps going.  At most ``max_pending`` writes are
queued: :meth:`BackgroundWriter.submit` blocks beyond that (back-pressure bounds the host memory the
queued rows hold).

Why a thread: the write is the largest part of an extraction step that is not the forward (a Kimi-K2.5
prompt of 4k tokens at 4 layers is 235 MB in bf16), and on a GPU host the CPU is idle while the
device computes.  Imports nothing of vLLM; torch and safetensors only inside the write.
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Mapping
from concurrent.futures import Future, ThreadPoolExecutor, wait
from typing import Any

from .files import (
    HiddenStatesWriteError, _unlink_quietly, acquire_lock, error_path, release_lock, write_atomically, write_failed,
)
from .upstream_writer import HostReady, write_through

log = logging.getLogger("spec_compat")

#: writes queued or running at once before :meth:`BackgroundWriter.submit` waits
MAX_PENDING = 8


class BackgroundWriter:
    """Atomic safetensors writes on one daemon thread, each guarded by ``<path>.lock``."""

    def __init__(self, max_pending: int = MAX_PENDING) -> None:
        if max_pending < 1:
            raise ValueError(f"spec_compat[ehs-capture]: max_pending must be >= 1, got {max_pending}")
        self._slots = threading.BoundedSemaphore(max_pending)
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="spec-compat-hs-writer")
        self._futures: set[Future[None]] = set()
        self._guard = threading.Lock()
        self.written = 0
        self.failed = 0

    def begin(self, path: str) -> int:
        """The step's part: drop a stale ``path`` / ``<path>.error`` and take ``<path>.lock``.
        Raises :class:`.files.HiddenStatesWriteError` (after marking ``<path>.error`` where it can)
        when the lock cannot be created; returns its fd otherwise."""
        _unlink_quietly(path)
        _unlink_quietly(error_path(path))
        try:
            return acquire_lock(path)
        except OSError as exc:
            raise write_failed(path, exc) from exc

    def submit(self, path: str, tensors: Mapping[str, Any], metadata: Mapping[str, str] | None = None,
               ready: Any = None, write: Any = None) -> None:
        """:meth:`begin`, then queue the write; returns once it is queued (waits while
        ``max_pending`` writes are).  ``ready`` (a CUDA event from :func:`host_rows`) is
        synchronized by the writer thread before it reads the tensors.  ``write``: a
        ``_write_tensors(tensors, event, filename, lock_fd)`` override to save with instead
        (:func:`.upstream_writer.write_through`; it waits on ``ready`` itself, and writes no ``metadata``)."""
        fd = self.begin(path)
        self._slots.acquire()
        try:
            future = self._pool.submit(self._write, path, dict(tensors), metadata, fd, ready, write)
        except BaseException:
            self._slots.release()
            release_lock(fd)
            raise
        with self._guard:
            self._futures.add(future)
        future.add_done_callback(self._done)

    def _done(self, future: Future[None]) -> None:
        with self._guard:
            self._futures.discard(future)

    def _write(self, path: str, tensors: dict[str, Any], metadata: Mapping[str, str] | None, fd: int,
               ready: Any, write: Any = None) -> None:
        try:
            if write is not None:
                write_through(write, path, tensors, ready if ready is not None else HostReady(), fd)
            else:
                if ready is not None:
                    ready.synchronize()
                write_atomically(path, tensors, metadata)
            self.written += 1
        except HiddenStatesWriteError as exc:  # marked by write_atomically
            self.failed += 1
            log.error("%s", exc)
        except BaseException as exc:  # the thread must keep serving the next write
            self.failed += 1
            log.exception("%s", write_failed(path, exc))
        finally:
            try:
                release_lock(fd)
            finally:
                self._slots.release()

    @property
    def pending(self) -> int:
        with self._guard:
            return len(self._futures)

    def drain(self, timeout: float | None = None) -> bool:
        """Wait for every queued write; False when ``timeout`` passed first."""
        with self._guard:
            futures = set(self._futures)
        return not wait(futures, timeout=timeout).not_done

    def close(self) -> None:
        """Finish the queued writes and stop the thread (idempotent)."""
        self._pool.shutdown(wait=True)


def static_override(cls: type, base: type, name: str) -> Any:
    """``cls.name`` when a subclass of ``base`` overrides that static method, else None."""
    own = vars(base)[name]
    own = own.__func__ if isinstance(own, staticmethod) else own
    found = getattr(cls, name)
    return None if found is own else found


def host_rows(rows: Any) -> tuple[Any, Any]:
    """``(host tensor, ready)``: a CPU tensor is returned as is (``ready`` None: the gather
    already copied it out of the cache); a device tensor is copied into pinned host memory on the
    current stream without blocking the step, ``ready`` being a CUDA event recorded after the copy
    (the writer thread synchronizes it).  The copy is queued before the cache's blocks can be
    reused: later kernels on the stream run after it."""
    host, ready = host_tensors({"rows": rows})
    return host["rows"], ready


def host_tensors(tensors: Mapping[str, Any]) -> tuple[dict[str, Any], Any]:
    """``(host tensors, ready)``: :func:`host_rows` for several tensors, one event recorded after
    every copy (None when all of them are CPU tensors, which are returned as they are)."""
    out, copied = {}, False
    for name, tensor in tensors.items():
        if tensor.device.type == "cpu":
            out[name] = tensor
            continue
        import torch

        out[name] = torch.empty(tensor.shape, dtype=tensor.dtype, device="cpu", pin_memory=True)
        out[name].copy_(tensor, non_blocking=True)
        copied = True
    if not copied:
        return out, None
    import torch

    ready = torch.cuda.Event()
    ready.record()
    return out, ready


#: :func:`outcome` states
WRITTEN, FAILED, PENDING = "written", "failed", "pending"


def outcome(path: str) -> tuple[str, str | None]:
    """Where the write of ``path`` stands, as any process sees it: ``(WRITTEN, None)`` when the
    final file is in place, ``(FAILED, message)`` when ``<path>.error`` exists, ``(PENDING, None)``
    otherwise."""
    if os.path.isfile(path):
        return WRITTEN, None
    marker = error_path(path)
    if os.path.exists(marker):
        try:
            with open(marker, encoding="utf-8") as f:
                message = f.read().strip()
        except OSError as exc:
            message = f"spec_compat[ehs-capture]: writing {path} failed ({exc})"
        return FAILED, message
    return PENDING, None
