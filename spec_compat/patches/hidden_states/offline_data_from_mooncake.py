"""``speculators generate-offline-data`` against a server with hs-connectors' Mooncake backend.

speculators 0.9.0 cli/generate_offline_data.py ``_worker`` moves the answer's ``handle`` into
``hs_<i>.safetensors``; a Mooncake server's handle is a store key, so every sample is skipped with
``[Errno 2] No such file or directory`` and nothing is written.
"""

from __future__ import annotations

import asyncio
import contextvars
import inspect
from pathlib import Path
from types import ModuleType
from typing import Any

from ...core import switches
from ...core.proof import Proof
from ...core.registry import Changes, NotNeeded, Patch, register
from .. import _guards as guard

PID = "offline-data-from-mooncake"
GENERATE = "speculators.cli.generate_offline_data"
PROOF = "tests/server/test_mooncake.py::test_offline_data_from_mooncake_fails_with_only_this_patch_disabled"

#: the hidden-states directory of the run in progress (set around ``_generate_and_save_hidden_states``)
_DIRECTORY: contextvars.ContextVar[Path | None] = contextvars.ContextVar("spec_compat_offline_dir", default=None)
_FILES: list[Any] = []  # the process's StoreFiles, made at the first Mooncake answer


def _output_dir(wrapped: Any, args: tuple, kwargs: dict) -> Path | None:
    """The directory the stock run writes into: ``output``, else ``<preprocessed_data>/hidden_states``."""
    try:
        bound = inspect.signature(wrapped).bind_partial(*args, **kwargs)
    except TypeError:
        return None
    output, data = bound.arguments.get("output"), bound.arguments.get("preprocessed_data")
    if output is not None:
        return Path(output)
    return Path(data) / "hidden_states" if data is not None else None


async def _generate_and_save(wrapped: Any, _instance: Any, args: tuple, kwargs: dict) -> Any:
    token = _DIRECTORY.set(_output_dir(wrapped, args, kwargs))
    try:
        return await wrapped(*args, **kwargs)
    finally:
        _DIRECTORY.reset(token)


async def _generate_hidden_states(wrapped: Any, _instance: Any, args: tuple, kwargs: dict) -> Any:
    handle, params = await wrapped(*args, **kwargs)
    from ...shims.hidden_states.offline_store import StoreFiles, is_store_manifest

    if not is_store_manifest(params):
        return handle, params
    if not _FILES:
        _FILES.append(StoreFiles(PID, master=switches.value(switches.MOONCAKE_MASTER_VAR),
                                 local_hostname=switches.value(switches.MOONCAKE_HOST_VAR)))
    directory = _DIRECTORY.get()
    if directory is None:
        import tempfile

        directory = Path(tempfile.gettempdir())
    path = await asyncio.to_thread(_FILES[0].fetch, params, directory)
    return path, params


@register
class OfflineDataFromMooncake(Patch):
    """speculators 0.9.0's ``generate-offline-data`` moves each answer's handle into ``hs_<i>.safetensors``
    (``_worker``: ``shutil.move``); a server with hs-connectors 0.9.0's Mooncake backend answers with a store
    key, so every sample is skipped (``[Errno 2] No such file or directory``) and nothing is written; now each
    sample is read from the store (master: ``SPEC_COMPAT_MOONCAKE_MASTER``), written as the file, and removed
    from the store (client side, any vLLM)."""

    id = PID
    proof = Proof("fails", PROOF, r"Skipping sample \d+ due to error: \[Errno 2\] No such file or directory")
    summary = ("generate-offline-data writes hs_<i>.safetensors from a server with hs-connectors' Mooncake "
               "backend: each sample is read from the store (master: SPEC_COMPAT_MOONCAKE_MASTER), written, "
               "and removed from the store; file and fp8 answers unchanged")
    upstream = ("speculators 0.9.0 cli/generate_offline_data.py _worker: shutil.move(handle, hs_<i>.safetensors); a "
                "Mooncake handle is a store key -> every sample skipped, nothing written")
    target = f"{GENERATE}:generate_hidden_states_async"
    requires = {"speculators": ">=0.9,<0.10", "hs-connectors": ">=0.9,<0.10"}
    side = "driver"
    reads = (switches.MOONCAKE_MASTER_VAR, switches.MOONCAKE_HOST_VAR)

    def check(self, module: ModuleType) -> None:
        guard.attr(module, "generate_hidden_states_async")
        run = guard.attr(module, "_generate_and_save_hidden_states")
        guard.has_params(run, f"{GENERATE}._generate_and_save_hidden_states", "preprocessed_data", "output")
        worker = guard.source(guard.attr(module, "_worker"), f"{GENERATE}._worker")
        if "mooncake" in worker.lower() or "shutil.move" not in worker:
            raise NotNeeded("_worker no longer moves the answer's handle as a file (it may read stores itself)")

    def install(self, module: ModuleType, changes: Changes) -> None:
        changes.wrap(module, "_generate_and_save_hidden_states", _generate_and_save)
        changes.wrap(module, "generate_hidden_states_async", _generate_hidden_states)
