"""hs-connectors' ``file`` backend reading files its ``fp8`` connector wrote (trainer side, any vLLM).

hs-connectors 0.9.0 ``transfer.py`` ``FileTransfer.get_cached`` / ``get_generated`` return whatever
the file holds; ``FP8Transfer`` (the ``fp8`` backend) dequantizes. A trainer started with
``--hidden-states-backend file`` against an fp8 server gets float8 rows and their scales, and
speculators 0.9.0's ``CollateFn`` casts the rows to bf16 unscaled: silent wrong data.
"""

from __future__ import annotations

from types import ModuleType
from typing import Any

from ...core.proof import Proof
from ...core.registry import Changes, NotNeeded, Patch, register
from ...shims.hidden_states.transfer_checks import cached_file, generated_file, reads_plainly, refuse_scaled_payload
from .. import _guards as guard

TRANSFER = "hs_connectors.transfer"
PROOF = "tests/server/test_backend_mismatch.py::test_fp8_files_read_as_plain_files_fail_only_without_this_patch"
READS = ("get_cached", "get_generated")


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
