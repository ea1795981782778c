"""Files from a Mooncake store, for a client that writes hidden states to disk.

speculators 0.9.0's ``generate-offline-data`` takes the ``handle`` of each answer for a file path and
moves it into ``hs_<i>.safetensors``.  A server with hs-connectors' Mooncake connector answers with
a transfer manifest instead (the sample's key in the store and its tensor layout), so every move
fails.  :class:`StoreFiles` reads such a sample with hs-connectors' own reader
(``MooncakeHiddenStatesStore.get_sample``), writes it as a safetensors file next to the target,
removes it from the store, and gives the path back: the stock move then renames it.

The client needs the master's address, which the answer does not carry: ``SPEC_COMPAT_MOONCAKE_MASTER``
(``host:port``; hs-connectors' default ``127.0.0.1:50051`` when unset), parsed in
``spec_compat.core.switches`` and handed in by the patch with Mooncake's ``MOONCAKE_LOCAL_HOSTNAME``
(this module reads no environment).  The reader joins the store with no segment of its own (it
stores nothing).  Pure Python apart from :func:`open_reader`.
"""

from __future__ import annotations

import logging
import re
import threading
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from .mooncake_master import DEFAULT_MASTER

log = logging.getLogger("spec_compat")

#: where the client finds the Mooncake master (the answers carry only the sample's key); named in
#: messages, parsed in spec_compat.core.switches
MASTER_ENV = "SPEC_COMPAT_MOONCAKE_MASTER"
#: the reader's local buffer (hs-connectors registers staging buffers of its own for the samples)
READER_LOCAL_BUFFER = 16 * 1024 * 1024
#: how long a read waits for a sample the server has answered (hs-connectors' ``get_sample`` default)
READ_TIMEOUT_S = 120.0
#: a part file's name: no ``hs_`` prefix, so an interrupted run's leftover is never taken for a sample
PART_PREFIX = ".spec-compat-store-"


def is_store_manifest(params: Any) -> bool:
    """Whether ``kv_transfer_params`` describe a sample in a Mooncake store (hs-connectors' transfer
    manifest: a ``handle`` key and a tensor layout) rather than a file."""
    return (isinstance(params, Mapping) and isinstance(params.get("handle"), str) and "tensors" in params
            and "metadata" in params and "hidden_states_path" not in params)


def part_path(directory: Path, handle: str) -> Path:
    """Where a sample is written before the stock client renames it."""
    return directory / f"{PART_PREFIX}{re.sub(r'[^A-Za-z0-9._-]', '_', handle)}.safetensors"


def open_reader(master: str, local_hostname: str = "localhost") -> Any:
    """hs-connectors' store reader joined to ``master`` as ``local_hostname`` with no segment
    (imports hs-connectors)."""
    from hs_connectors.mooncake_store import MooncakeHiddenStatesStore, MooncakeStoreConfig

    config = MooncakeStoreConfig(local_hostname=local_hostname, master_server_address=master, global_segment_size=0,
                                 local_buffer_size=READER_LOCAL_BUFFER)
    return MooncakeHiddenStatesStore(config).setup()


def _save(sample: Mapping[str, Any], path: Path) -> None:
    from safetensors.torch import save_file

    save_file({name: tensor.contiguous() for name, tensor in sample.items()}, str(path))


class StoreFiles:
    """Turns Mooncake samples into files, one reader per process (joined at the first sample)."""

    def __init__(self, patch_id: str, opener: Callable[[str], Any] | None = None,
                 save: Callable[[Mapping[str, Any], Path], None] = _save, *,
                 master: str | None = None, local_hostname: str = "localhost") -> None:
        """``master``: ``host:port`` as parsed by the caller (None: hs-connectors' default);
        ``opener(master)`` joins the store (:func:`open_reader` as ``local_hostname`` by default)."""
        self.patch_id = patch_id
        self.master = master or DEFAULT_MASTER
        self._opener = opener or (lambda address: open_reader(address, local_hostname))
        self._save = save
        self._lock = threading.Lock()
        self._reader: Any = None

    def _joined(self) -> tuple[Any, str]:
        master = self.master
        with self._lock:
            if self._reader is None:
                try:
                    self._reader = self._opener(master)
                except Exception as exc:
                    raise RuntimeError(
                        f"spec_compat[{self.patch_id}]: the server stored this sample in a Mooncake store, and "
                        f"its master at {master} cannot be joined ({type(exc).__name__}: {exc}); set {MASTER_ENV}="
                        "HOST:PORT to the master the server was started with (speculators: --mooncake-master)"
                    ) from exc
            return self._reader, master

    def fetch(self, params: Mapping[str, Any], directory: Path) -> str:
        """Read the sample ``params`` describe, write it under ``directory``, remove it from the
        store; the file's path.  Raises (naming the handle and the master) when it cannot be read."""
        reader, master = self._joined()
        handle = str(params["handle"])
        try:
            sample = reader.get_sample(dict(params), timeout=READ_TIMEOUT_S)
        except Exception as exc:
            raise RuntimeError(f"spec_compat[{self.patch_id}]: sample {handle} could not be read from the Mooncake "
                               f"store (master {master}): {type(exc).__name__}: {exc}") from exc
        missing = {"hidden_states", "token_ids"} - set(sample)
        if missing:
            raise RuntimeError(f"spec_compat[{self.patch_id}]: sample {handle} from the Mooncake store has no "
                               f"{sorted(missing)} (it holds {sorted(sample)})")
        directory.mkdir(parents=True, exist_ok=True)
        path = part_path(directory, handle)
        try:
            self._save(sample, path)
        except BaseException:
            path.unlink(missing_ok=True)
            raise
        try:  # the sample is a file now: its room in the store is given back
            reader.delete_sample(handle)
        except Exception as exc:  # noqa: BLE001 -- the file is written; a leftover object is only room
            log.warning("spec_compat[%s]: sample %s is written to %s but stays in the Mooncake store (master %s): "
                        "%s: %s", self.patch_id, handle, path, master, type(exc).__name__, exc)
        return str(path)
