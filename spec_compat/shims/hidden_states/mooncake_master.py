"""Whether the Mooncake master a server is configured with answers, asked before anything loads.

hs-connectors 0.9.0's Mooncake connector connects to its store only at its first write: with the
master down or mistyped, ``vllm serve`` loads the model, starts serving, answers the first request
with a handle, then retries the master for ~85 s and its EngineCore dies. One TCP connection to
``master_server_address`` at configuration time says it at once.
"""

from __future__ import annotations

import socket
from collections.abc import Mapping
from typing import Any

#: hs-connectors 0.9.0's connector (``kv_connector``) and its module (``kv_connector_module_path``)
MOONCAKE_CONNECTOR = "MooncakeHiddenStatesConnector"
MOONCAKE_MODULE = "hs_connectors.mooncake_hidden_states_connector"
#: hs-connectors' ``MooncakeStoreConfig.master_server_address`` default
DEFAULT_MASTER = "127.0.0.1:50051"


def mooncake_settings(kv_transfer_config: Any) -> dict[str, Any] | None:
    """``kv_connector_extra_config["mooncake"]`` of a configuration for hs-connectors' Mooncake
    connector (an empty dict when it names none); None for any other connector.  Any Mapping counts
    (the configuration check and the API server's answer both read it here, so they agree)."""
    connector = getattr(kv_transfer_config, "kv_connector", None)
    module = getattr(kv_transfer_config, "kv_connector_module_path", None)
    if connector != MOONCAKE_CONNECTOR and module != MOONCAKE_MODULE:
        return None
    extra = getattr(kv_transfer_config, "kv_connector_extra_config", None)
    mooncake = extra.get("mooncake") if isinstance(extra, Mapping) else None
    return dict(mooncake) if isinstance(mooncake, Mapping) else {}


def master(settings: Mapping[str, Any]) -> str:
    """The master address of Mooncake ``settings`` (hs-connectors' default when unset or empty)."""
    return str(settings.get("master_server_address") or DEFAULT_MASTER)


def master_address(kv_transfer_config: Any) -> str | None:
    """The master a KV-transfer configuration points hs-connectors' Mooncake connector at, or None
    when it configures another connector."""
    settings = mooncake_settings(kv_transfer_config)
    return None if settings is None else master(settings)


def unreachable(address: str, timeout: float = 3.0) -> str | None:
    """Why ``host:port`` takes no TCP connection within ``timeout`` seconds, or None when it does."""
    host, sep, port = address.rpartition(":")
    if not sep or not host or not port.isdigit():
        return f"{address!r} is not host:port"
    try:
        socket.create_connection((host.strip("[]"), int(port)), timeout=timeout).close()
    except OSError as exc:
        return f"{type(exc).__name__}: {exc}"
    return None


def check_master(kv_transfer_config: Any, patch_id: str, timeout: float = 3.0) -> None:
    """ValueError naming the address when the configured Mooncake master does not answer."""
    address = master_address(kv_transfer_config)
    if address is None:
        return
    why = unreachable(address, timeout)
    if why is not None:
        raise ValueError(
            f"spec_compat[{patch_id}]: the Mooncake master at {address} (kv_transfer_config "
            f"kv_connector_extra_config.mooncake.master_server_address) does not answer ({why}); hs-connectors' "
            "Mooncake connector would connect only at its first write, after answering it. Start mooncake_master "
            "first, or pass its address (speculators: --mooncake-master HOST:PORT).")
