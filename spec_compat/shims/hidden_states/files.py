"""The hidden-states file protocol (vLLM 0.32's ``ExampleHiddenStatesConnector``, plus rename).

* ``<dir>/<name>.safetensors`` (:func:`final_path`) holds ``hidden_states`` [T, L, H] (model
  dtype, layers ascending) and ``token_ids`` [T] int64 (:func:`hidden_states_tensors`).
* ``<path>.lock``: the writer creates it and holds ``flock(LOCK_EX)`` until the final file is in
  place (:func:`acquire_lock` / :func:`release_lock`).  Readers (speculators, hs-connectors)
  poll ``flock(LOCK_EX | LOCK_NB)`` on it, then remove it; vLLM's own reader takes ``LOCK_SH``.
* :func:`replace_atomically` (:func:`write_atomically` for safetensors, and
  :func:`.upstream_writer.write_through` for a connector's own writer): ``.<name>.<pid>.tmp`` in
  the same directory, then ``os.replace``;
  a reader never sees a partial final file.  No fsync: the rename is what readers rely on, and
  an fsync per file cost 1.4-3.8 ms (measured, 1 MiB files) on requests of a few ms each.  On failure ``<path>.error`` holds the message.

Torch and safetensors are imported inside the functions only.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import re
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Union

SUFFIX = ".safetensors"
#: mode of a written file (readable by the client, which may run as another user)
FILE_MODE = 0o644
#: longest file-name stem kept from a request id (a longer one is cut and hashed)
MAX_STEM = 128
_UNSAFE = re.compile(r"[^A-Za-z0-9._-]")

StrPath = Union[str, "os.PathLike[str]"]


class HiddenStatesWriteError(RuntimeError):
    """Writing a hidden-states file failed; no final file was written (``.path`` names it)."""

    def __init__(self, message: str, path: str) -> None:
        super().__init__(message)
        self.path = path


def final_path(storage_dir: StrPath, request_id: str) -> str:
    """``<storage_dir>/<name>.safetensors``.  ``name`` is the request id when it consists of
    ``[A-Za-z0-9._-]``, does not start with a dot and has at most :data:`MAX_STEM` characters;
    otherwise every other character (and each leading dot) becomes ``_``, the result is cut to
    :data:`MAX_STEM` and ``-`` + 16 hex digits of the id's sha256 are appended (deterministic;
    distinct ids keep distinct names)."""
    stem = _UNSAFE.sub("_", request_id)
    dots = len(stem) - len(stem.lstrip("."))
    stem = "_" * dots + stem[dots:]
    if stem != request_id or not stem or len(stem) > MAX_STEM:
        digest = hashlib.sha256(request_id.encode("utf-8", "surrogatepass")).hexdigest()[:16]
        stem = f"{stem[:MAX_STEM]}-{digest}"
    return os.path.join(os.fspath(storage_dir), stem + SUFFIX)


def lock_path(path: StrPath) -> str:
    return os.fspath(path) + ".lock"


def error_path(path: StrPath) -> str:
    return os.fspath(path) + ".error"


def temp_path(path: StrPath) -> str:
    """``.<name>.<pid>.tmp`` next to ``path``."""
    directory, name = os.path.split(os.fspath(path))
    return os.path.join(directory, f".{name}.{os.getpid()}.tmp")


def hidden_states_tensors(rows: Any, token_ids: Any) -> dict[str, Any]:
    """``{"hidden_states": rows, "token_ids": ids}`` checked: rows a floating [T, L, H] tensor
    with T >= 1, ids T integers (a list of ints or an int64 tensor [T]); ValueError otherwise."""
    import torch

    if not isinstance(rows, torch.Tensor) or rows.dim() != 3:
        got = tuple(rows.shape) if isinstance(rows, torch.Tensor) else type(rows).__name__
        raise ValueError(f"spec_compat[ehs-capture]: hidden_states must be a tensor [T, L, H], got {got}")
    if not rows.is_floating_point():
        raise ValueError(f"spec_compat[ehs-capture]: hidden_states must have a floating dtype, got {rows.dtype}")
    if rows.shape[0] == 0:
        raise ValueError("spec_compat[ehs-capture]: hidden_states has no rows (T = 0)")
    if isinstance(token_ids, torch.Tensor):
        if token_ids.dtype != torch.int64:
            raise ValueError(f"spec_compat[ehs-capture]: token_ids must be int64, got {token_ids.dtype}")
        ids = token_ids
    else:
        if not isinstance(token_ids, Sequence) or not all(
            isinstance(t, int) and not isinstance(t, bool) for t in token_ids
        ):
            raise ValueError(f"spec_compat[ehs-capture]: token_ids must be a list of ints or an int64 tensor, got {token_ids!r}")
        ids = torch.tensor(list(token_ids), dtype=torch.int64)
    if ids.dim() != 1 or ids.shape[0] != rows.shape[0]:
        raise ValueError(
            f"spec_compat[ehs-capture]: token_ids must have shape [T] = [{rows.shape[0]}] (the rows of hidden_states), "
            f"got {list(ids.shape)}"
        )
    return {"hidden_states": rows.contiguous(), "token_ids": ids.contiguous()}


def _unlink_quietly(path: str) -> None:
    try:
        os.unlink(path)
    except OSError:
        pass


def _mark_error(path: str, message: str) -> None:
    """Best effort: ``<path>.error`` holding ``message`` (written to a temp name, renamed)."""
    target = error_path(path)
    tmp = temp_path(target)
    try:
        with open(tmp, "w", encoding="utf-8") as f:
            f.write(message + "\n")
        os.replace(tmp, target)
    except OSError:
        _unlink_quietly(tmp)


def write_failed(path: str, exc: BaseException) -> HiddenStatesWriteError:
    """The error of a failed write of ``path``, its message marked in ``<path>.error`` (best effort):
    one wording for every writer (the step's lock, :func:`replace_atomically`, the writer thread)."""
    error = HiddenStatesWriteError(
        f"spec_compat[ehs-capture]: writing hidden states to {path} failed: {type(exc).__name__}: {exc}", path)
    _mark_error(path, str(error))
    return error


def replace_atomically(path: StrPath, write: Callable[[str], None]) -> None:
    """The one atomic write of the protocol: ``write(tmp)`` fills the temp name (:func:`temp_path`),
    which is made :data:`FILE_MODE` and renamed to ``path`` (no fsync).  A stale ``<path>.error`` is
    removed first.  On failure: the temp file is removed, ``<path>.error`` written (best effort) and
    :class:`HiddenStatesWriteError` raised from the original exception (:func:`write_failed`); an
    interrupt (BaseException) only removes the temp file."""
    path = os.fspath(path)
    tmp = temp_path(path)
    _unlink_quietly(error_path(path))
    try:
        write(tmp)
        os.chmod(tmp, FILE_MODE)  # safetensors creates 0600: a client of another user reads it
        os.replace(tmp, path)
    except Exception as exc:
        _unlink_quietly(tmp)
        raise write_failed(path, exc) from exc
    except BaseException:
        _unlink_quietly(tmp)
        raise


def write_atomically(path: StrPath, tensors: Mapping[str, Any],
                     metadata: Mapping[str, str] | None = None) -> None:
    """Save ``tensors`` (and string ``metadata``) as safetensors at ``path`` through
    :func:`replace_atomically` (temp file, ``os.replace``, ``<path>.error`` on failure)."""

    def save(tmp: str) -> None:
        from safetensors.torch import save_file

        save_file(dict(tensors), tmp, metadata=dict(metadata) if metadata is not None else None)

    replace_atomically(path, save)


def acquire_lock(path: StrPath) -> int:
    """Create ``<path>.lock`` (O_CREAT | O_TRUNC | O_WRONLY, 0o644) and hold ``LOCK_EX`` on it;
    returns the fd for :func:`release_lock`."""
    fd = os.open(lock_path(path), os.O_CREAT | os.O_TRUNC | os.O_WRONLY, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
    except BaseException:
        os.close(fd)
        raise
    return fd


def release_lock(fd: int) -> None:
    """Release the lock and close ``fd``; the lock file stays (the reader removes it)."""
    try:
        fcntl.flock(fd, fcntl.LOCK_UN)
    finally:
        os.close(fd)
