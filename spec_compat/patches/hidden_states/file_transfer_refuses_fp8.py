"""hs-connectors' ``file`` backend reading files its ``fp8`` connector wrote (trainer side, any vLLM).

hs-connectors 0.9.0 ``transfer.py`` ``FileTransfer.get_cached`` / ``get_generated`` return whatever
the file holds; ``FP8Transfer`` (the ``fp8`` backend) dequantizes. A trainer started with
``--hidden-states-backend file`` against an fp8 server gets float8 rows and their scales, and
speculators 0.9.0's ``CollateFn`` casts the rows to bf16 unscaled: silent wrong data.

What a trainer reading hidden-state files with the plain ``file`` backend must refuse
(:func:`refuse_scaled_payload`): ``hidden_states`` as float8_e4m3fn, or ``hidden_states_scales``
(one fp32 scale per token) beside them - a payload only ``FP8Transfer`` multiplies back.
"""

from __future__ import annotations

from pathlib import Path
from types import ModuleType
from typing import Any

from ...core.proof import Proof
from ...core.registry import Changes, NotNeeded, Patch, register
from .. import _guards as guard

TRANSFER = "hs_connectors.transfer"
PROOF = "tests/server/test_backend_mismatch.py::test_fp8_files_read_as_plain_files_fail_only_without_this_patch"
READS = ("get_cached", "get_generated")

#: hs-connectors 0.9.0's key for the per-token scales of an fp8 payload
SCALES_KEY = "hidden_states_scales"


def scaled_payload(sample: Any) -> str | None:
    """Why ``sample`` (a loaded tensor dict, or None) is an fp8 payload with scales, or None."""
    if not isinstance(sample, dict):
        return None
    hs = sample.get("hidden_states")
    dtype = str(getattr(hs, "dtype", ""))
    if SCALES_KEY in sample:
        return f"it holds {SCALES_KEY!r} (per-token scales) next to hidden_states {dtype}"
    if "float8" in dtype:
        return f"its hidden_states are {dtype}"
    return None


def refuse_scaled_payload(sample: Any, where: str, patch_id: str) -> Any:
    """``sample`` unchanged, or ValueError when it is an fp8 payload read as plain files."""
    why = scaled_payload(sample)
    if why is not None:
        raise ValueError(
            f"spec_compat[{patch_id}]: the hidden states at {where} were written by hs-connectors' fp8 connector "
            f"({why}); the trainer reads them with the 'file' backend, which would use the fp8 values without "
            "their scales. Read them with --hidden-states-backend fp8 (the backend the server was started with).")
    return sample


def reads_plainly(instance: Any, base: type, name: str) -> bool:
    """``instance`` reads with ``base``'s own ``name`` method: no subclass between them overrides it
    (hs-connectors' ``FP8Transfer`` overrides both reads and dequantizes; it is not checked)."""
    return not any(name in vars(k) for k in type(instance).__mro__ if k is not base and issubclass(k, base))


def cached_file(instance: Any, file_idx: Any) -> str:
    """The file ``FileTransfer.get_cached(file_idx)`` read."""
    return str(Path(getattr(instance, "hidden_states_path", ".")) / f"hs_{file_idx}.safetensors")


def generated_file(params: Any) -> str:
    """What ``FileTransfer.get_generated(params)`` read: the server's path, else its handle."""
    if isinstance(params, dict):
        return str(params.get("hidden_states_path") or params.get("handle") or params)
    return str(params)



@register
class FileTransferRefusesFp8(Patch):
    """A trainer started with ``--hidden-states-backend file`` against a server started with hs-connectors
    0.9.0's fp8 backend: ``transfer.py`` ``FileTransfer`` returns the fp8 rows and their per-token scales as
    they are, and speculators 0.9.0's ``CollateFn`` casts the rows to bf16 without the scales - silent: rows
    off by their token's scale (max|diff|/max|ref| 2.18e3 in the proof); now refused naming the file and the
    backend to use."""

    id = "file-transfer-refuses-fp8"
    proof = Proof("wrong-values", PROOF, r"WRONG file backend on fp8 files: max\|diff\|/max\|ref\| = \S+ > \S+")
    summary = ("hs-connectors' file backend refuses hidden-state files its fp8 connector wrote (they need "
               "--hidden-states-backend fp8), naming the file, instead of handing the trainer unscaled fp8 rows")
    upstream = ("hs-connectors 0.9.0 transfer.py FileTransfer.get_cached/get_generated return fp8 payloads as is; "
                "speculators 0.9.0 CollateFn casts them to bf16 without their scales (silent wrong rows)")
    target = f"{TRANSFER}:FileTransfer"
    requires = {"hs-connectors": ">=0.9,<0.10"}
    side = "driver"

    def check(self, module: ModuleType) -> None:
        cls = guard.attr(module, "FileTransfer")
        guard.has_params(cls.get_cached, f"{TRANSFER}.FileTransfer.get_cached", "file_idx")
        guard.has_params(cls.get_generated, f"{TRANSFER}.FileTransfer.get_generated", "hs_transfer_params")
        guard.has_attrs(module, TRANSFER, "FP8Transfer")
        if "SCALES_KEY" in guard.source(cls, f"{TRANSFER}.FileTransfer"):
            raise NotNeeded("FileTransfer looks at the fp8 scales itself")

    def install(self, module: ModuleType, changes: Changes) -> None:
        base, patch_id = module.FileTransfer, self.id

        def get_cached(wrapped: Any, instance: Any, args: tuple, kwargs: dict) -> Any:
            sample = wrapped(*args, **kwargs)
            if instance is None or not reads_plainly(instance, base, "get_cached"):
                return sample
            idx = args[0] if args else kwargs.get("file_idx")
            return refuse_scaled_payload(sample, cached_file(instance, idx), patch_id)

        def get_generated(wrapped: Any, instance: Any, args: tuple, kwargs: dict) -> Any:
            sample = wrapped(*args, **kwargs)
            if instance is None or not reads_plainly(instance, base, "get_generated"):
                return sample
            params = args[0] if args else kwargs.get("hs_transfer_params")
            return refuse_scaled_payload(sample, generated_file(params), patch_id)

        changes.wrap(base, "get_cached", get_cached)
        changes.wrap(base, "get_generated", get_generated)
