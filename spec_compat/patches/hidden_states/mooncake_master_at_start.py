"""hs-connectors' Mooncake master checked when the server is configured (any vLLM).

hs-connectors 0.9.0 ``mooncake_hidden_states_connector.py`` sets its store up lazily (``_ensure_store``
at the first write): with the master down or its address wrong, ``vllm serve`` loads the model and
serves; the first request is answered with a handle, then the worker retries the master 20 times
(~85 s) and EngineCore dies: 'RuntimeError: Mooncake setup failed for key=... with status=-1'.
"""

from __future__ import annotations

from types import ModuleType
from typing import Any

from ...core.proof import Proof
from ...core.registry import Changes, Patch, TargetChanged, register
from .. import _guards as guard

KV_TRANSFER = "vllm.config.kv_transfer"
PROOF = "tests/server/test_mooncake_master_down.py::test_master_down_fails_late_only_without_this_patch"


@register
class MooncakeMasterAtStart(Patch):
    """``vllm serve`` with hs-connectors 0.9.0's Mooncake backend while its master is down or its address
    wrong: the connector sets its store up at the first write (``_ensure_store``), so the server loads the
    model, serves, answers the first request with a handle, retries the master for ~85 s and then
    EngineCore dies - loud, late: ``RuntimeError: Mooncake setup failed for key=127.0.0.1 with status=-1``;
    now refused at configuration (one TCP connection to ``master_server_address``), naming the address,
    before any model loads."""

    id = "mooncake-master-at-start"
    proof = Proof("fails", PROOF, r"RuntimeError: Mooncake setup failed for key=\S+ with status=-?\d+")
    summary = ("a server configured with hs-connectors' Mooncake connector refuses to start when its master "
               "does not take a TCP connection, naming the address, before any model loads")
    upstream = ("hs-connectors 0.9.0 MooncakeHiddenStatesConnector._ensure_store: store setup at the first write; "
                "master down -> the first request is answered, then EngineCore dies in get_finished")
    target = f"{KV_TRANSFER}:KVTransferConfig"
    requires = {"hs-connectors": ">=0.9,<0.10"}
    side = "server"

    def check(self, module: ModuleType) -> None:
        cls = guard.attr(module, "KVTransferConfig")
        guard.has_attrs(cls, f"{KV_TRANSFER}.KVTransferConfig", "__post_init__")
        fields = set(getattr(cls, "__dataclass_fields__", {}))
        missing = {"kv_connector", "kv_connector_module_path", "kv_connector_extra_config"} - fields
        if missing:
            raise TargetChanged(f"{KV_TRANSFER}.KVTransferConfig has no field {', '.join(sorted(missing))}")

    def install(self, module: ModuleType, changes: Changes) -> None:
        patch_id = self.id

        def post_init(wrapped: Any, instance: Any, args: tuple, kwargs: dict) -> Any:
            out = wrapped(*args, **kwargs)
            # imported here, where a configuration is checked: a process that never configures KV
            # transfer does not load the shim (nor has it among the inputs of its proofs)
            from ...shims.hidden_states.mooncake_master import check_master

            check_master(instance, patch_id)
            return out

        changes.wrap(module.KVTransferConfig, "__post_init__", post_init)
