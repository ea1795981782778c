"""The API server's wait for a Mooncake sample (``mooncake-answer-after-put``): each answer against a
scripted store client.  The real store, master killed and restarted: tests/server/test_mooncake_master_killed.py."""

from __future__ import annotations

import asyncio
import json
from types import SimpleNamespace

import pytest

from spec_compat.patches.hidden_states.mooncake_answer_after_put import StoreWatch
from spec_compat.shims.hidden_states.mooncake_master import mooncake_settings

PID = "mooncake-answer-after-put"
SETTINGS = {"master_server_address": "10.0.0.5:50051", "protocol": "tcp"}


class Store:
    """is_exist answers scripted per key: a list consumed one call at a time (the last one repeats)."""

    def __init__(self, answers: dict[str, list[int]], marker: bytes = b"") -> None:
        self.answers = answers
        self.marker = marker
        self.calls: list[str] = []

    def is_exist(self, key: str) -> int:
        self.calls.append(key)
        seq = self.answers.get(key, [0])
        return seq.pop(0) if len(seq) > 1 else seq[0]

    def get(self, key: str) -> bytes:
        return self.marker

    def put(self, key: str, value: bytes) -> int:
        self.calls.append("put " + key)
        return self.put_status

    def remove(self, key: str, force: bool = False) -> int:
        self.calls.append("remove " + key)
        return 0

    put_status = 0


def _wait(store, timeout: float = 2.0, opener=None):
    watch = StoreWatch(SETTINGS, PID, opener=opener or (lambda settings, pid: store))
    return asyncio.run(watch.wait_stored("req-1", timeout=timeout))


def test_a_stored_sample_is_answered_as_it_is():
    store = Store({"req-1": [0, 0, 0, 1]})
    assert _wait(store) is None
    assert store.calls.count("req-1") == 4  # it waited for the put


def test_a_dead_master_answers_503_naming_it():
    answer = _wait(Store({"req-1:error": [-900]}))
    assert answer.status == 503 and answer.err_type == "ServiceUnavailableError"
    assert answer.message.startswith(f"spec_compat[{PID}]: the Mooncake store (master 10.0.0.5:50051) does not "
                                     "answer (status -900); sample req-1 is not stored"), answer.message


def test_the_workers_error_marker_answers_500_with_its_message():
    marker = json.dumps({"error": "RuntimeError: Mooncake put_from failed for key=req-1 with status=-200"}).encode()
    answer = _wait(Store({"req-1:error": [1], "req-1": [0]}, marker))
    assert answer.status == 500
    assert "could not put sample req-1 into the Mooncake store (master 10.0.0.5:50051): RuntimeError: Mooncake " \
           "put_from failed for key=req-1 with status=-200: no space left in the store's mounted segments (the store " \
           "is full" \
        in answer.message, answer.message


def test_a_full_store_without_a_marker_answers_500_saying_so(monkeypatch):
    import spec_compat.patches.hidden_states.mooncake_answer_after_put as shim

    monkeypatch.setattr(shim, "FULL_PROBE_AFTER_S", 0.01)
    store = Store({})
    store.put_status = -200
    answer = _wait(store, timeout=5)
    assert answer.status == 500 and "sample req-1 is not in the Mooncake store (master 10.0.0.5:50051) and the " \
        "store has no room for a 1-byte object: no space left" in answer.message, answer.message


def test_a_sample_that_never_comes_answers_504(monkeypatch):
    import spec_compat.patches.hidden_states.mooncake_answer_after_put as shim

    monkeypatch.setattr(shim, "FULL_PROBE_AFTER_S", 0.01)
    store = Store({})
    answer = _wait(store, timeout=0.2)
    assert "put req-1:spec-compat-room" in store.calls and "remove req-1:spec-compat-room" in store.calls
    assert answer.status == 504 and "sample req-1 is not in the Mooncake store (master 10.0.0.5:50051) 0.2 s" \
        in answer.message, answer.message


def test_a_client_that_cannot_join_answers_503_and_joins_later():
    attempts = []

    def opener(settings, pid):
        attempts.append(settings["master_server_address"])
        if len(attempts) == 1:
            raise RuntimeError(f"spec_compat[{pid}]: Mooncake's client setup returned status -1")
        return Store({"req-1": [1]})

    watch = StoreWatch(SETTINGS, PID, opener=opener)
    first = asyncio.run(watch.wait_stored("req-1", timeout=1))
    assert first.status == 503
    assert "cannot be reached (RuntimeError: Mooncake's client setup returned status -1)" in first.message
    assert asyncio.run(watch.wait_stored("req-1", timeout=1)) is None  # the next answer sets up again
    assert attempts == ["10.0.0.5:50051"] * 2


@pytest.mark.parametrize("config, expected", [
    (SimpleNamespace(kv_connector="MooncakeHiddenStatesConnector", kv_connector_module_path=None,
                     kv_connector_extra_config={"mooncake": SETTINGS}), SETTINGS),
    (SimpleNamespace(kv_connector="X", kv_connector_module_path="hs_connectors.mooncake_hidden_states_connector",
                     kv_connector_extra_config={}), {}),
    (SimpleNamespace(kv_connector="FP8HiddenStatesConnector", kv_connector_module_path=None,
                     kv_connector_extra_config={"mooncake": SETTINGS}), None),
    (None, None),
])
def test_settings_only_for_the_mooncake_connector(config, expected):
    assert mooncake_settings(config) == expected
