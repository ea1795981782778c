"""shims.hidden_states step 2: the KV-slot store and its capture hooks (torch only), and the
KV connector that writes a prompt's rows to safetensors (needs vLLM: skipped without it).
Fake decoder layers stand in for vLLM's: forward(positions, hidden_states, residual) returns
(hidden, residual) with residual = input hidden + residual.  No engine is started."""

from __future__ import annotations

import os
import pickle
import re
from types import SimpleNamespace

import pytest

torch = pytest.importorskip("torch")

from spec_compat.shims.hidden_states.contract import PATH_KEY, SETTINGS_KEY  # noqa: E402
from spec_compat.shims.hidden_states.files import error_path, final_path  # noqa: E402
from spec_compat.patches.hidden_states.ehs_capture import token_slots  # noqa: E402
from spec_compat.patches.hidden_states.ehs_capture import HiddenStatesStore, install_capture  # noqa: E402

H, B, NUM_BLOCKS = 4, 4, 8


class FakeLayer(torch.nn.Module):
    def __init__(self, k: int) -> None:
        super().__init__()
        self.k = k

    def forward(self, positions, hidden_states, residual):
        residual = hidden_states if residual is None else hidden_states + residual
        return residual * (self.k + 2) + positions[:, None].to(residual.dtype), residual


def model(layers, positions, embeds, kw=False):
    hidden, residual = embeds, None
    for layer in layers:
        if kw:
            hidden, residual = layer(positions, hidden_states=hidden, residual=residual)
        else:
            hidden, residual = layer(positions, hidden, residual)
    return hidden + residual


def reference(layers, positions, embeds):
    """[T, N+1, H]: id i < N = input of layer i (hidden + residual), id N = last output summed."""
    hidden, residual, streams = embeds, None, []
    for layer in layers:
        streams.append(hidden if residual is None else hidden + residual)
        hidden, residual = layer.forward(positions, hidden, residual)  # .forward: no hooks fire
    streams.append(hidden + residual)
    return torch.stack(streams, dim=1)


def ints(*shape):
    return torch.randint(-5, 6, shape, generator=torch.Generator().manual_seed(sum(shape))).float()


def store_of(ids):
    store = HiddenStatesStore(ids, H, NUM_BLOCKS, B, torch.float32, "cpu")
    # the store is allocated uninitialised (torch.empty): zero it, so that "nothing else was
    # written" is observable
    store.cache.zero_()
    return store


class Capture:
    """N fake layers, a store and the hooks; ``step`` runs one forward at the given slots."""

    def __init__(self, n, ids):
        self.layers = torch.nn.ModuleList(FakeLayer(k) for k in range(n))
        self.store = store_of(ids)
        self.slots = None
        self.calls = 0
        self.handles = install_capture(self.layers, self.store, self._slots)

    def _slots(self):
        self.calls += 1
        return self.slots

    def step(self, positions, embeds, slots, kw=False):
        self.slots = torch.tensor(slots)
        try:
            return model(self.layers, torch.tensor(positions), embeds, kw)
        finally:
            self.slots = None

    def ref(self, positions, embeds):
        cols = list(self.store.layer_ids)
        return reference(self.layers, torch.tensor(positions), embeds)[:, cols]


# ---------------------------------------------------------------- store

def test_put_skips_padding_and_writes_min_rows():
    store = store_of((0, 2))
    states = ints(4, H)
    store.put(1, states[:3], torch.tensor([5, -1, 6], dtype=torch.int32))
    flat = store.cache.view(-1, 2, H)
    assert torch.equal(flat[5, 1], states[0]) and torch.equal(flat[6, 1], states[2])
    assert int((flat.abs().sum(-1) != 0).sum()) == 2  # padding row went nowhere; column 0 untouched
    store.put(0, states, torch.tensor([9, 10]))  # 4 states, 2 slots: 2 rows
    store.put(0, states[:1], torch.tensor([11, 12, 13]))  # 1 state, 3 slots: 1 row
    assert torch.equal(flat[9:12, 0], states[[0, 1, 0]])
    assert int((flat.abs().sum(-1) != 0).sum()) == 5


def test_put_adds_the_residual_through_one_reused_buffer():
    """hidden + residual lands at the slots (padding skipped); the sum buffer is reused across
    puts and grows for a larger step without changing earlier rows."""
    store = store_of((0, 2))
    hidden, residual = ints(4, H), ints(4, H) * 3 + 1
    store.put(1, hidden[:3], torch.tensor([3, -1, 4]), residual[:3])
    buf = store._sums[(torch.float32, torch.device("cpu"))]
    store.put(0, hidden[:2], torch.tensor([1, 2]), residual[:2])
    assert store._sums[(torch.float32, torch.device("cpu"))] is buf  # reused, no new tensor
    store.put(1, hidden, torch.tensor([5, 6, 7, 8]), residual)  # larger step: the buffer grows
    flat = store.cache.view(-1, 2, H)
    want = hidden + residual
    assert torch.equal(flat[1:3, 0], want[:2])
    assert torch.equal(flat[3, 1], want[0]) and torch.equal(flat[4, 1], want[2])
    assert torch.equal(flat[5:9, 1], want)
    assert torch.equal(hidden, ints(4, H)) and torch.equal(residual, ints(4, H) * 3 + 1)  # inputs untouched


def test_store_refuses_bad_ids_and_width():
    for ids in ((2, 1), (1, 1), (0, 3, 3)):
        with pytest.raises(ValueError, match="distinct and ascending"):
            store_of(ids)
    store = store_of((1, 3))
    with pytest.raises(ValueError, match=re.escape("layer 3 gave width 5, expected 4")):
        store.put(1, torch.zeros(2, H + 1), torch.tensor([0, 1]))
    assert not store.cache.any()


def test_rows_is_a_copy_in_position_order():
    store = store_of((0,))
    store.cache.copy_(torch.arange(store.cache.numel(), dtype=torch.float32).view_as(store.cache))
    rows = store.rows([5, 2], 6)
    assert rows.shape == (6, 1, H)
    assert torch.equal(rows, store.cache.view(-1, 1, H)[[20, 21, 22, 23, 8, 9]])
    rows.zero_()
    assert store.cache.view(-1, 1, H)[20].sum() != 0


# ---------------------------------------------------------------- capture hooks

@pytest.mark.parametrize("kw", [False, True], ids=["positional", "keywords"])
def test_capture_values_exact(kw):
    cap = Capture(2, (0, 1, 2))
    e, pos = ints(3, H), [0, 1, 2]
    p = torch.tensor(pos, dtype=torch.float32)[:, None]
    expect = torch.stack([e, 3 * e + p, 12 * e + 5 * p], dim=1)  # by hand for k = 0, 1
    assert torch.equal(cap.ref(pos, e), expect)
    plain = model(cap.layers, torch.tensor(pos), e)  # slots None: hooks write nothing
    assert not cap.store.cache.any() and cap.calls == 3
    out = cap.step(pos, e, [9, 2, 30], kw)
    assert torch.equal(out, plain)  # hooks do not change the forward
    flat = cap.store.cache.view(-1, 3, H)
    assert torch.equal(flat[[9, 2, 30]], expect)


def test_capture_last_layer_output_only():
    cap = Capture(4, (4,))
    assert len(cap.handles) == 1 and len(cap.layers[3]._forward_hooks) == 1
    assert not any(len(layer._forward_pre_hooks) for layer in cap.layers)
    e = ints(2, H)
    cap.step([0, 1], e, [0, 1])
    assert torch.equal(cap.store.rows([0], 2), cap.ref([0, 1], e))


def test_capture_skips_padding_tokens():
    cap = Capture(4, (1, 3, 4))
    e = ints(5, H)
    cap.step([0, 1, 2, 0, 0], e, [12, 13, 14, -1, -1])  # padded batch: 2 padding tokens
    flat = cap.store.cache.view(-1, 3, H)
    assert torch.equal(flat[12:15], cap.ref([0, 1, 2, 0, 0], e)[:3])
    assert int((flat.abs().sum((-1, -2)) != 0).sum()) == 3


@pytest.mark.parametrize("ids,bad", [((0, 5), [5]), ((-1, 2), [-1]), ((3, 4, 6, 7), [6, 7])])
def test_capture_refuses_ids_out_of_range(ids, bad):
    layers = torch.nn.ModuleList(FakeLayer(k) for k in range(4))
    msg = f"layer ids {bad} are outside 0..4 (the model has 4 decoder layers)"
    with pytest.raises(ValueError, match=re.escape(msg)):
        install_capture(layers, store_of(ids), lambda: None)
    assert not any(len(m._forward_pre_hooks) or len(m._forward_hooks) for m in layers)


def test_capture_refuses_width_mismatch():
    cap = Capture(2, (1,))
    with pytest.raises(ValueError, match=re.escape("layer 1 gave width 5, expected 4")):
        cap.step([0], torch.ones(1, H + 1), [0])


def test_prefix_cached_rows_survive_other_steps():
    cap = Capture(2, (0, 2))
    ea, eb, ec = ints(6, H), ints(5, H) + 7, ints(6, H)
    ec[:4] = ea[:4]  # C shares A's first block (the same 4 tokens)
    pos6 = list(range(6))
    # step 1: A (blocks 2, 5) plus one padding token; step 2: B (blocks 1, 3)
    cap.step(pos6 + [0], torch.cat([ea, ints(1, H) + 50]), token_slots([2, 5], 6, B) + [-1])
    cap.step(list(range(5)), eb, token_slots([1, 3], 5, B))
    # step 3: C hits the prefix cache (block 2); only its positions 4, 5 run, in block 6
    cap.step([4, 5], ec[4:], token_slots([2, 6], 6, B)[4:])
    assert torch.equal(cap.store.rows([2, 6], 6), cap.ref(pos6, ec))
    assert torch.equal(cap.store.rows([2, 5], 6), cap.ref(pos6, ea))
    assert torch.equal(cap.store.rows([1, 3], 5), cap.ref(list(range(5)), eb))


def test_hooks_are_removable():
    cap = Capture(3, (0, 2, 3))
    assert len(cap.handles) == 3
    for handle in cap.handles:
        handle.remove()
    assert not any(len(m._forward_pre_hooks) or len(m._forward_hooks) for m in cap.layers)
    cap.step([0, 1], ints(2, H), [0, 1])
    assert not cap.store.cache.any() and cap.calls == 0


# ---------------------------------------------------------------- connector (vLLM)

# module scope: set up before conftest's per-test REGISTRY snapshot (importing vllm imports
# transformers, whose lazy patches then apply: that would read as a change made by the test)
@pytest.fixture(scope="module")
def vc():
    pytest.importorskip("vllm")
    from spec_compat.core.versions import in_range, installed_version
    from spec_compat.patches.hidden_states import VLLM_WITHOUT_EHS

    vllm = installed_version("vllm")
    if not in_range(vllm, VLLM_WITHOUT_EHS):
        pytest.skip(f"the extract_hidden_states backport's connector is for vllm{VLLM_WITHOUT_EHS}; installed: {vllm} "
                    "(its KV-connector base class differs)")
    from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorMetadata, KVConnectorRole

    from spec_compat.patches.hidden_states.ehs_config import connector as mod

    return SimpleNamespace(mod=mod, Role=KVConnectorRole, Meta=KVConnectorMetadata)


def connector(vc, role, storage, ids=(1, 3)):
    settings = {"layer_ids": list(ids), "num_hidden_layers": 4, "hidden_size": H, "storage": str(storage)}
    config = SimpleNamespace(kv_transfer_config=SimpleNamespace(kv_connector_extra_config={SETTINGS_KEY: settings}))
    return vc.mod.HiddenStatesConnector(config, getattr(vc.Role, role))


def new(req_id, prompt, blocks, computed=0):
    return SimpleNamespace(req_id=req_id, prompt_token_ids=prompt, block_ids=(list(blocks),),
                           num_computed_tokens=computed)


def step(sched, news=(), cached=()):
    """cached: (req_id, new block ids or None, num_computed_tokens, resumed)."""
    return SimpleNamespace(
        scheduled_new_reqs=list(news),
        scheduled_cached_reqs=SimpleNamespace(
            req_ids=[c[0] for c in cached], resumed_req_ids={c[0] for c in cached if c[3]},
            new_block_ids=[None if c[1] is None else (list(c[1]),) for c in cached],
            num_computed_tokens=[c[2] for c in cached]),
        num_scheduled_tokens=dict(sched))


def saves(meta):
    return {s.req_id: (s.token_ids, s.block_ids, s.path) for s in meta.saves}


def req(req_id):
    return SimpleNamespace(request_id=req_id)


def test_connector_needs_its_settings(vc, tmp_path):
    config = SimpleNamespace(kv_transfer_config=SimpleNamespace(kv_connector_extra_config={}))
    with pytest.raises(ValueError, match="extract_hidden_states"):
        vc.mod.HiddenStatesConnector(config, vc.Role.SCHEDULER)
    assert vc.mod.ExampleHiddenStatesConnector is vc.mod.HiddenStatesConnector
    assert connector(vc, "WORKER", tmp_path).role == vc.Role.WORKER


def test_chunked_prefill_saves_once_when_prompt_done(vc, tmp_path):
    c = connector(vc, "SCHEDULER", tmp_path)
    a, b = list(range(100, 110)), list(range(200, 206))
    m1 = c.build_connector_meta(step({"a": 4}, news=[new("a", a, [3])]))
    assert isinstance(m1, vc.Meta) and saves(m1) == {}
    assert saves(c.build_connector_meta(step({"a": 4}, cached=[("a", [7], 4, False)]))) == {}
    # step 3: a's last chunk; b (new, 4 tokens from the prefix cache) completes at once
    m3 = c.build_connector_meta(step({"a": 2, "b": 2}, news=[new("b", b, [3, 5], 4)],
                                     cached=[("a", [2], 8, False)]))
    assert saves(m3) == {"a": (a, [3, 7, 2], final_path(tmp_path, "a")),
                         "b": (b, [3, 5], final_path(tmp_path, "b"))}
    assert saves(pickle.loads(pickle.dumps(m3))) == saves(m3)  # travels to the worker processes
    m4 = c.build_connector_meta(step({"a": 1, "b": 1}, cached=[("a", None, 10, False), ("b", [6], 6, False)]))
    assert saves(m4) == {}  # decoding: never again
    # preempted after its save and resumed: still not again
    assert saves(c.build_connector_meta(step({"b": 7}, cached=[("b", [1, 4], 0, True)]))) == {}


def test_resumed_request_block_ids_are_replaced(vc, tmp_path):
    c = connector(vc, "SCHEDULER", tmp_path)
    p = list(range(8))
    assert saves(c.build_connector_meta(step({"p": 4}, news=[new("p", p, [1, 2])]))) == {}
    assert saves(c.build_connector_meta(step({}))) == {}  # preempted: not scheduled
    assert saves(c.build_connector_meta(step({"p": 4}, cached=[("p", [6, 4], 0, True)]))) == {}
    m = c.build_connector_meta(step({"p": 4}, cached=[("p", None, 4, False)]))
    assert saves(m) == {"p": (p, [6, 4], final_path(tmp_path, "p"))}


def test_request_finished_answers(vc, tmp_path):
    c = connector(vc, "SCHEDULER", tmp_path)
    news = [new("early", [1, 2, 3, 4, 5], [0]), new("emb", None, [1]), new("lost", [1, 2], [2]),
            new("bad", [3, 4], [3])]
    m = c.build_connector_meta(step({"early": 2, "emb": 50, "lost": 2, "bad": 2}, news=news))
    assert sorted(saves(m)) == ["bad", "lost"]
    assert c.request_finished(req("early"), [0]) == (False, None)  # aborted before its prompt ran
    assert c.request_finished(req("unknown"), []) == (False, None)
    done, params = c.request_finished(req("emb"), [1])
    assert done is False and params[PATH_KEY] is None and "no prompt token ids" in params["error"]
    done, params = c.request_finished(req("lost"), [2])
    assert done is False and params[PATH_KEY] is None and "was not written: the write failed" in params["error"]
    assert final_path(tmp_path, "lost") in params["error"]
    with open(error_path(final_path(tmp_path, "bad")), "w") as f:
        f.write("disk on fire\n")
    assert c.request_finished(req("bad"), [3]) == (False, {PATH_KEY: None, "error": "disk on fire"})


def test_worker_writes_the_prompt_rows(vc, tmp_path):
    from safetensors import safe_open
    from safetensors.torch import load_file

    sched, worker = connector(vc, "SCHEDULER", tmp_path), connector(vc, "WORKER", tmp_path)
    cap = Capture(4, (1, 3))
    worker.attach_store(cap.store)
    prompt, e = list(range(300, 306)), ints(6, H)
    # step 1: tokens 0..3 in block 5; step 2: tokens 4, 5 in block 2 (the save step)
    for meta_step, positions, blocks in (
        (step({"r": 4}, news=[new("r", prompt, [5])]), [0, 1, 2, 3], [5]),
        (step({"r": 2}, cached=[("r", [2], 4, False)]), [4, 5], [5, 2]),
    ):
        meta = sched.build_connector_meta(meta_step)
        worker.bind_connector_metadata(meta)
        cap.step(positions, e[positions[0]:positions[-1] + 1], token_slots(blocks, positions[-1] + 1, B)[positions[0]:])
        if meta.saves:
            with open(error_path(final_path(tmp_path, "r")), "w") as f:
                f.write("stale\n")
        worker.wait_for_save()
        assert worker.drain(timeout=30)
        worker.clear_connector_metadata()
        assert os.path.exists(final_path(tmp_path, "r")) == bool(meta.saves)
    path = final_path(tmp_path, "r")
    # no temp file, stale marker gone; the lock stays for a lock-aware reader to remove (released)
    assert sorted(os.listdir(tmp_path)) == [os.path.basename(path), os.path.basename(path) + ".lock"]
    import fcntl
    with open(path + ".lock") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
    assert os.stat(path).st_mode & 0o777 == 0o644
    data = load_file(path)
    assert sorted(data) == ["hidden_states", "token_ids"]
    assert data["hidden_states"].shape == (6, 2, H)
    assert torch.equal(data["hidden_states"], cap.store.rows([5, 2], 6))
    assert torch.equal(data["hidden_states"], cap.ref(list(range(6)), e))
    assert data["token_ids"].dtype == torch.int64 and data["token_ids"].tolist() == prompt
    with safe_open(path, "pt") as f:
        assert f.metadata()["layer_ids"] == "1,3"
    assert worker.writes == 1
    assert sched.request_finished(req("r"), [5, 2]) == (False, {PATH_KEY: path})


def _save_one(vc, storage, req_id="w", blocks=(1,)):
    sched, worker = connector(vc, "SCHEDULER", storage), connector(vc, "WORKER", storage)
    worker.attach_store(store_of((1, 3)))
    meta = sched.build_connector_meta(step({req_id: 3}, news=[new(req_id, [7, 8, 9], list(blocks))]))
    assert len(meta.saves) == 1
    worker.bind_connector_metadata(meta)
    worker.wait_for_save()  # must not raise
    assert worker.drain(timeout=30)
    return sched, worker, final_path(storage, req_id)


def test_write_failure_is_marked_and_does_not_raise(vc, tmp_path):
    path = final_path(tmp_path, "w")
    os.mkdir(path)  # the final name is taken by a directory: the rename fails
    sched, worker, _ = _save_one(vc, tmp_path)
    assert os.path.isdir(path) and worker.writes == 0
    assert sorted(os.listdir(tmp_path)) == sorted([os.path.basename(path), os.path.basename(error_path(path)),
                                                   os.path.basename(path) + ".lock"])
    done, params = sched.request_finished(req("w"), [1])
    assert done is False and params[PATH_KEY] is None and path in params["error"]


def test_unwritable_storage_leaves_nothing_and_does_not_raise(vc, tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("")
    storage = blocker / "sub"  # under a regular file: nothing can be created there
    sched, worker, path = _save_one(vc, storage)
    assert os.listdir(tmp_path) == ["file"] and worker.writes == 0
    done, params = sched.request_finished(req("w"), [1])
    assert done is False and params[PATH_KEY] is None and "was not written" in params["error"]
    assert f"the hidden-states directory {storage} no longer exists" in params["error"]


def test_storage_replaced_by_a_file_is_named_in_the_answer(vc, tmp_path):
    storage = tmp_path / "hs"
    storage.write_text("")  # the directory became a plain file after the server started
    sched, worker, path = _save_one(vc, storage)
    assert worker.writes == 0 and not os.path.exists(path)
    done, params = sched.request_finished(req("w"), [1])
    assert params[PATH_KEY] is None and f"the hidden-states directory {storage} is no longer a directory" in params["error"]


def test_bad_block_ids_are_marked_and_the_next_save_still_written(vc, tmp_path):
    sched, worker = connector(vc, "SCHEDULER", tmp_path), connector(vc, "WORKER", tmp_path)
    worker.attach_store(store_of((1, 3)))
    news = [new("w", [7, 8, 9], [NUM_BLOCKS + 1]), new("ok", [5, 6], [2])]
    worker.bind_connector_metadata(sched.build_connector_meta(step({"w": 3, "ok": 2}, news=news)))
    worker.wait_for_save()  # must not raise
    assert worker.drain(timeout=30)
    path = final_path(tmp_path, "w")
    assert not os.path.exists(path) and os.path.isfile(error_path(path)) and worker.writes == 1
    done, params = sched.request_finished(req("w"), [NUM_BLOCKS + 1])
    assert params[PATH_KEY] is None and "request w" in params["error"] and "out of range" in params["error"]
    assert sched.request_finished(req("ok"), [2]) == (False, {PATH_KEY: final_path(tmp_path, "ok")})


@pytest.mark.parametrize("rank", [0, 1])
def test_missing_store(vc, tmp_path, monkeypatch, rank):
    import vllm.distributed

    monkeypatch.setattr(vllm.distributed, "get_tensor_model_parallel_rank", lambda: rank)
    sched, worker = connector(vc, "SCHEDULER", tmp_path), connector(vc, "WORKER", tmp_path)
    worker.wait_for_save()  # no metadata bound: nothing to do
    worker.bind_connector_metadata(sched.build_connector_meta(step({"m": 2}, news=[new("m", [1, 2], [0])])))
    if rank == 0:
        with pytest.raises(RuntimeError, match="ehs-capture"):
            worker.wait_for_save()
    else:
        worker.wait_for_save()  # only rank 0 writes
    assert os.listdir(tmp_path) == []


# ------------------------------------------ hs-connectors' fp8 writer: the connector's device branch

@pytest.fixture(scope="module")
def fp8_write(vc):
    """hs-connectors 0.9.0's ``FP8HiddenStatesConnector._write_tensors`` (module scope: see ``vc``).  On vLLM
    0.15/0.16 its base module is missing (patch ``ehs-connector-module`` provides it in a server): a stand-in
    naming this connector, only while hs-connectors' module is imported."""
    import importlib
    import sys
    import types

    pytest.importorskip("hs_connectors.fp8_utils")
    base = "vllm.distributed.kv_transfer.kv_connector.v1.example_hidden_states_connector"
    stand_in = importlib.util.find_spec(base) is None
    if stand_in:
        sys.modules[base] = types.ModuleType(base)
        sys.modules[base].ExampleHiddenStatesConnector = vc.mod.HiddenStatesConnector
    try:
        module = importlib.import_module("hs_connectors.fp8_hidden_states_connector")
    finally:
        if stand_in:
            del sys.modules[base]
    return vars(module.FP8HiddenStatesConnector)["_write_tensors"].__func__


def _fp8_worker(vc, fp8_write, storage):
    """A worker of this connector whose ``_write_tensors`` is hs-connectors' fp8 writer, holding varied rows
    (a row of zeros: the scale's clamp)."""
    cls = type("FP8HiddenStatesConnector", (vc.mod.HiddenStatesConnector,), {"_write_tensors": staticmethod(fp8_write)})
    sched, worker = connector(vc, "SCHEDULER", storage), cls(connector(vc, "WORKER", storage)._vllm_config,
                                                            vc.Role.WORKER)
    store = HiddenStatesStore((1, 3), H, NUM_BLOCKS, B, torch.bfloat16, "cpu")
    store.cache.copy_(torch.randn(store.cache.shape, generator=torch.Generator().manual_seed(5)) * 7)
    store.cache[1, 2] = 0
    worker.attach_store(store)
    return sched, worker, store


def test_the_fp8_writer_is_recognized(vc, fp8_write):
    from spec_compat.patches.hidden_states.ehs_config import fp8_rows

    assert fp8_rows.is_hs_connectors_fp8(fp8_write)
    assert not fp8_rows.is_hs_connectors_fp8(None) and not fp8_rows.is_hs_connectors_fp8(vc.mod.save_and_release)

    def _write_tensors(tensors, event, filename, lock_fd):  # another override: the host path
        return None

    assert not fp8_rows.is_hs_connectors_fp8(_write_tensors)


def test_device_branch_writes_the_host_paths_bytes(vc, fp8_write, tmp_path, monkeypatch):
    """The device branch (rows on an accelerator: quantized there by ``fp8_rows.device_fp8``, then copied)
    writes the bytes of the host path (bf16 rows copied, hs-connectors' writer quantizes them on the host).
    On the CPU the branch runs with CPU tensors standing for device ones; on CUDA:
    tests/gpu/test_fp8_rows_cuda.py."""
    import hashlib

    from safetensors import safe_open

    from spec_compat.patches.hidden_states.ehs_config.fp8_rows import SCALES_KEY

    prompt = [11, 12, 13, 14, 15, 16, 17]
    host_dir, device_dir = tmp_path / "host", tmp_path / "device"
    files = {}
    for where, storage in (("host", host_dir), ("device", device_dir)):
        storage.mkdir()
        sched, worker, store = _fp8_worker(vc, fp8_write, storage)
        calls = []
        if where == "device":
            real = vc.mod.device_fp8

            class OnDevice:  # what the store returns on a GPU: its branch test sees ``device.type``
                device = SimpleNamespace(type="cuda")

                def __init__(self, rows):
                    self.rows = rows

            monkeypatch.setattr(store, "rows", lambda ids, n, rows=store.rows: OnDevice(rows(ids, n)))
            monkeypatch.setattr(vc.mod, "device_fp8", lambda rows, ids: calls.append(1) or real(rows.rows, ids))
        worker.bind_connector_metadata(sched.build_connector_meta(step({"r": 7}, news=[new("r", prompt, [1, 4])])))
        worker.wait_for_save()
        assert worker.drain(timeout=30) and worker.writes == 1
        assert calls == ([1] if where == "device" else [])
        path = final_path(storage, "r")
        with safe_open(path, "pt") as f:
            assert sorted(f.keys()) == ["hidden_states", SCALES_KEY, "token_ids"] and not f.metadata()
            assert f.get_tensor("hidden_states").dtype == torch.float8_e4m3fn
        files[where] = hashlib.sha256(open(path, "rb").read()).hexdigest()
        monkeypatch.undo()
    assert files["device"] == files["host"]


def test_device_fp8_called_directly_gives_the_writers_tensors(vc, fp8_write, tmp_path):
    """``device_fp8`` on CPU tensors: the arguments of ``BackgroundWriter.submit`` after the path; saved, the
    bytes hs-connectors' writer saves for the same rows."""
    import hashlib

    from spec_compat.patches.hidden_states.ehs_config.fp8_rows import device_fp8
    from spec_compat.shims.hidden_states.upstream_writer import HostReady, save_and_release, write_through
    from spec_compat.shims.hidden_states.writer import BackgroundWriter

    rows = (torch.randn(9, 2, 64, generator=torch.Generator().manual_seed(3)) * 100).to(torch.bfloat16)
    rows[4] = 0
    ids = list(range(40, 49))
    tensors, metadata, ready, write = device_fp8(rows, ids)
    assert metadata is None and ready is None and write is save_and_release
    assert list(tensors) == ["hidden_states", "token_ids", "hidden_states_scales"]  # hs-connectors' key order
    w = BackgroundWriter()
    w.submit(str(tmp_path / "device.safetensors"), tensors, metadata, ready, write)
    assert w.drain(timeout=30) and w.written == 1
    host = str(tmp_path / "host.safetensors")
    fd = os.open(host + ".lock", os.O_CREAT | os.O_WRONLY, 0o644)
    try:
        write_through(fp8_write, host, {"hidden_states": rows, "token_ids": torch.tensor(ids)}, HostReady(), fd)
    finally:
        os.close(fd)
    digest = [hashlib.sha256(open(p, "rb").read()).hexdigest() for p in (host, str(tmp_path / "device.safetensors"))]
    assert digest[0] == digest[1]
