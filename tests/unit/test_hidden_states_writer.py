"""shims.hidden_states.writer (the background writer of the extraction backport) and the API
server's wait for its files (shims.hidden_states.http_errors.wait_written).  Real files, real
safetensors, real threads; a write is held back by wrapping the write function."""

from __future__ import annotations

import asyncio
import fcntl
import os
import threading
import time

import pytest

torch = pytest.importorskip("torch")

from spec_compat.shims.hidden_states import writer as writer_mod  # noqa: E402
from spec_compat.shims.hidden_states.files import HiddenStatesWriteError, error_path, lock_path  # noqa: E402
from spec_compat.shims.hidden_states.http_errors import wait_written  # noqa: E402
from spec_compat.shims.hidden_states.writer import (  # noqa: E402
    FAILED, PENDING, WRITTEN, BackgroundWriter, outcome,
)


def tensors(n: int = 5):
    rows = torch.arange(n * 2 * 3, dtype=torch.float32).reshape(n, 2, 3)
    return {"hidden_states": rows, "token_ids": torch.arange(n, dtype=torch.int64)}


def lock_is_held(path: str) -> bool:
    with open(lock_path(path)) as f:
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return True
        fcntl.flock(f, fcntl.LOCK_UN)
        return False


@pytest.fixture
def gate(monkeypatch):
    """Writes wait until ``gate.set()``; ``gate.started`` counts writes that began."""
    event = threading.Event()
    event.started = 0
    real = writer_mod.write_atomically

    def held(*args, **kwargs):
        event.started += 1
        assert event.wait(30), "the test never released the write"
        return real(*args, **kwargs)

    monkeypatch.setattr(writer_mod, "write_atomically", held)
    return event


def test_the_lock_is_held_until_the_file_is_in_place(tmp_path, gate):
    from safetensors.torch import load_file

    w = BackgroundWriter()
    path = str(tmp_path / "r.safetensors")
    w.submit(path, tensors(), {"layer_ids": "1,2"})
    # the step returned: the lock exists and is held, the file is not there yet
    assert lock_is_held(path) and not os.path.exists(path) and outcome(path) == (PENDING, None)
    gate.set()
    assert w.drain(timeout=30)
    assert outcome(path) == (WRITTEN, None) and not lock_is_held(path)
    data = load_file(path)
    assert torch.equal(data["hidden_states"], tensors()["hidden_states"])
    assert data["token_ids"].tolist() == [0, 1, 2, 3, 4]
    assert sorted(os.listdir(tmp_path)) == ["r.safetensors", "r.safetensors.lock"]  # no temporary left
    assert (w.written, w.failed) == (1, 0)
    w.close()
    w.close()  # idempotent


def test_a_stale_file_and_marker_are_removed_in_the_step(tmp_path, gate):
    path = str(tmp_path / "r.safetensors")
    open(path, "w").write("old")
    open(error_path(path), "w").write("old failure")
    w = BackgroundWriter()
    w.submit(path, tensors())
    # a reader polling for the file must not take the old one while the new write is queued
    assert outcome(path) == (PENDING, None)
    gate.set()
    assert w.drain(timeout=30) and outcome(path) == (WRITTEN, None) and os.path.getsize(path) > 3


def test_submit_waits_while_max_pending_writes_are_queued(tmp_path, gate):
    w = BackgroundWriter(max_pending=1)
    w.submit(str(tmp_path / "a.safetensors"), tensors())
    second = threading.Thread(target=w.submit, args=(str(tmp_path / "b.safetensors"), tensors()))
    second.start()
    time.sleep(0.3)
    assert second.is_alive() and w.pending == 1  # back-pressure: the step waits for a free slot
    gate.set()
    second.join(30)
    assert not second.is_alive() and w.drain(timeout=30) and w.written == 2


def test_a_failed_write_is_marked_the_lock_released_and_the_thread_keeps_going(tmp_path):
    w = BackgroundWriter()
    bad = str(tmp_path / "bad.safetensors")
    w.submit(bad, {"hidden_states": "not a tensor"})
    good = str(tmp_path / "good.safetensors")
    w.submit(good, tensors())
    assert w.drain(timeout=30)
    state, message = outcome(bad)
    assert state == FAILED and message.startswith("spec_compat[ehs-capture]: writing") and bad in message
    assert not os.path.exists(bad) and not lock_is_held(bad)
    assert outcome(good) == (WRITTEN, None) and (w.written, w.failed) == (1, 1)
    assert not [f for f in os.listdir(tmp_path) if f.endswith(".tmp")]


def test_a_broken_directory_fails_inside_the_step(tmp_path):
    storage = tmp_path / "hs"
    storage.write_text("a file where the directory was")
    path = str(storage / "r.safetensors")
    w = BackgroundWriter()
    with pytest.raises(HiddenStatesWriteError, match=r"writing hidden states to .*r\.safetensors failed: NotADirectoryError"):
        w.submit(path, tensors())
    assert w.pending == 0 and os.listdir(tmp_path) == ["hs"]


def test_max_pending_must_be_positive():
    with pytest.raises(ValueError, match="max_pending must be >= 1, got 0"):
        BackgroundWriter(max_pending=0)


def test_wait_written_returns_once_the_file_is_in_place_and_removes_the_lock(tmp_path, gate):
    w = BackgroundWriter()
    path = str(tmp_path / "r.safetensors")
    w.submit(path, tensors())
    threading.Timer(0.2, gate.set).start()
    t0 = time.monotonic()
    assert asyncio.run(wait_written(path, timeout=30)) is None
    assert time.monotonic() - t0 >= 0.15 and os.path.isfile(path)
    assert not os.path.exists(lock_path(path))  # a lock-aware client finds none and reads at once
    assert w.drain(timeout=30)


def test_wait_written_reports_the_failure(tmp_path):
    w = BackgroundWriter()
    path = str(tmp_path / "r.safetensors")
    w.submit(path, {"hidden_states": torch.zeros(2, 1, 1), "token_ids": [1, 2]})  # a list: save_file refuses
    message = asyncio.run(wait_written(path, timeout=30))
    assert message is not None and message.startswith("spec_compat[ehs-capture]: writing") and path in message


def test_wait_written_stops_when_the_directory_goes_or_the_time_is_up(tmp_path):
    storage = tmp_path / "hs"
    storage.mkdir()
    path = str(storage / "r.safetensors")
    message = asyncio.run(wait_written(path, timeout=0.2))
    assert message == f"spec_compat[ehs-capture]: {path} was not written within 0.2 s (see the engine log)"
    storage.rmdir()
    message = asyncio.run(wait_written(path, timeout=30))
    assert message == (f"spec_compat[ehs-capture]: {path} was not written: "
                       f"the hidden-states directory {storage} no longer exists")


def test_the_writer_waits_for_the_rows_to_be_ready(tmp_path):
    """A device copy's event is synchronized on the writer thread, before the tensors are read."""
    order = []

    class Event:
        def synchronize(self):
            order.append("synchronize")

    real = writer_mod.write_atomically
    w = BackgroundWriter()
    path = str(tmp_path / "r.safetensors")
    try:
        writer_mod.write_atomically = lambda *a, **k: (order.append("write"), real(*a, **k))
        w.submit(path, tensors(), None, Event())
        assert w.drain(timeout=30)
    finally:
        writer_mod.write_atomically = real
    assert order == ["synchronize", "write"] and outcome(path) == (WRITTEN, None)


def test_host_rows_keeps_a_host_tensor():
    rows = torch.ones(3, 2, 4)
    host, ready = writer_mod.host_rows(rows)
    assert host is rows and ready is None


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA (the H200 device run)")
def test_host_rows_copies_a_device_tensor_to_pinned_memory_without_blocking():
    rows = torch.randn(64, 4, 1024, device="cuda", dtype=torch.bfloat16)
    want = rows.cpu()
    host, ready = writer_mod.host_rows(rows)
    rows.zero_()  # queued after the copy on the same stream: the copy still reads the old rows
    ready.synchronize()
    assert host.device.type == "cpu" and host.is_pinned() and host.dtype == torch.bfloat16
    assert torch.equal(host, want)


# -- a _write_tensors override (vLLM >= 0.17's contract; hs-connectors' FP8HiddenStatesConnector) --

def _fp8_like_override(seen):
    """An override with the upstream contract: wait on the event, save to filename, close lock_fd
    (what hs-connectors' fp8 connector does, with a stand-in quantization)."""
    from safetensors.torch import save_file

    def write(tensors_, event, filename, lock_fd):
        try:
            event.synchronize()
            seen.append(filename)
            save_file({**tensors_, "hidden_states": tensors_["hidden_states"].to(torch.bfloat16)}, filename)
        finally:
            if lock_fd is not None:
                os.close(lock_fd)

    return write


def test_an_override_writes_its_own_bytes_atomically_under_the_lock(tmp_path):
    from safetensors.torch import load_file

    seen = []
    w = BackgroundWriter()
    path = str(tmp_path / "r.safetensors")
    started, release = threading.Event(), threading.Event()
    inner = _fp8_like_override(seen)

    def held(tensors_, event, filename, lock_fd):
        started.set()
        assert release.wait(30)
        # while the override writes: its file name is a temporary, the final file is not there,
        # and the lock is held (by the writer's own fd, not only by the duplicate it was given)
        assert filename != path and os.path.dirname(filename) == str(tmp_path) and not os.path.exists(path)
        assert lock_is_held(path)
        return inner(tensors_, event, filename, lock_fd)

    w.submit(path, tensors(), {"layer_ids": "1,2"}, write=held)
    assert started.wait(30)
    release.set()
    assert w.drain(timeout=30)
    assert outcome(path) == (WRITTEN, None) and not lock_is_held(path)
    # the override's own bytes: what it writes when called directly
    direct = str(tmp_path / "direct.safetensors")
    fd = os.open(str(tmp_path / "direct.lock"), os.O_CREAT | os.O_WRONLY)
    inner(tensors(), writer_mod.HostReady(), direct, fd)
    assert open(path, "rb").read() == open(direct, "rb").read()
    assert load_file(path)["hidden_states"].dtype == torch.bfloat16
    assert sorted(os.listdir(tmp_path)) == ["direct.lock", "direct.safetensors", "r.safetensors", "r.safetensors.lock"]
    # the event handed to the override on host rows has the CUDA event's methods
    assert writer_mod.HostReady().query() is True and writer_mod.HostReady().synchronize() is None
    w.close()


def test_a_failing_override_leaves_no_file_and_marks_the_error(tmp_path):
    def broken(tensors_, event, filename, lock_fd):
        try:
            open(filename, "wb").write(b"partial")
            raise OSError(28, "No space left on device")
        finally:
            os.close(lock_fd)

    w = BackgroundWriter()
    path = str(tmp_path / "r.safetensors")
    w.submit(path, tensors(), write=broken)
    assert w.drain(timeout=30)
    state, message = outcome(path)
    assert state == FAILED and "No space left on device" in message, message
    assert not os.path.exists(path) and not lock_is_held(path)
    assert sorted(os.listdir(tmp_path)) == ["r.safetensors.error", "r.safetensors.lock"]  # temp removed
    assert (w.written, w.failed) == (0, 1)
    w.close()


def test_only_a_subclass_override_is_used():
    class Base:
        @staticmethod
        def _write_tensors(tensors_, event, filename, lock_fd):
            return "base"

    class Fp8(Base):
        @staticmethod
        def _write_tensors(tensors_, event, filename, lock_fd):
            return "fp8"

    class Plain(Base):
        pass

    class Deeper(Fp8):
        pass

    assert writer_mod.static_override(Base, Base, "_write_tensors") is None
    assert writer_mod.static_override(Plain, Base, "_write_tensors") is None
    assert writer_mod.static_override(Fp8, Base, "_write_tensors") is Fp8._write_tensors
    assert writer_mod.static_override(Deeper, Base, "_write_tensors")(None, None, "", None) == "fp8"
