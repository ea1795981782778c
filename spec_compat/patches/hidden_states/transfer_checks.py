"""hs-connectors' ``file`` backend reading files its ``fp8`` connector wrote (trainer side, any vLLM).

hs-connectors 0.9.0 ``transfer.py`` ``FileTransfer.get_cached`` / ``get_generated`` return whatever
the file holds; ``FP8Transfer`` (the ``fp8`` backend) dequantizes. A trainer started with
``--hidden-states-backend file`` against an fp8 server gets float8 rows and their scales, and
speculators 0.9.0's ``CollateFn`` casts the rows to bf16 unscaled: silent wrong data.
"""

from __future__ import annotations

from pathlib import Path
from types import ModuleType
from typing import Any

from ...core.proof import Proof
from ...core.registry import Changes, NotNeeded, Patch, register
from ...shims.hidden_states.transfer_checks import refuse_scaled_payload
from .. import _guards as guard

TRANSFER = "hs_connectors.transfer"
PROOF = "tests/server/test_backend_mismatch.py::test_fp8_files_read_as_plain_files_fail_only_without_this_patch"
READS = ("get_cached", "get_generated")


@register
class FileTransferRefusesFp8(Patch):
    """hs-connectors 0.9.0 transfer.py ``FileTransfer``: fp8 payloads (rows + per-token scales) pass
    through the ``file`` backend; speculators' collate casts them to bf16 unscaled - wrong rows, no error."""

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
        base = module.FileTransfer
        patch_id = self.id

        def plain(instance: Any, name: str) -> bool:
            """The instance reads with FileTransfer's own method (a subclass such as FP8Transfer that
            overrides it post-processes the payload and is not checked)."""
            return not any(name in vars(k) for k in type(instance).__mro__ if k is not base and issubclass(k, base))

        def get_cached(wrapped: Any, instance: Any, args: tuple, kwargs: dict) -> Any:
            sample = wrapped(*args, **kwargs)
            if instance is None or not plain(instance, "get_cached"):
                return sample
            idx = args[0] if args else kwargs.get("file_idx")
            where = str(Path(getattr(instance, "hidden_states_path", ".")) / f"hs_{idx}.safetensors")
            return refuse_scaled_payload(sample, where, patch_id)

        def get_generated(wrapped: Any, instance: Any, args: tuple, kwargs: dict) -> Any:
            sample = wrapped(*args, **kwargs)
            if instance is None or not plain(instance, "get_generated"):
                return sample
            params = args[0] if args else kwargs.get("hs_transfer_params") or {}
            where = str(params.get("hidden_states_path") or params.get("handle") or params) if isinstance(
                params, dict) else str(params)
            return refuse_scaled_payload(sample, where, patch_id)

        changes.wrap(base, "get_cached", get_cached)
        changes.wrap(base, "get_generated", get_generated)
