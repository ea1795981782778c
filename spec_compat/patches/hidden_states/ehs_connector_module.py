"""vLLM >= 0.17's connector module path, for out-of-tree hidden-states connectors (vLLM 0.15/0.16).

hs-connectors 0.9.0's ``FP8HiddenStatesConnector`` subclasses
``vllm.distributed.kv_transfer.kv_connector.v1.example_hidden_states_connector.ExampleHiddenStatesConnector``
and overrides its static ``_write_tensors``; vLLM 0.15/0.16 have no such module (it arrived with
the extraction API in 0.17, PR #33736), so loading the fp8 backend dies with ImportError.
Here that module name is the backport's connector module (which honours ``_write_tensors``
overrides, :meth:`.HiddenStatesConnector.tensor_writer`).
"""

from __future__ import annotations

import importlib
import importlib.util
import sys
from types import ModuleType

from ...core.proof import Proof
from ...core.registry import Changes, NotNeeded, Patch, TargetChanged, register
from ...shims.hidden_states.contract import CONNECTOR_NAME
from . import VLLM_WITHOUT_EHS

#: the package vLLM >= 0.17 keeps the module in, and the module's name there
PACKAGE = "vllm.distributed.kv_transfer.kv_connector.v1"
MODULE = "example_hidden_states_connector"
#: the backport's connector module that answers to that name
BACKPORT = "spec_compat.patches.hidden_states.ehs_config.connector"

PROOF = "tests/server/test_hs_connectors.py::test_fp8_backend_fails_with_only_this_patch_disabled"


@register
class ExampleHiddenStatesConnectorModule(Patch):
    """hs-connectors 0.9.0's fp8 backend (``speculators train --hidden-states-backend fp8`` and its ``vllm serve
    --kv_transfer_config '{"kv_connector": "FP8HiddenStatesConnector", "kv_connector_module_path":
    "hs_connectors.fp8_hidden_states_connector", ...}'``) on vLLM 0.15/0.16: its connector subclasses
    ``ExampleHiddenStatesConnector`` from ``kv_connector/v1/example_hidden_states_connector.py``, which
    arrived in vLLM 0.17 (PR #33736) - loud: ``ImportError: cannot import name
    'example_hidden_states_connector' from 'vllm.distributed.kv_transfer.kv_connector.v1'`` when the server loads it."""

    id = "ehs-connector-module"
    proof = Proof("fails", PROOF, r"cannot import name 'example_hidden_states_connector' from 'vllm\.distributed\.kv_transfer\.kv_connector\.v1'")
    summary = (f"{PACKAGE}.{MODULE} is the backport's connector module: out-of-tree connectors that subclass "
               f"{CONNECTOR_NAME} (hs-connectors' FP8HiddenStatesConnector) load, their _write_tensors writes")
    upstream = ("vLLM <=0.16 lacks kv_connector/v1/example_hidden_states_connector.py (0.17, PR #33736); "
                "hs-connectors 0.9.0's fp8 connector imports ExampleHiddenStatesConnector from it")
    # the package that would hold the module (its connector base class stays where it is)
    target = f"{PACKAGE}:KVConnectorBase_V1"
    requires = {"vllm": VLLM_WITHOUT_EHS}
    side = "server"

    def check(self, module: ModuleType) -> None:
        if not hasattr(module, "__path__"):
            raise TargetChanged(f"{PACKAGE} is no longer a package")
        if not isinstance(getattr(module, "KVConnectorBase_V1", None), type):
            raise TargetChanged(f"{PACKAGE} no longer exports the class KVConnectorBase_V1")
        name = f"{PACKAGE}.{MODULE}"
        if name in sys.modules and getattr(sys.modules[name], "__name__", None) != BACKPORT:
            raise NotNeeded(f"{name} is imported already")
        if importlib.util.find_spec(name) is not None:
            raise NotNeeded(f"vLLM has {name}")

    def install(self, module: ModuleType, changes: Changes) -> None:
        backport = importlib.import_module(BACKPORT)
        name = f"{PACKAGE}.{MODULE}"
        changes.setitem(sys.modules, name, backport, label=f"sys.modules[{name!r}]")
        changes.setattr(module, MODULE, backport)
