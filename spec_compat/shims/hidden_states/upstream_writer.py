"""Writing through vLLM >= 0.17's ``ExampleHiddenStatesConnector._write_tensors`` contract.

``_write_tensors(tensors, event, filename, lock_fd)``: wait on ``event`` (the CUDA event of the rows'
device-to-host copy), save ``tensors`` to ``filename``, close ``lock_fd``.  Out-of-tree connectors
override it (hs-connectors 0.9.0's ``FP8HiddenStatesConnector`` quantizes to float8_e4m3fn there);
the backport's writer calls an override through :func:`write_through`, which keeps the file
protocol of :mod:`.files` (temp name + rename, the lock held until the final file is in place).
Torch and safetensors are imported inside the functions only.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

from .files import StrPath, replace_atomically


class HostReady:
    """The ``event`` of vLLM's ``_write_tensors(tensors, event, filename, lock_fd)`` contract where the
    rows are host memory already (CPU engine): nothing to wait for."""

    def synchronize(self) -> None:
        return None

    def query(self) -> bool:
        return True


def save_and_release(tensors: Mapping[str, Any], event: Any, filename: str, lock_fd: int | None) -> None:
    """vLLM >= 0.17's ``_write_tensors`` contract, plainly: wait on ``event``, save ``tensors`` to
    ``filename``, close ``lock_fd``."""
    try:
        event.synchronize()
        from safetensors.torch import save_file

        save_file(dict(tensors), filename)
    finally:
        if lock_fd is not None:
            os.close(lock_fd)


def write_through(write: Any, path: StrPath, tensors: Mapping[str, Any], event: Any, lock_fd: int) -> None:
    """Save through a writer with vLLM >= 0.17's ``ExampleHiddenStatesConnector._write_tensors``
    contract (``write(tensors, event, filename, lock_fd)``: wait on ``event``, save to ``filename``,
    close ``lock_fd``), e.g. hs-connectors' FP8 override.  It writes the temp name, which is then
    renamed to ``path``: the bytes are the writer's own, and no reader sees a partial file.  It gets a
    duplicate of ``lock_fd`` (closing it keeps the lock, which holds until the caller releases
    ``lock_fd`` after the rename).  Temp name, rename and failure handling: :func:`.files.replace_atomically`."""

    def save(tmp: str) -> None:
        dup = os.dup(lock_fd)
        write(dict(tensors), event, tmp, dup)

    replace_atomically(path, save)
