"""``driver-torch-threads``: the switch, the thread-count block (real torch), and the patch's
own class installed on a fake generator module in a fresh registry.  That the patch pays off
on the real engine is benchmarks/capture_overhead.py's to show (P2); that the rows stay exact
with it is the engine suite's (it is on by default there)."""

from __future__ import annotations

import threading

import pytest

from spec_compat.patches.extraction.driver_torch_threads import DriverTorchThreads
from spec_compat.core.registry import Registry, Status
from spec_compat.core.switches import DRIVER_THREADS_VAR, parse_driver_threads
from spec_compat.patches.extraction.driver_torch_threads import torch_threads
from spec_compat.core.switches import SwitchError

torch = pytest.importorskip("torch")


@pytest.fixture
def two_threads():
    """torch at 2 intra-op threads for the test, the session's count given back after."""
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    yield
    torch.set_num_threads(before)


@pytest.mark.parametrize("raw, expected", [(None, 1), ("", 1), ("  ", 1), ("1", 1), ("3", 3), (" 8 ", 8),
                                           ("keep", None), ("KEEP", None)])
def test_switch_values(raw, expected):
    assert parse_driver_threads(raw) == expected


@pytest.mark.parametrize("raw", ["0", "-1", "1.5", "two", "2 threads", "+2", "1,2"])
def test_malformed_switch_names_the_variable(raw):
    with pytest.raises(SwitchError, match=DRIVER_THREADS_VAR) as exc:
        parse_driver_threads(raw)
    assert repr(raw) in str(exc.value)


def test_block_runs_with_n_threads_and_restores(two_threads):
    with torch_threads(torch, 1):
        assert torch.get_num_threads() == 1
    assert torch.get_num_threads() == 2


def test_block_restores_after_an_error(two_threads):
    with pytest.raises(RuntimeError, match="boom"):
        with torch_threads(torch, 1):
            raise RuntimeError("boom")
    assert torch.get_num_threads() == 2


def test_block_never_raises_the_callers_count():
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        with torch_threads(torch, 4):
            assert torch.get_num_threads() == 1
        assert torch.get_num_threads() == 1
    finally:
        torch.set_num_threads(before)


def test_nested_and_concurrent_blocks_restore_the_outermost_count(two_threads):
    entered, release = threading.Barrier(2), threading.Event()
    seen: list[int] = []

    def worker() -> None:
        with torch_threads(torch, 1):
            entered.wait()
            release.wait(5)
            seen.append(torch.get_num_threads())

    t = threading.Thread(target=worker)
    t.start()
    with torch_threads(torch, 1):
        entered.wait()
        with torch_threads(torch, 1):  # nested in the same thread
            assert torch.get_num_threads() == 1
        assert torch.get_num_threads() == 1  # the inner block did not restore early
        release.set()
        t.join(5)
    assert seen == [1]
    assert torch.get_num_threads() == 2


# ---------------------------------------------------------------- the patch on a fake target


class FakeGenerator:
    def __init__(self) -> None:
        self.calls = 0

    def generate(self, token_ids):
        self.calls += 1
        if token_ids == "fail":
            raise ValueError("engine said no")
        return [{"threads": torch.get_num_threads(), "ids": token_ids}]


def _registry(fake_module, generator: type | None = None):
    """A fresh registry holding the patch's own class, re-pointed at a fake generator module."""
    if torch.cuda.is_available():
        pytest.skip("driver-torch-threads is not needed on a CUDA platform")
    generator = generator or type("VllmHiddenStatesGenerator", (FakeGenerator,), {})
    mod = fake_module(VllmHiddenStatesGenerator=generator)
    cls = type("DriverTorchThreads", (DriverTorchThreads,),
               {"target": f"{mod.__name__}:VllmHiddenStatesGenerator", "requires": {}})
    reg = Registry()
    reg.register(cls)
    return reg, mod


def _status(reg: Registry):
    (rec,) = reg.records()
    return rec.status, rec.reason


def test_patch_runs_generate_with_one_thread(fake_module, two_threads, monkeypatch):
    monkeypatch.delenv(DRIVER_THREADS_VAR, raising=False)
    reg, mod = _registry(fake_module)
    original = mod.VllmHiddenStatesGenerator.generate
    reg.apply(environ={})
    try:
        assert _status(reg)[0] is Status.APPLIED
        gen = mod.VllmHiddenStatesGenerator()
        assert gen.generate([[1, 2]]) == [{"threads": 1, "ids": [[1, 2]]}]
        assert torch.get_num_threads() == 2
        with pytest.raises(ValueError, match="engine said no"):
            gen.generate("fail")
        assert torch.get_num_threads() == 2 and gen.calls == 2
    finally:
        reg.revert()
    assert mod.VllmHiddenStatesGenerator.generate is original
    assert mod.VllmHiddenStatesGenerator().generate([[3]]) == [{"threads": 2, "ids": [[3]]}]


def test_patch_takes_the_count_from_the_switch(fake_module, two_threads, monkeypatch):
    torch.set_num_threads(4)
    monkeypatch.setenv(DRIVER_THREADS_VAR, "3")
    reg, mod = _registry(fake_module)
    reg.apply(environ={})
    try:
        assert mod.VllmHiddenStatesGenerator().generate([[1]])[0]["threads"] == 3
        assert torch.get_num_threads() == 4
    finally:
        reg.revert()


@pytest.mark.parametrize("raw, status, in_reason", [("keep", Status.NOT_NEEDED, ["keep"]),
                                                     ("lots", Status.FAILED, [DRIVER_THREADS_VAR, "'lots'"])])
def test_switch_off_or_malformed_leaves_generate_alone(fake_module, monkeypatch, raw, status, in_reason):
    monkeypatch.setenv(DRIVER_THREADS_VAR, raw)
    reg, mod = _registry(fake_module)
    original = mod.VllmHiddenStatesGenerator.generate
    reg.apply(environ={})
    try:
        got, reason = _status(reg)
        assert got is status and all(x in reason for x in in_reason)
        assert mod.VllmHiddenStatesGenerator.generate is original
    finally:
        reg.revert()


def test_generate_without_token_ids_is_target_changed(fake_module):
    drifted = type("VllmHiddenStatesGenerator", (), {"generate": lambda self, prompts: prompts})
    reg, _ = _registry(fake_module, drifted)
    reg.apply(environ={})
    try:
        assert _status(reg)[0] is Status.TARGET_CHANGED
    finally:
        reg.revert()
