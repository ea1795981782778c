"""shims.hidden_states (extract_hidden_states backport, step 1): layer-id checks, slot
arithmetic and row gathering, the connector's file protocol (atomic write, .error, .lock
against the readers of speculators 0.9.0 / hs-connectors 0.9.0 and of vLLM 0.32).  No engine."""

from __future__ import annotations

import ast
import asyncio
import errno
import fcntl
import hashlib
import importlib.metadata
import json
import os
import re
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest

from spec_compat.shims import hidden_states as hs
from spec_compat.shims.hidden_states import files
from spec_compat.shims.hidden_states.files import (
    HiddenStatesWriteError, acquire_lock, error_path, final_path, hidden_states_tensors, lock_path, release_lock,
    temp_path, write_atomically,
)
from spec_compat.patches.hidden_states.ehs_config.layer_ids import LAYER_ID_CONVENTION, LayerIdError, check_layer_ids
from spec_compat.patches.hidden_states.ehs_capture import blocks_needed, gather_rows, token_slots

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "support"))
from lock_reader import contract_reader_wait  # noqa: E402  (the design's reader, shared with ehs_engine)

ROOT = Path(__file__).resolve().parents[2]
PKG = ROOT / "spec_compat" / "shims" / "hidden_states"


def exactly(message: str) -> str:
    return "^" + re.escape(message) + "$"


@pytest.fixture
def torch():
    return pytest.importorskip("torch")


# ---------------------------------------------------------------- package hygiene

def test_package_imports_no_heavy_module():
    probe = ("import sys, json; import spec_compat.shims.hidden_states as m; "
             "print(json.dumps(sorted(x for x in sys.modules if x.split('.')[0] in "
             "('torch', 'safetensors', 'vllm', 'transformers', 'speculators', 'numpy'))))")
    env = {k: v for k, v in os.environ.items() if not k.startswith("SPEC_COMPAT_")}
    env["PYTHONPATH"] = str(ROOT)
    out = subprocess.run([sys.executable, "-c", probe], cwd=ROOT, env=env, capture_output=True, text=True,
                         timeout=120, check=True)
    assert json.loads(out.stdout.strip().splitlines()[-1]) == []


def test_modules_import_neither_core_nor_patches_and_stay_small():
    for path in sorted(PKG.glob("*.py")):
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom):
                assert node.level in (0, 1), f"{path.name}: from {'.' * node.level}{node.module}"
                assert not (node.module or "").startswith("spec_compat"), f"{path.name}: {node.module}"
            elif isinstance(node, ast.Import):
                assert not any(a.name.startswith("spec_compat") for a in node.names), path.name
        assert len(path.read_text().splitlines()) < 200, path.name


def test_all_names_exist():
    assert sorted(hs.__all__) == sorted(set(hs.__all__))
    for name in hs.__all__:
        assert getattr(hs, name) is not None


# ---------------------------------------------------------------- layer ids

ACCEPTED4 = "accepted: a non-empty list of distinct integers 0 <= id <= N, N = num_hidden_layers = 4"


def ids_error(ids_repr: str, problem: str, accepted: str = ACCEPTED4) -> str:
    return exactly(f"spec_compat[ehs-config]: eagle_aux_hidden_state_layer_ids {ids_repr}: {problem}; {accepted}")


def test_layer_ids_returned_ascending():
    assert check_layer_ids([4, 0, 2], 4) == (0, 2, 4)
    assert check_layer_ids([3, 1], 4) == (1, 3)
    assert check_layer_ids((2,), 4) == (2,)


def test_layer_ids_every_id_from_0_to_n_accepted():
    assert check_layer_ids([4, 3, 2, 1, 0], 4) == (0, 1, 2, 3, 4)
    assert check_layer_ids([32], 32) == (32,)


def test_layer_ids_empty():
    with pytest.raises(LayerIdError, match=ids_error("[]", "empty")):
        check_layer_ids([], 4)


def test_layer_ids_repeats_named_once_each_sorted():
    # speculators' default [2, N//2, N-3, N] for a 4-layer fixture
    with pytest.raises(LayerIdError, match=ids_error("[2, 2, 1, 4]", "repeated [2]")):
        check_layer_ids([2, 2, 1, 4], 4)
    with pytest.raises(LayerIdError, match=ids_error("[3, 1, 3, 1, 3]", "repeated [1, 3]")):
        check_layer_ids([3, 1, 3, 1, 3], 4)


def test_layer_ids_negative():
    with pytest.raises(LayerIdError, match=ids_error("[-1, 2]", "out of range [-1]")):
        check_layer_ids([-1, 2], 4)


def test_layer_ids_above_n():
    with pytest.raises(LayerIdError, match=ids_error("[5, 1, 9, -2]", "out of range [5, 9, -2]")):
        check_layer_ids([5, 1, 9, -2], 4)
    accepted = "accepted: a non-empty list of distinct integers 0 <= id <= N, N = num_hidden_layers = 32"
    with pytest.raises(LayerIdError, match=ids_error("[33]", "out of range [33]", accepted)):
        check_layer_ids([33], 32)


def test_layer_ids_bools_and_other_non_integers():
    with pytest.raises(LayerIdError, match=ids_error("[True, 2]", "not integers [True]")):
        check_layer_ids([True, 2], 4)
    with pytest.raises(LayerIdError, match=ids_error("[1.0, '2', None]", "not integers [1.0, '2', None]")):
        check_layer_ids([1.0, "2", None], 4)


def test_layer_ids_not_a_list():
    with pytest.raises(LayerIdError, match=ids_error("'1,2'", "not a list (str)")):
        check_layer_ids("1,2", 4)
    with pytest.raises(LayerIdError, match=ids_error("None", "not a list (NoneType)")):
        check_layer_ids(None, 4)
    with pytest.raises(LayerIdError, match=ids_error("{1, 2}", "not a list (set)")):
        check_layer_ids({1, 2}, 4)


def test_layer_ids_checks_in_order_types_then_range_then_repeats():
    with pytest.raises(LayerIdError, match=ids_error("[True, -1, 2, 2]", "not integers [True]")):
        check_layer_ids([True, -1, 2, 2], 4)
    with pytest.raises(LayerIdError, match=ids_error("[-1, 2, 2]", "out of range [-1]")):
        check_layer_ids([-1, 2, 2], 4)


@pytest.mark.parametrize("n", [0, -3, True, 4.0, "4", None])
def test_layer_ids_bad_num_hidden_layers(n):
    with pytest.raises(LayerIdError, match=exactly(
            f"spec_compat[ehs-config]: num_hidden_layers must be a positive integer, got {n!r}")):
        check_layer_ids([1], n)


def test_layer_id_error_is_a_value_error_and_convention_stated():
    assert issubclass(LayerIdError, ValueError)
    assert "id i < N = input of decoder layer i" in LAYER_ID_CONVENTION
    assert "id N = output of the last decoder layer before the final norm" in LAYER_ID_CONVENTION


# ---------------------------------------------------------------- slots and gathering

def test_token_slots_several_blocks_in_a_non_trivial_order():
    # positions 0-3 in block 7, 4-7 in block 2, 8-9 in block 5; block 9 is not needed
    assert token_slots([7, 2, 5, 9], 10, 4) == [28, 29, 30, 31, 8, 9, 10, 11, 20, 21]
    assert token_slots([7, 2, 5], 12, 4) == [28, 29, 30, 31, 8, 9, 10, 11, 20, 21, 22, 23]
    assert token_slots([3], 1, 16) == [48]
    assert token_slots([], 0, 16) == []


def test_token_slots_formula():
    block_ids, block_size = [11, 0, 6, 3, 8], 3
    slots = token_slots(block_ids, 14, block_size)
    assert slots == [block_ids[p // block_size] * block_size + p % block_size for p in range(14)]
    assert len(set(slots)) == 14


def test_token_slots_unchanged_by_kernel_block_split():
    block_ids, block_size, k = [7, 2, 5], 4, 2
    kernel_ids = [b * k + j for b in block_ids for j in range(k)]
    assert token_slots(kernel_ids, 10, block_size // k) == token_slots(block_ids, 10, block_size)


def test_token_slots_too_few_blocks():
    with pytest.raises(ValueError, match=exactly(
            "spec_compat[ehs-capture]: 9 tokens need 3 blocks of 4 slots, got 2 block ids [7, 2]")):
        token_slots([7, 2], 9, 4)
    with pytest.raises(ValueError, match=exactly(
            "spec_compat[ehs-capture]: 1 tokens need 1 blocks of 16 slots, got 0 block ids []")):
        token_slots([], 1, 16)


def test_token_slots_bad_arguments():
    with pytest.raises(ValueError, match=exactly(
            "spec_compat[ehs-capture]: block_size must be a positive integer, got 0")):
        token_slots([1], 1, 0)
    with pytest.raises(ValueError, match=exactly(
            "spec_compat[ehs-capture]: block_size must be a positive integer, got True")):
        token_slots([1], 1, True)
    with pytest.raises(ValueError, match=exactly(
            "spec_compat[ehs-capture]: num_tokens must be a non-negative integer, got -1")):
        token_slots([1], -1, 4)
    with pytest.raises(ValueError, match=exactly(
            "spec_compat[ehs-capture]: negative block ids [-1] among the 2 blocks used")):
        token_slots([3, -1, -5], 5, 4)
    assert blocks_needed([3, 1, -5], 5, 4) == [3, 1]  # an unused block is not looked at


def hand_built_cache(torch, num_blocks=6, block_size=4, layers=3, hidden=2):
    """value = block * 1000 + offset * 100 + layer * 10 + h (exact in float32)."""
    cache = torch.empty(num_blocks, block_size, layers, hidden, dtype=torch.float32)
    for b in range(num_blocks):
        for o in range(block_size):
            for layer in range(layers):
                for h in range(hidden):
                    cache[b, o, layer, h] = b * 1000 + o * 100 + layer * 10 + h
    return cache


def test_gather_rows_value_by_value(torch):
    cache = hand_built_cache(torch)
    block_ids, num_tokens = [5, 0, 3, 1], 10
    rows = gather_rows(cache, block_ids, num_tokens)
    assert tuple(rows.shape) == (10, 3, 2) and rows.dtype == torch.float32 and rows.is_contiguous()
    for p in range(num_tokens):
        block, offset = block_ids[p // 4], p % 4
        for layer in range(3):
            for h in range(2):
                assert rows[p, layer, h].item() == block * 1000 + offset * 100 + layer * 10 + h, (p, layer, h)


def test_gather_rows_is_a_copy(torch):
    cache = hand_built_cache(torch)
    before = cache.clone()
    rows = gather_rows(cache, [2, 4], 8)
    rows.fill_(-1.0)
    assert torch.equal(cache, before)
    assert rows.untyped_storage().data_ptr() != cache.untyped_storage().data_ptr()


def test_gather_rows_of_a_whole_block_is_a_copy_too(torch):
    cache = hand_built_cache(torch, num_blocks=1)
    rows = gather_rows(cache, [0], 4)
    assert torch.equal(rows, cache[0])
    rows.zero_()
    assert cache[0, 3, 2, 1].item() == 321


@pytest.mark.parametrize("dtype", ["bfloat16", "float16", "float32"])
def test_gather_rows_preserves_dtype(torch, dtype):
    dt = getattr(torch, dtype)
    cache = torch.randn(5, 3, 2, 8, generator=torch.Generator().manual_seed(0)).to(dt)
    block_ids = [4, 1, 3]
    rows = gather_rows(cache, block_ids, 7)
    assert rows.dtype == dt
    for p in range(7):
        assert torch.equal(rows[p], cache[block_ids[p // 3], p % 3])


def test_gather_rows_matches_token_slots_on_a_flat_view(torch):
    cache = hand_built_cache(torch, num_blocks=7, block_size=3)
    block_ids = [6, 2, 0, 4]
    slots = token_slots(block_ids, 11, 3)
    flat = cache.view(-1, 3, 2)
    assert torch.equal(gather_rows(cache, block_ids, 11), flat[torch.tensor(slots)])


def test_gather_rows_from_a_non_contiguous_cache(torch):
    base = hand_built_cache(torch)  # (6, 4, 3, 2)
    strided = base.permute(1, 0, 2, 3).contiguous().permute(1, 0, 2, 3)
    assert not strided.is_contiguous() and torch.equal(strided, base)
    assert torch.equal(gather_rows(strided, [3, 1], 6), gather_rows(base, [3, 1], 6))


def test_gather_rows_zero_tokens(torch):
    rows = gather_rows(hand_built_cache(torch), [], 0)
    assert tuple(rows.shape) == (0, 3, 2)


def test_gather_rows_errors(torch):
    cache = hand_built_cache(torch)
    with pytest.raises(ValueError, match=exactly(
            "spec_compat[ehs-capture]: 10 tokens need 3 blocks of 4 slots, got 2 block ids [1, 2]")):
        gather_rows(cache, [1, 2], 10)
    with pytest.raises(ValueError, match=exactly(
            "spec_compat[ehs-capture]: block ids [6, 9] out of range for a cache of 6 blocks")):
        gather_rows(cache, [6, 0, 9], 12)
    with pytest.raises(ValueError, match=exactly(
            "spec_compat[ehs-capture]: cache must be shaped (num_blocks, block_size, layers, hidden), "
            "got (24, 3, 2)")):
        gather_rows(cache.view(24, 3, 2), [0], 1)


# ---------------------------------------------------------------- file names

def test_final_path_keeps_a_safe_request_id():
    assert final_path("/data/hs", "cmpl-3f2a_9.x-0") == "/data/hs/cmpl-3f2a_9.x-0.safetensors"
    assert final_path(Path("/data/hs"), "chatcmpl-1") == "/data/hs/chatcmpl-1.safetensors"


@pytest.mark.parametrize("request_id", [
    "a/b", "../../etc/passwd", ".hidden", "..", ".", "", "a\\b", "a\x00b", "x" * 300, "é/ü", "a b\n",
])
def test_final_path_sanitises(tmp_path, request_id):
    path = final_path(tmp_path, request_id)
    name = os.path.basename(path)
    assert os.path.dirname(path) == str(tmp_path)
    assert name.endswith(".safetensors") and not name.startswith(".")
    assert re.fullmatch(r"[A-Za-z0-9._-]+", name), name
    assert len(error_path(name).encode()) <= 255 and len(os.path.basename(temp_path(lock_path(path)))) <= 255
    assert path == final_path(tmp_path, request_id)  # deterministic
    digest = hashlib.sha256(request_id.encode("utf-8")).hexdigest()[:16]
    assert name.endswith(f"-{digest}.safetensors")


def test_final_path_keeps_distinct_ids_distinct(tmp_path):
    ids = ["a/b", "a_b", "a\\b", "a:b", ".a", "_a", "", "-", "x" * 129, "x" * 128, "x" * 130]
    assert len({final_path(tmp_path, i) for i in ids}) == len(ids)
    assert os.path.basename(final_path(tmp_path, "x" * 128)) == "x" * 128 + ".safetensors"


def test_companion_paths():
    assert lock_path("/d/r.safetensors") == "/d/r.safetensors.lock"
    assert error_path(Path("/d/r.safetensors")) == "/d/r.safetensors.error"
    assert temp_path("/d/r.safetensors") == f"/d/.r.safetensors.{os.getpid()}.tmp"


# ---------------------------------------------------------------- tensors

def test_hidden_states_tensors(torch):
    rows = torch.randn(3, 2, 4, dtype=torch.bfloat16)
    out = hidden_states_tensors(rows, [5, 6, 7])
    assert set(out) == {"hidden_states", "token_ids"}
    assert out["hidden_states"] is rows
    assert out["token_ids"].dtype == torch.int64 and out["token_ids"].tolist() == [5, 6, 7]
    ids = torch.tensor([1, 2, 3])
    assert hidden_states_tensors(rows, ids)["token_ids"] is ids


def test_hidden_states_tensors_errors(torch):
    rows = torch.zeros(3, 2, 4)
    cases = [
        ((torch.zeros(3, 8), [1, 2, 3]), "hidden_states must be a tensor [T, L, H], got (3, 8)"),
        (([[[0.0]]], [1]), "hidden_states must be a tensor [T, L, H], got list"),
        ((torch.zeros(3, 2, 4, dtype=torch.int32), [1, 2, 3]),
         "hidden_states must have a floating dtype, got torch.int32"),
        ((torch.zeros(0, 2, 4), []), "hidden_states has no rows (T = 0)"),
        ((rows, torch.tensor([1, 2, 3], dtype=torch.int32)), "token_ids must be int64, got torch.int32"),
        ((rows, [1, 2]), "token_ids must have shape [T] = [3] (the rows of hidden_states), got [2]"),
        ((rows, torch.tensor([[1, 2, 3]])), "token_ids must have shape [T] = [3] (the rows of hidden_states), "
                                            "got [1, 3]"),
        ((rows, [1, True, 3]), "token_ids must be a list of ints or an int64 tensor, got [1, True, 3]"),
        ((rows, [1, 2.5, 3]), "token_ids must be a list of ints or an int64 tensor, got [1, 2.5, 3]"),
        ((rows, "abc"), "token_ids must be a list of ints or an int64 tensor, got 'abc'"),
    ]
    for args, message in cases:
        with pytest.raises(ValueError, match=exactly("spec_compat[ehs-capture]: " + message)):
            hidden_states_tensors(*args)


# ---------------------------------------------------------------- atomic write

def sample(torch, dtype=None, t=5, layers=3, hidden=4):
    rows = torch.randn(t, layers, hidden, generator=torch.Generator().manual_seed(t)).to(dtype or torch.float32)
    return hidden_states_tensors(rows, list(range(100, 100 + t)))


def test_write_round_trips(torch, tmp_path):
    from safetensors import safe_open
    from safetensors.torch import load_file

    path = final_path(tmp_path, "cmpl-1")
    tensors = sample(torch, torch.bfloat16)
    write_atomically(path, tensors, {"layer_ids": "0,2,4"})
    loaded = load_file(path)
    assert set(loaded) == {"hidden_states", "token_ids"}
    assert loaded["hidden_states"].dtype == torch.bfloat16 and torch.equal(loaded["hidden_states"],
                                                                           tensors["hidden_states"])
    assert loaded["token_ids"].dtype == torch.int64 and loaded["token_ids"].tolist() == [100, 101, 102, 103, 104]
    with safe_open(path, "pt") as f:
        assert f.metadata() == {"layer_ids": "0,2,4"}
    assert sorted(os.listdir(tmp_path)) == ["cmpl-1.safetensors"]
    write_atomically(path, sample(torch, t=2))  # overwrite, no metadata
    assert load_file(path)["token_ids"].tolist() == [100, 101]
    assert sorted(os.listdir(tmp_path)) == ["cmpl-1.safetensors"]


def test_write_goes_through_the_temp_name(torch, tmp_path, monkeypatch):
    import safetensors.torch as st

    path = final_path(tmp_path, "r")
    seen = []
    real = st.save_file

    def spy(tensors, filename, metadata=None):
        seen.append((filename, os.path.exists(path)))
        real(tensors, filename, metadata=metadata)

    monkeypatch.setattr(st, "save_file", spy)
    write_atomically(path, sample(torch))
    assert seen == [(str(tmp_path / f".r.safetensors.{os.getpid()}.tmp"), False)]
    assert os.path.exists(path) and not os.path.exists(seen[0][0])


def partial_then_fail(tensors, filename, metadata=None):
    with open(filename, "wb") as f:
        f.write(b"\x08\x00\x00\x00\x00\x00\x00\x00{\"hidden_")  # a truncated safetensors header
    raise OSError(errno.ENOSPC, "No space left on device")


def test_write_failure_mid_write_leaves_no_file_and_an_error_marker(torch, tmp_path, monkeypatch):
    import safetensors.torch as st

    monkeypatch.setattr(st, "save_file", partial_then_fail)
    path = final_path(tmp_path, "cmpl-7")
    message = (f"spec_compat[ehs-capture]: writing hidden states to {path} failed: "
               f"OSError: [Errno 28] No space left on device")
    with pytest.raises(HiddenStatesWriteError, match=exactly(message)) as info:
        write_atomically(path, sample(torch))
    assert info.value.path == path
    assert isinstance(info.value.__cause__, OSError) and info.value.__cause__.errno == errno.ENOSPC
    assert sorted(os.listdir(tmp_path)) == ["cmpl-7.safetensors.error"]
    assert Path(error_path(path)).read_text() == message + "\n"


def test_write_failure_at_the_rename(torch, tmp_path, monkeypatch):
    path = final_path(tmp_path, "cmpl-8")
    real = os.replace

    def replace(src, dst):
        if dst == path:
            raise PermissionError(errno.EACCES, "Permission denied")
        real(src, dst)

    monkeypatch.setattr(files.os, "replace", replace)
    with pytest.raises(HiddenStatesWriteError, match=exactly(
            f"spec_compat[ehs-capture]: writing hidden states to {path} failed: "
            f"PermissionError: [Errno 13] Permission denied")):
        write_atomically(path, sample(torch))
    assert sorted(os.listdir(tmp_path)) == ["cmpl-8.safetensors.error"]


def test_failed_rewrite_keeps_the_previous_complete_file(torch, tmp_path, monkeypatch):
    import safetensors.torch as st

    path = final_path(tmp_path, "r")
    good = sample(torch)
    write_atomically(path, good)
    monkeypatch.setattr(st, "save_file", partial_then_fail)
    with pytest.raises(HiddenStatesWriteError):
        write_atomically(path, sample(torch, t=2))
    monkeypatch.undo()
    assert torch.equal(st.load_file(path)["hidden_states"], good["hidden_states"])


def test_success_removes_a_stale_error_marker(torch, tmp_path):
    path = final_path(tmp_path, "r")
    Path(error_path(path)).write_text("old failure\n")
    write_atomically(path, sample(torch))
    assert sorted(os.listdir(tmp_path)) == ["r.safetensors"]


def test_error_marker_is_best_effort(torch, tmp_path):
    path = str(tmp_path / "missing-dir" / "r.safetensors")
    with pytest.raises(HiddenStatesWriteError, match=r"^spec_compat\[ehs-capture\]: writing hidden states to "
                       + re.escape(path) + r" failed: \w+: .*No such file or directory") as info:
        write_atomically(path, sample(torch))  # safetensors 0.8 raises SafetensorError here
    assert info.value.__cause__ is not None
    assert os.listdir(tmp_path) == []


def test_an_interrupt_mid_write_removes_the_temp_file_and_is_not_wrapped(torch, tmp_path, monkeypatch):
    import safetensors.torch as st

    def interrupted(tensors, filename, metadata=None):
        Path(filename).write_bytes(b"partial")
        raise KeyboardInterrupt

    monkeypatch.setattr(st, "save_file", interrupted)
    with pytest.raises(KeyboardInterrupt):
        write_atomically(final_path(tmp_path, "r"), sample(torch))
    assert os.listdir(tmp_path) == []


# ---------------------------------------------------------------- lock protocol

def test_acquire_lock_holds_it_until_release(tmp_path):
    path = final_path(tmp_path, "r")
    Path(lock_path(path)).write_text("left over")
    fd = acquire_lock(path)
    assert Path(lock_path(path)).read_text() == ""  # O_TRUNC
    other = os.open(lock_path(path), os.O_RDWR)
    try:
        with pytest.raises(BlockingIOError):
            fcntl.flock(other, fcntl.LOCK_EX | fcntl.LOCK_NB)
        release_lock(fd)
        fcntl.flock(other, fcntl.LOCK_EX | fcntl.LOCK_NB)
    finally:
        os.close(other)
    assert os.path.exists(lock_path(path))  # the reader removes it
    with pytest.raises(OSError):
        os.fstat(fd)  # closed


def installed_functions(dist: str, relpath: str, names: tuple[str, ...]) -> dict | None:
    """``names`` defined at the top of an installed distribution's file, compiled from its source
    without importing the package (speculators' package import pulls in transformers)."""
    try:
        file = Path(importlib.metadata.distribution(dist).locate_file(relpath))
    except importlib.metadata.PackageNotFoundError:
        return None
    if not file.is_file():
        return None
    tree = ast.parse(file.read_text())
    defs = [n for n in tree.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)) and n.name in names]
    if sorted(d.name for d in defs) != sorted(names):
        return None
    namespace: dict = {"asyncio": asyncio, "fcntl": fcntl, "os": os, "time": time}
    exec(compile(ast.Module(body=defs, type_ignores=[]), str(file), "exec"), namespace)
    namespace["__ast__"] = {d.name: d for d in defs}
    return namespace


SPECULATORS_CLIENT = ("speculators", "speculators/data_generation/vllm_client.py",
                      ("wait_for_lock", "_poll_lock_async", "wait_for_lock_async"))
HS_CONNECTORS_TRANSFER = ("hs-connectors", "hs_connectors/transfer.py", ("wait_for_lock",))


def reader_wait(kind: str):
    """``wait(lock_path)`` as the named client runs it (installed ones skip when absent)."""
    if kind == "contract":
        return lambda lock: contract_reader_wait(lock, timeout=10.0, poll_interval=0.01)
    ns = installed_functions(*(HS_CONNECTORS_TRANSFER if kind == "hs-connectors" else SPECULATORS_CLIENT))
    if ns is None:
        pytest.skip(f"{kind}: no installed reader with a lock wait in this cell")
    if kind == "speculators-async":  # generate-offline-data (0.9.0)
        return lambda lock: asyncio.run(ns["wait_for_lock_async"](lock, timeout=10.0, poll_interval=0.01))
    return lambda lock: ns["wait_for_lock"](lock, timeout=10.0, poll_interval=0.01)


@pytest.mark.parametrize("kind", ["contract", "speculators-sync", "speculators-async", "hs-connectors"])
def test_reader_waits_for_the_writer_then_reads_a_complete_file(torch, tmp_path, kind):
    from safetensors.torch import load_file

    wait = reader_wait(kind)
    path = final_path(tmp_path, "cmpl-42")
    tensors = sample(torch, t=9)
    fd = acquire_lock(path)  # wait_for_save: before the request can finish
    released = threading.Event()
    started = threading.Event()
    seen: dict = {}

    def reader() -> None:  # the client after the response (speculators, hs-connectors)
        try:
            lock = lock_path(path)
            started.set()
            if os.path.exists(lock):
                wait(lock)
            seen["after_release"] = released.is_set()
            seen["data"] = load_file(path)
        except BaseException as exc:  # reported in the main thread
            seen["error"] = exc

    thread = threading.Thread(target=reader, daemon=True)
    thread.start()
    assert started.wait(10)
    time.sleep(0.3)
    assert thread.is_alive() and not seen, seen  # still polling
    write_atomically(path, tensors)
    time.sleep(0.05)
    assert thread.is_alive() and not seen, seen  # the file is there, the lock still held
    released.set()
    release_lock(fd)
    thread.join(10)
    assert not thread.is_alive() and "error" not in seen, seen
    assert seen["after_release"] is True
    assert torch.equal(seen["data"]["hidden_states"], tensors["hidden_states"])
    assert seen["data"]["token_ids"].tolist() == tensors["token_ids"].tolist()
    assert sorted(os.listdir(tmp_path)) == ["cmpl-42.safetensors"]  # the reader removed the lock


VLLM_READER = textwrap.dedent("""
    import fcntl, hashlib, sys
    path = sys.argv[1]
    print("waiting", flush=True)
    with open(path + ".lock") as lf:
        fcntl.flock(lf, fcntl.LOCK_SH)  # vLLM 0.32 load_hidden_states
        with open(path, "rb") as f:
            print(hashlib.sha256(f.read()).hexdigest(), flush=True)
""")


def test_vllm_shared_lock_reader_in_another_process_waits_for_the_file(torch, tmp_path):
    path = final_path(tmp_path, "cmpl-43")
    fd = acquire_lock(path)
    proc = subprocess.Popen([sys.executable, "-c", VLLM_READER, path], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline().strip() == "waiting"
        time.sleep(0.3)
        assert proc.poll() is None
        write_atomically(path, sample(torch, t=4))
        release_lock(fd)
        out, _ = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 0
    assert out.strip() == hashlib.sha256(Path(path).read_bytes()).hexdigest()
