"""``method: extract_hidden_states`` accepted by vLLM 0.15/0.16's configuration.

vLLM 0.16 ``config/speculative.py:45`` has no such method: ``SpeculativeConfig`` fails with a
pydantic ``literal_error`` on ``method`` (vLLM 0.17 added it, PR #33736).  Here no speculative
config is built for it (no drafter runs): its layer ids are checked against the target's text
config and handed to the hidden-states connector, and the engine runs eagerly.

Behaviour beside this declaration: :mod:`.layer_ids` (the ids checked), :mod:`.connector` (the KV
connector vLLM loads as ``ExampleHiddenStatesConnector``; imports vLLM, so not imported here) and
:mod:`.fp8_rows` (its device-side fp8 rows for hs-connectors' fp8 writer).
"""

from __future__ import annotations

import logging
import os
import tempfile
from types import ModuleType
from typing import Any

from ....core.proof import Proof
from ....core.registry import Changes, Patch, TargetChanged, register
from ....shims.hidden_states.contract import CONNECTOR_NAME, METHOD, SETTINGS_KEY
from ... import _guards as guard
from .. import VLLM_WITHOUT_EHS

log = logging.getLogger("spec_compat")

SERVER_PROOF = "tests/engine/test_extract_hidden_states_proof.py::test_fails_with_only_this_server_patch_disabled"
#: where the connector class lives (vLLM's factory imports ``kv_connector_module_path``)
CONNECTOR_MODULE = "spec_compat.patches.hidden_states.ehs_config.connector"
#: the request, kept on the target's ModelConfig between SpeculativeConfig and VllmConfig
_REQUEST = "_spec_compat_extract_hidden_states"


def requested_layer_ids(spec: dict[str, Any]) -> Any:
    """The layer ids of an ``extract_hidden_states`` speculative config; ValueError for any
    other key or value than upstream's contract accepts."""
    extra = sorted(set(spec) - {"method", "num_speculative_tokens", "draft_model_config",
                                "target_model_config", "target_parallel_config"})
    if extra:
        raise ValueError(f"spec_compat[ehs-config]: method {METHOD!r} takes only num_speculative_tokens and "
                         f"draft_model_config.hf_config.eagle_aux_hidden_state_layer_ids; got also {extra}")
    n = spec.get("num_speculative_tokens", 1)
    if n != 1:
        raise ValueError(f"spec_compat[ehs-config]: method {METHOD!r} needs num_speculative_tokens = 1, got {n!r}")
    draft = spec.get("draft_model_config")
    hf = draft.get("hf_config") if isinstance(draft, dict) else None
    if not isinstance(hf, dict) or "eagle_aux_hidden_state_layer_ids" not in hf:
        raise ValueError(f"spec_compat[ehs-config]: method {METHOD!r} needs draft_model_config = {{\"hf_config\": "
                         "{\"eagle_aux_hidden_state_layer_ids\": [...]}}")
    return hf["eagle_aux_hidden_state_layer_ids"]


def storage_dir(extra: dict[str, Any]) -> str:
    """``shared_storage_path``, created if missing and checked writable (a probe file)."""
    path = extra.get("shared_storage_path")
    if not isinstance(path, str) or not path:
        raise ValueError(f"spec_compat[ehs-config]: kv_connector_extra_config needs shared_storage_path (a directory), "
                         f"got {path!r}")
    try:
        os.makedirs(path, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=path, prefix=".spec-compat-probe-"):
            pass
    except OSError as exc:
        raise ValueError(f"spec_compat[ehs-config]: the hidden-states directory {path!r} is not writable: "
                         f"{type(exc).__name__}: {exc}") from None
    return os.path.abspath(path)


def check_connector(kv: Any) -> bool:
    """The method's ``--kv-transfer-config``: ``ExampleHiddenStatesConnector``, or a class of
    ``kv_connector_module_path`` that subclasses it (hs-connectors' ``FP8HiddenStatesConnector``) or
    reads vLLM 0.17's hidden-states cache (hs-connectors' ``MooncakeHiddenStatesConnector``);
    ValueError naming what was given otherwise (before any weights load).  True when the
    connector writes files (the backport's writer: ``shared_storage_path`` is needed)."""
    got = None if kv is None else kv.kv_connector
    want = f"'{{\"kv_connector\": \"{CONNECTOR_NAME}\", ...}}'"
    if kv is None or not got:
        raise ValueError(f"spec_compat[ehs-config]: method {METHOD!r} writes through --kv-transfer-config {want} "
                         f"(or a subclass of it); got kv_connector {got!r}")
    path = kv.kv_connector_module_path
    if got == CONNECTOR_NAME and path in (None, CONNECTOR_MODULE):
        return True
    if not path:
        raise ValueError(f"spec_compat[ehs-config]: method {METHOD!r} writes through --kv-transfer-config {want}, "
                         f"or a subclass named with kv_connector_module_path; got kv_connector {got!r} without a module path")
    import importlib

    try:
        cls = getattr(importlib.import_module(path), got, None)
    except Exception as exc:
        raise ValueError(
            f"spec_compat[ehs-config]: kv_connector {got!r}: kv_connector_module_path {path!r} does not import on this "
            f"vLLM ({type(exc).__name__}: {exc}). On vLLM <0.17 spec-compat serves method {METHOD!r} through its "
            f"{CONNECTOR_NAME} backport, its subclasses (hs-connectors' fp8 backend) and connectors that read "
            "vLLM 0.17's hidden-states cache with extract_from_kv_cache (hs-connectors' mooncake backend)") from None
    from ....shims.hidden_states.cache_group import reads_cache_group
    from .connector import HiddenStatesConnector

    if isinstance(cls, type) and reads_cache_group(cls):
        return False  # gets the store's tensor as the cache-only layer's KV cache (ehs-capture, ehs-cache-group)
    if not (isinstance(cls, type) and issubclass(cls, HiddenStatesConnector)):
        raise ValueError(
            f"spec_compat[ehs-config]: kv_connector {got!r} of {path!r} is not a subclass of {CONNECTOR_NAME}: on this "
            f"vLLM method {METHOD!r} writes through {CONNECTOR_NAME} and its subclasses (e.g. hs-connectors' "
            f"FP8HiddenStatesConnector), which spec-compat backports, or through connectors that read vLLM 0.17's "
            f"hidden-states cache with extract_from_kv_cache (hs-connectors' MooncakeHiddenStatesConnector); "
            + ("not found in that module" if cls is None else f"{got} derives from "
               + ", ".join(b.__name__ for b in cls.__mro__[1:4])))
    return True


def _speculative_config_new(cls: Any, *args: Any, **kwargs: Any) -> Any:
    """``SpeculativeConfig(method="extract_hidden_states", ...)`` builds nothing (None, as
    without ``--speculative-config``); the checked request rides on the target's ModelConfig."""
    if kwargs.get("method") != METHOD:
        return object.__new__(cls)
    from .layer_ids import check_layer_ids

    model = kwargs.get("target_model_config")
    if model is None:
        raise ValueError(f"spec_compat[ehs-config]: method {METHOD!r} needs the target model's configuration")
    ids = check_layer_ids(requested_layer_ids(kwargs), int(model.hf_text_config.num_hidden_layers))
    parallel = kwargs.get("target_parallel_config")
    pp = getattr(parallel, "pipeline_parallel_size", 1)
    if pp != 1:
        raise ValueError(f"spec_compat[ehs-config]: method {METHOD!r} needs pipeline_parallel_size = 1, got {pp}")
    object.__setattr__(model, _REQUEST, list(ids))
    model.enforce_eager = True  # the capture hooks read each step's slots at run time
    return None


def _vllm_config_post_init(wrapped: Any, config: Any, args: tuple, kwargs: dict) -> Any:
    model = config.model_config
    ids = getattr(model, _REQUEST, None) if model is not None else None
    if ids is not None:
        kv = config.kv_transfer_config
        files = check_connector(kv)
        extra = kv.kv_connector_extra_config
        text = model.hf_text_config
        extra[SETTINGS_KEY] = {"layer_ids": list(ids), "num_hidden_layers": int(text.num_hidden_layers),
                               "hidden_size": int(text.hidden_size), "storage": storage_dir(extra) if files else None}
        if kv.kv_connector_module_path is None:
            kv.kv_connector_module_path = CONNECTOR_MODULE
        log.info("spec_compat: extract_hidden_states: layer ids %s of N=%d, hidden %d, %s; eager",
                 ids, text.num_hidden_layers, text.hidden_size,
                 f"files in {extra[SETTINGS_KEY]['storage']}" if files else f"rows to {kv.kv_connector}")
    return wrapped(*args, **kwargs)


@register
class ExtractHiddenStatesConfig(Patch):
    """speculators >= 0.5 launch ``vllm serve --speculative_config '{"method": "extract_hidden_states", ...}'
    --kv_transfer_config '{"kv_connector": "ExampleHiddenStatesConnector", ...}'``; vLLM 0.15/0.16
    ``config/speculative.py:45`` has no such method (nor ``kv_connector/factory.py:115`` such a connector)
    - loud: ``1 validation error for SpeculativeConfig ... method Input should be 'ngram', ...`` (both
    arrived in vLLM 0.17, PR #33736)."""

    id = "ehs-config"
    proof = Proof("fails", SERVER_PROOF, r"ValidationError: \d+ validation errors? for SpeculativeConfig\nmethod\n  Input should be [^\n]*\[type=literal_error, input_value='extract_hidden_states'")
    summary = ("--speculative-config method extract_hidden_states: layer ids checked (0..N), no drafter, "
               "eager; ExampleHiddenStatesConnector resolves to spec-compat's file writer")
    upstream = "vLLM <=0.16 config/speculative.py:45 method literal lacks extract_hidden_states (added in 0.17)"
    target = "vllm.config:VllmConfig"
    requires = {"vllm": VLLM_WITHOUT_EHS}
    side = "server"

    def check(self, module: ModuleType) -> None:
        vllm_config = guard.attr(module, "VllmConfig")
        spec = guard.attr(module, "SpeculativeConfig")
        guard.has_attrs(vllm_config, "VllmConfig", "__post_init__")
        if "__new__" in vars(spec):
            raise TargetChanged("SpeculativeConfig defines its own __new__")
        fields = getattr(spec, "__dataclass_fields__", {})
        missing = [f for f in ("method", "target_model_config", "target_parallel_config") if f not in fields]
        if missing:
            raise TargetChanged(f"SpeculativeConfig has no field {', '.join(missing)}")
        kv = guard.attr(module, "KVTransferConfig")
        kv_fields = getattr(kv, "__dataclass_fields__", {})
        if "kv_connector_module_path" not in kv_fields or "kv_connector_extra_config" not in kv_fields:
            raise TargetChanged("KVTransferConfig has no kv_connector_module_path / kv_connector_extra_config")

    def install(self, module: ModuleType, changes: Changes) -> None:
        # a replacement, not a wrapper: object.__new__ takes no arguments, and None must not
        # reach __init__ (Python skips __init__ when __new__ returns a non-instance)
        changes.setattr(module.SpeculativeConfig, "__new__", _speculative_config_new)
        changes.wrap(module.VllmConfig, "__post_init__", _vllm_config_post_init)
