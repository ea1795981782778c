"""speculators 0.9.0's check of a hidden-states file, on hs-connectors' fp8 payloads.

``generate-offline-data --validate-outputs`` loads each file and runs
``speculators.data_generation.offline.check_hidden_states``, whose finiteness check is
``torch.aminmax`` of the raw ``hidden_states``: with the fp8 backend (hs-connectors 0.9.0,
``hidden_states`` float8_e4m3fn + ``hidden_states_scales``) that raises ``NotImplementedError:
"aminmax_cpu" not implemented for 'Float8_e4m3fn'`` for every sample, on any machine (files load on
the CPU).  Here an fp8 payload is checked as the trainer reads it: dequantized with its scales.
"""

from __future__ import annotations

from types import ModuleType
from typing import Any

from ...core.proof import Proof
from ...core.registry import Changes, NotNeeded, Patch, register
from .. import _guards as guard

OFFLINE = "speculators.data_generation.offline"
#: hs-connectors' key of the per-token fp32 scales (hs_connectors.fp8_utils.SCALES_KEY)
SCALES_KEY = "hidden_states_scales"

PROOF = "tests/server/test_hs_connectors.py::test_fp8_validation_fails_with_only_this_patch_disabled"


def dequantized_view(data: Any) -> Any:
    """``data`` with an fp8 ``hidden_states`` replaced by its float32 dequantization
    (``fp8 * scales``, hs-connectors' formula; the scales key dropped), else ``data`` itself."""
    hs = data.get("hidden_states") if isinstance(data, dict) else None
    if hs is None or "float8" not in str(getattr(hs, "dtype", "")):
        return data
    import torch

    view = dict(data)
    scales = view.pop(SCALES_KEY, None)
    values = hs.to(torch.float32)
    view["hidden_states"] = values * scales.to(torch.float32) if scales is not None else values
    return view


def _check_hidden_states(wrapped: Any, _instance: Any, args: tuple, kwargs: dict) -> Any:
    if args:
        args = (dequantized_view(args[0]), *args[1:])
    elif "data" in kwargs:
        kwargs = {**kwargs, "data": dequantized_view(kwargs["data"])}
    return wrapped(*args, **kwargs)


@register
class Fp8PayloadValidation(Patch):
    """speculators 0.9.0 ``generate-offline-data --validate-outputs`` on hs-connectors' fp8 files:
    ``data_generation/offline.py`` ``check_hidden_states`` runs ``torch.aminmax`` on the raw float8_e4m3fn
    tensor - loud: ``NotImplementedError: "aminmax_cpu" not implemented for 'Float8_e4m3fn'`` for every
    sample, on any machine (files load on the CPU); now checked dequantized with their scales."""

    id = "fp8-payload-validation"
    proof = Proof("fails", PROOF, r"NotImplementedError: \"aminmax_cpu\" not implemented for 'Float8_e4m3fn'")
    summary = ("check_hidden_states takes hs-connectors' fp8 payloads: they are checked dequantized with their "
               "per-token scales (as the trainer reads them); other payloads unchanged")
    upstream = ("speculators 0.9.0 data_generation/offline.py check_hidden_states: torch.aminmax on float8_e4m3fn "
                "-> NotImplementedError for every fp8 sample under generate-offline-data --validate-outputs")
    target = f"{OFFLINE}:check_hidden_states"
    requires = {"speculators": ">=0.9,<0.10"}

    def check(self, module: ModuleType) -> None:
        fn = guard.attr(module, "check_hidden_states")
        guard.exact_params(fn, f"{OFFLINE}.check_hidden_states", "data", "tokens")
        if "aminmax" not in guard.source(fn, f"{OFFLINE}.check_hidden_states"):
            raise NotNeeded("check_hidden_states no longer reduces the raw tensor with aminmax")

    def install(self, module: ModuleType, changes: Changes) -> None:
        changes.wrap(module, "check_hidden_states", _check_hidden_states)
