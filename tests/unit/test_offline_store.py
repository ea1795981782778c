"""``offline-data-from-mooncake``: stock ``generate-offline-data`` writing files from a Mooncake store,
against a scripted reader and a stand-in of speculators 0.9.0's module.  The real store, servers and
stock command: tests/server/test_mooncake.py."""

from __future__ import annotations

import asyncio
import logging
import shutil
import sys
import textwrap
from pathlib import Path

import pytest

from spec_compat.core import switches
from spec_compat.core.registry import Changes
from spec_compat.shims.hidden_states.offline_store import MASTER_ENV, PART_PREFIX, StoreFiles, is_store_manifest

PID = "offline-data-from-mooncake"
MANIFEST = {"handle": "req-7", "version": 1, "tensors": {"hidden_states": {}}, "metadata": {"num_tokens": 3}}


def _sample():
    import torch

    return {"hidden_states": torch.arange(24, dtype=torch.float32).view(3, 2, 4),
            "token_ids": torch.tensor([5, 6, 7])}


class Reader:
    def __init__(self, sample=None, fail: Exception | None = None, delete_fails: bool = False) -> None:
        self.sample, self.fail, self.delete_fails = sample, fail, delete_fails
        self.calls: list[str] = []

    def get_sample(self, params, timeout):
        self.calls.append(f"get {params['handle']} {timeout:g}")
        if self.fail is not None:
            raise self.fail
        return self.sample

    def delete_sample(self, handle):
        self.calls.append(f"delete {handle}")
        if self.delete_fails:
            raise RuntimeError("Mooncake remove failed for key=req-7 with status=-900")


def test_only_a_store_manifest_is_taken_for_one():
    assert is_store_manifest(MANIFEST)
    assert not is_store_manifest({"hidden_states_path": "/tmp/x.safetensors"})  # file / fp8 servers
    assert not is_store_manifest({**MANIFEST, "hidden_states_path": "/tmp/x.safetensors"})
    assert not is_store_manifest({"handle": "req-7"})  # no layout: not hs-connectors' manifest
    assert not is_store_manifest(None)


def test_the_master_is_parsed_in_the_core_and_must_be_host_port():
    """The switch is parsed in core.switches (the shim reads no environment); a malformed value
    names the patch that declares it (``reads``)."""
    from spec_compat import REGISTRY

    assert MASTER_ENV == switches.MOONCAKE_MASTER_VAR
    assert switches.MOONCAKE_MASTER_VAR in REGISTRY.get(PID).reads
    assert switches.value(MASTER_ENV, {}) is None  # the shim's default: hs-connectors' 127.0.0.1:50051
    assert StoreFiles(PID, opener=lambda m: None).master == "127.0.0.1:50051"
    assert switches.value(MASTER_ENV, {MASTER_ENV: " 10.1.2.3:7000 "}) == "10.1.2.3:7000"
    for bad in ("10.1.2.3", "host:port", ":50051"):
        with pytest.raises(ValueError, match=rf"spec_compat\[{PID}\]: {MASTER_ENV}='{bad}' is not host:port"):
            switches.value(MASTER_ENV, {MASTER_ENV: bad})
    assert switches.value(switches.MOONCAKE_HOST_VAR, {}) == "localhost"
    assert switches.value(switches.MOONCAKE_HOST_VAR, {switches.MOONCAKE_HOST_VAR: "10.0.0.2"}) == "10.0.0.2"


def test_a_sample_becomes_a_file_and_leaves_the_store(tmp_path):
    import torch
    from safetensors.torch import load_file

    reader = Reader(_sample())
    opened: list[str] = []
    files = StoreFiles(PID, opener=lambda master: opened.append(master) or reader, master="h:1")
    path = Path(files.fetch(MANIFEST, tmp_path / "hs"))
    assert path.parent == tmp_path / "hs" and path.name.startswith(PART_PREFIX) and not path.name.startswith("hs_")
    got = load_file(str(path))
    assert torch.equal(got["hidden_states"], _sample()["hidden_states"])
    assert got["token_ids"].tolist() == [5, 6, 7]
    assert reader.calls == ["get req-7 120", "delete req-7"]
    files.fetch({**MANIFEST, "handle": "req-8"}, tmp_path / "hs")
    assert opened == ["h:1"]  # one reader per process


def test_a_master_that_cannot_be_joined_is_named_with_the_variable(tmp_path):
    def refuse(master):
        raise RuntimeError("Mooncake setup failed for key=localhost with status=-1")

    files = StoreFiles(PID, opener=refuse, master="10.0.0.9:50051")
    with pytest.raises(RuntimeError) as err:
        files.fetch(MANIFEST, tmp_path)
    assert str(err.value).startswith(f"spec_compat[{PID}]: the server stored this sample in a Mooncake store, "
                                     "and its master at 10.0.0.9:50051 cannot be joined (RuntimeError: Mooncake "
                                     "setup failed"), err.value
    assert f"set {MASTER_ENV}=HOST:PORT" in str(err.value)
    assert list(tmp_path.iterdir()) == []


def test_an_unreadable_sample_names_its_handle_and_writes_nothing(tmp_path):
    files = StoreFiles(PID, opener=lambda m: Reader(fail=TimeoutError("Timed out waiting for Mooncake key: req-7")))
    with pytest.raises(RuntimeError, match=rf"spec_compat\[{PID}\]: sample req-7 could not be read from the Mooncake "
                                           r"store \(master 127.0.0.1:50051\): TimeoutError: Timed out"):
        files.fetch(MANIFEST, tmp_path)
    assert list(tmp_path.iterdir()) == []
    partial = _sample()
    del partial["token_ids"]
    files = StoreFiles(PID, opener=lambda m: Reader(partial))
    with pytest.raises(RuntimeError, match=r"sample req-7 from the Mooncake store has no \['token_ids'\]"):
        files.fetch(MANIFEST, tmp_path)


def test_a_failed_write_leaves_no_part_file_and_the_sample_in_the_store(tmp_path):
    reader = Reader(_sample())

    def full_disk(sample, path):
        path.write_bytes(b"half")
        raise OSError(28, "No space left on device")

    files = StoreFiles(PID, opener=lambda m: reader, save=full_disk)
    with pytest.raises(OSError, match="No space left"):
        files.fetch(MANIFEST, tmp_path)
    assert list(tmp_path.iterdir()) == [] and reader.calls == ["get req-7 120"]  # not deleted: nothing lost


def test_a_failed_removal_keeps_the_written_file(tmp_path, caplog):
    files = StoreFiles(PID, opener=lambda m: Reader(_sample(), delete_fails=True))
    with caplog.at_level(logging.WARNING, logger="spec_compat"):
        path = Path(files.fetch(MANIFEST, tmp_path))
    assert path.is_file()
    assert "sample req-7 is written to" in caplog.text and "stays in the Mooncake store" in caplog.text


#: the shape of speculators 0.9.0's cli/generate_offline_data.py that the patch reads
_MODULE = textwrap.dedent('''
    import shutil
    from pathlib import Path

    async def generate_hidden_states_async(client, model, item, *, timeout=None, max_retries=3):
        return client(item)

    async def _worker(client, item, directory, idx):
        path, _ = await generate_hidden_states_async(client, "m", item)
        shutil.move(path, directory / f"hs_{idx}.safetensors")

    async def _generate_and_save_hidden_states(model, endpoint, preprocessed_data, output, client, items):
        directory = Path(output) if output is not None else Path(preprocessed_data) / "hidden_states"
        directory.mkdir(parents=True, exist_ok=True)
        for idx, item in enumerate(items):
            await _worker(client, item, directory, idx)
''')


def test_the_patch_writes_the_store_samples_where_the_stock_run_moves_them(tmp_path, monkeypatch):
    import inspect

    from safetensors.torch import load_file

    import spec_compat.patches.hidden_states.offline_data_from_mooncake as patch_module
    from spec_compat import REGISTRY

    src = tmp_path / "gen_stand_in.py"
    src.write_text(_MODULE)
    monkeypatch.syspath_prepend(str(tmp_path))
    module = __import__("gen_stand_in")
    monkeypatch.setitem(sys.modules, "gen_stand_in", module)
    assert "shutil.move" in inspect.getsource(module._worker)
    reader = Reader(_sample())
    monkeypatch.setattr(patch_module, "_FILES", [StoreFiles(PID, opener=lambda m: reader)])
    patch = REGISTRY.get(PID)
    patch.check(module)
    changes = Changes(PID)
    patch.install(module, changes)
    try:
        file_answer = tmp_path / "from-file-server.safetensors"
        shutil.copy(tmp_path / "gen_stand_in.py", file_answer)  # any file: moved as it is
        answers = [("req-7", MANIFEST), (str(file_answer), {"hidden_states_path": str(file_answer)})]
        asyncio.run(module._generate_and_save_hidden_states("m", "e", str(tmp_path / "data"), None,
                                                             lambda item: answers[item], [0, 1]))
    finally:
        changes.undo()
    out = tmp_path / "data" / "hidden_states"
    assert sorted(p.name for p in out.iterdir()) == ["hs_0.safetensors", "hs_1.safetensors"]
    assert load_file(str(out / "hs_0.safetensors"))["token_ids"].tolist() == [5, 6, 7]
    assert (out / "hs_1.safetensors").read_text() == _MODULE  # the file server's answer, untouched
    assert reader.calls == ["get req-7 120", "delete req-7"]


def test_a_module_that_reads_stores_itself_is_not_patched(tmp_path, monkeypatch):
    from spec_compat import REGISTRY
    from spec_compat.core.registry import NotNeeded

    src = tmp_path / "gen_reads_stores.py"
    src.write_text(_MODULE.replace("shutil.move(path,", "transfer_from_mooncake(path,"))
    monkeypatch.syspath_prepend(str(tmp_path))
    module = __import__("gen_reads_stores")
    with pytest.raises(NotNeeded, match="no longer moves the answer's handle"):
        REGISTRY.get(PID).check(module)
