"""ehs-capture's room check for its store on a CUDA device (the rest of the capture runs on the
CPU engine: tests/engine/test_extract_hidden_states.py)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

torch = pytest.importorskip("torch")

from spec_compat.patches.hidden_states.ehs_capture import check_room  # noqa: E402


def test_host_memory_is_not_checked(monkeypatch):
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda *a: pytest.fail("queried CUDA for a CPU store"))
    check_room(10**15, torch.device("cpu"))
    check_room(10**15, "cpu")


def test_a_store_larger_than_the_free_memory_is_refused_with_the_sizes(monkeypatch):
    asked = []
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda dev: asked.append(dev) or (3 * 2**30, 141 * 2**30))
    cuda = SimpleNamespace(type="cuda", index=0)
    check_room(3 * 2**30, cuda)  # fits exactly
    with pytest.raises(RuntimeError, match=r"needs 3\.50 GiB .* 3\.00 GiB are free .*--gpu-memory-utilization"):
        check_room(int(3.5 * 2**30), cuda)
    assert asked == [cuda, cuda]
