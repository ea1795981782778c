"""One reading of the Mooncake master's address for both of its callers: the configuration check
(``mooncake-master-at-start``: ``master_address`` of the ``KVTransferConfig`` being built) and the API
server's answer (``mooncake-answer-after-put``: ``mooncake_settings`` of the engine's
``kv_transfer_config``, then ``master``).  They used to parse it twice and had diverged (``dict`` vs
``Mapping``): a Mapping that is not a dict gave the check the default master and the answer the
configured one.  Both read the configuration by attribute (``getattr``), so a namespace stands for vLLM's
``KVTransferConfig`` here (importing vLLM's config would apply the global registry's patches)."""

from __future__ import annotations

from types import MappingProxyType, SimpleNamespace

import pytest

from spec_compat.shims.hidden_states.mooncake_master import (
    DEFAULT_MASTER, MOONCAKE_CONNECTOR, MOONCAKE_MODULE, master, master_address, mooncake_settings,
)

ADDRESS = "10.0.0.5:50051"


def _config(extra, connector=MOONCAKE_CONNECTOR, module=None):
    return SimpleNamespace(kv_connector=connector, kv_connector_module_path=module, kv_connector_extra_config=extra)


CASES = [
    # (configuration, the address both callers must read; None: not hs-connectors' Mooncake connector)
    (_config({"mooncake": {"master_server_address": ADDRESS}}), ADDRESS),
    (_config(MappingProxyType({"mooncake": MappingProxyType({"master_server_address": ADDRESS})})), ADDRESS),
    (_config({"mooncake": MappingProxyType({"master_server_address": ADDRESS})}), ADDRESS),
    (_config({"mooncake": {"master_server_address": ""}}), DEFAULT_MASTER),
    (_config({"mooncake": {"protocol": "tcp"}}), DEFAULT_MASTER),
    (_config({"mooncake": "not a mapping"}), DEFAULT_MASTER),
    (_config({}), DEFAULT_MASTER),
    (_config(None), DEFAULT_MASTER),
    (_config({}, connector="X", module=MOONCAKE_MODULE), DEFAULT_MASTER),
    (_config({"mooncake": {"master_server_address": ADDRESS}}, connector="FP8HiddenStatesConnector"), None),
    (None, None),
]


@pytest.mark.parametrize("config, expected", CASES)
def test_the_check_and_the_answer_read_one_address(config, expected):
    assert master_address(config) == expected  # the configuration check's reading
    settings = mooncake_settings(config)  # the API server's reading
    assert (None if settings is None else master(settings)) == expected

