"""spec_compat.shims.handoff: captured states handed from a worker process to the driver
through shared-memory segments (CUDA IPC handles on CUDA), not pickled.

A spawned worker process (like vLLM's) captures and returns only the descriptor over a
pickling pipe; this process materializes and compares with a ``torch.cat`` reference of
the same deterministic data, byte for byte.  No mocks of the code under test."""

from __future__ import annotations

import multiprocessing as mp
import os
import pickle
from typing import Any

import pytest

torch = pytest.importorskip("torch")

from spec_compat.verify.compare import compare_identical  # noqa: E402
from spec_compat.shims.capture import PerRequestStore, RowCountError, assemble_in_order  # noqa: E402
from spec_compat.shims.handoff import (  # noqa: E402
    HandoffDescriptor, HandoffError, SegmentedCapture, discard, live_segments, materialize, segment_prefix,
)

#: steps of (request id, rows): interleaved requests, chunked prefills (a, c, e span
#: steps), a request in batch position != its input position, and padding rows (pad)
STEPS = [
    [("a", 5), ("b", 3), ("c", 2)],
    [("c", 7), ("a", 4), ("d", 1)],
    [("e", 6), ("c", 1)],
    [("e", 2)],
]
ORDER = [("d", 1), ("a", 9), ("b", 3), ("c", 10), ("e", 8)]  # input order != capture order


def _layers(steps: list[list[tuple[str, int]]], dtype: Any, hidden: int, n_layers: int,
            pad: int, seed: int, device: str = "cpu") -> list[list[Any]]:
    gen = torch.Generator().manual_seed(seed)
    out = []
    for step in steps:
        rows = sum(n for _, n in step) + pad
        out.append([torch.randn(rows, hidden, generator=gen).to(dtype).to(device)
                    for _ in range(n_layers)])
    return out


def _reference(steps, layers, order) -> list[Any]:
    by_req: dict[str, list[list[Any]]] = {}
    for step, ls in zip(steps, layers):
        start = 0
        for rid, n in step:
            by_req.setdefault(rid, []).append([h[start:start + n] for h in ls])
            start += n
    n_layers = len(layers[0])
    return [torch.cat([torch.cat([p[i] for p in by_req[rid]]) for rid, _ in order])
            for i in range(n_layers)]


def _capture(spec: dict) -> tuple[SegmentedCapture, HandoffDescriptor | None]:
    store = SegmentedCapture(segment_bytes=spec["segment_bytes"], mode=spec.get("mode", "auto"))
    store.adopt(spec.get("spares", ()))
    layers = _layers(spec["steps"], getattr(torch, spec["dtype"]), spec["hidden"], spec["layers"],
                     spec["pad"], spec["seed"], spec.get("device", "cpu"))
    for step, ls in zip(spec["steps"], layers):
        store.begin_step(dict(step))
        store.store(ls, [rid for rid, _ in step])
        store.end_step()
    return store, store.finish()


def _worker_loop(conn: Any) -> None:
    """The spawned 'worker': captures each scenario it is sent and returns the descriptor
    (pickled by the pipe, as collective_rpc pickles a reply).  CUDA segments stay alive
    until the next message (the driver's acknowledgement)."""
    held: list[SegmentedCapture] = []
    while True:
        spec = conn.recv()
        for store in held:
            store.release()  # the driver has acknowledged by sending again
        held.clear()
        if spec is None:
            return
        try:
            store, desc = _capture(spec)
            held.append(store)
            conn.send((os.getpid(), desc))
        except Exception as e:  # pragma: no cover - surfaced in the test
            conn.send((os.getpid(), e))


@pytest.fixture(scope="module")
def worker():
    ctx = mp.get_context("spawn")
    parent, child = ctx.Pipe()
    proc = ctx.Process(target=_worker_loop, args=(child,), daemon=True)
    proc.start()

    def call(spec: dict) -> tuple[int, HandoffDescriptor | None]:
        parent.send(spec)
        assert parent.poll(60), "worker did not answer"
        pid, desc = parent.recv()
        if isinstance(desc, Exception):
            raise desc
        return pid, desc

    yield call
    parent.send(None)
    proc.join(30)
    if proc.is_alive():  # pragma: no cover
        proc.kill()
    for name in _segments(proc.pid):  # pragma: no cover - only after a failed test
        os.unlink(os.path.join("/dev/shm", name))


_segments = live_segments


def _same_bytes(a: Any, b: Any) -> bool:
    """Same dtype, shape and bytes; an empty or NaN/inf-holding tensor is never evidence."""
    return compare_identical(a, b).ok


pytestmark = pytest.mark.skipif(not os.path.isdir("/dev/shm"), reason="needs POSIX /dev/shm")


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("segment_bytes,threads", [(1000, 1), (1000, 3), (1 << 20, None)])
def test_round_trip_across_processes_is_byte_identical(worker, dtype, segment_bytes, threads):
    """Many small segments read one at a time or by 3 threads, or a single segment."""
    spec = dict(steps=STEPS, dtype=dtype, hidden=24, layers=3, pad=2, seed=7,
                segment_bytes=segment_bytes)
    pid, desc = worker(spec)
    assert desc.kind == "shm" and desc.dtype == dtype and desc.num_layers == 3
    assert desc.row_counts() == dict(ORDER)
    assert _segments(pid) == set(desc.segments)  # alive in /dev/shm between the processes
    if segment_bytes == 1000:  # a step's rows of one layer span several segments
        assert len(desc.segments) > 2 and len(desc.blocks) > len(STEPS) * 3
    out = materialize(desc, ORDER, threads=threads)
    ref = _reference(STEPS, _layers(STEPS, getattr(torch, dtype), 24, 3, 2, 7), ORDER)
    assert len(out) == 3 and all(_same_bytes(o, r) for o, r in zip(out, ref))
    assert _segments(pid) == set()


def test_same_rows_as_per_request_store_and_assemble_in_order():
    layers = _layers(STEPS, torch.bfloat16, 16, 2, 1, 3)
    seg, per = SegmentedCapture(segment_bytes=333), PerRequestStore()
    for step, ls in zip(STEPS, layers):
        for store in (seg, per):
            store.begin_step(dict(step))
            store.store(ls, [rid for rid, _ in step])
            store.end_step()
    seg.store(layers[0], ["a"])  # outside any step (warm-up forward): ignored by both
    per.store(layers[0], ["a"])
    expected = assemble_in_order(per.collect(), ORDER)
    got = materialize(seg.finish(), ORDER)
    assert all(_same_bytes(g, e) for g, e in zip(got, expected))


def test_layer_by_layer_writer_equals_whole_step():
    """forward(req_ids).add(h) per layer, as capture_forward can call it while the layers
    are computed: the same rows as store(); warm-up forwards get no writer."""
    layers = _layers(STEPS, torch.float32, 8, 3, 1, 11)
    whole, streamed = SegmentedCapture(segment_bytes=200), SegmentedCapture(segment_bytes=200)
    assert streamed.forward(["a"]) is None  # outside a step
    for step, ls in zip(STEPS, layers):
        ids = [rid for rid, _ in step]
        for store in (whole, streamed):
            store.begin_step(dict(step))
        whole.store(ls, ids)
        writer = streamed.forward(ids)
        for h in ls:
            writer.add(h.clone())  # a temporary, freed at once
        writer.close()
    a, b = materialize(whole.finish(), ORDER), materialize(streamed.finish(), ORDER)
    assert all(_same_bytes(x, y) for x, y in zip(a, b))
    with pytest.raises(HandoffError, match="not closed"):
        streamed.rows_writer([("a", 1)]).add(torch.zeros(1, 8)) or streamed.rows_writer([])
    streamed.discard()
    assert _segments(os.getpid()) == set()


def _mapped_segments() -> set[str]:
    """Names of this process's mappings of (unlinked) capture segments."""
    with open("/proc/self/maps") as f:
        return {ln.split("/dev/shm/")[1].split()[0] for ln in f
                if "/dev/shm/" + segment_prefix() in ln}


@pytest.mark.skipif(not os.path.exists("/proc/self/maps"), reason="needs /proc/self/maps")
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("steps", [
    [[("a", 7), ("b", 300), ("c", 45)]],  # one step
    [[("a", 7), ("b", 100)], [("b", 200), ("c", 45)], [("d", 9)]],  # steps in input order, b chunked
], ids=["one-step", "three-steps"])
def test_steps_in_input_order_are_mapped_not_copied(worker, dtype, steps):
    """Steps that scheduled the requests in input order (one step, or several with a
    chunked prefill between them): each layer's rows are one range of its segment chain,
    returned as a view of the pages (no copy); the names are unlinked at once and the pages
    go with the last tensor.  Byte-identical to the reference; writable."""
    import gc

    order = []
    for step in steps:
        for rid, n in step:
            if order and order[-1][0] == rid:
                order[-1] = (rid, order[-1][1] + n)
            else:
                order.append((rid, n))
    spec = dict(steps=steps, dtype=dtype, hidden=40, layers=3, pad=3, seed=5, segment_bytes=1 << 20)
    pid, desc = worker(spec)
    assert len(desc.segments) == 3  # one per layer
    out = materialize(desc, order)
    ref = _reference(steps, _layers(steps, getattr(torch, dtype), 40, 3, 3, 5), order)
    assert all(_same_bytes(o, r) for o, r in zip(out, ref))
    assert _segments(pid) == set()  # unlinked ...
    assert set(desc.segments) <= _mapped_segments()  # ... and mapped here
    out[1][0, 0] = 1.5  # writable (its own pages: nothing else sees them)
    assert float(out[1][0, 0]) == 1.5
    rows = [o[50:60].clone() for o in out]
    del out
    gc.collect()
    assert not set(desc.segments) & _mapped_segments()  # unmapped with the tensors
    assert all(_same_bytes(r, x[50:60]) for r, x in zip(rows, ref))


def test_rows_out_of_order_or_over_steps_are_copied(worker):
    """Requests in another order than the input (within a step or across steps), a layer
    whose rows fill more than one segment, or ``map_pages=False``: the layers are read into
    fresh tensors and nothing stays mapped."""
    big = 1 << 20
    for steps, order, map_pages, segment_bytes in (
            ([[("b", 4), ("a", 6)]], [("a", 6), ("b", 4)], True, big),
            ([[("b", 4)], [("a", 6)]], [("a", 6), ("b", 4)], True, big),
            ([[("a", 5), ("b", 2)], [("a", 3)]], [("a", 8), ("b", 2)], True, big),
            ([[("a", 5)], [("a", 3)]], [("a", 8)], True, 6 * 16 * 4),  # 6 rows per segment
            ([[("a", 6), ("b", 4)]], [("a", 6), ("b", 4)], False, big)):
        pid, desc = worker(dict(steps=steps, dtype="float32", hidden=16, layers=2, pad=0, seed=9,
                                segment_bytes=segment_bytes))
        out = materialize(desc, order, map_pages=map_pages)
        ref = _reference(steps, _layers(steps, torch.float32, 16, 2, 0, 9), order)
        assert all(_same_bytes(o, r) for o, r in zip(out, ref))
        assert not set(desc.segments) & _mapped_segments()
        assert _segments(pid) == set()


def test_row_count_error_names_requests_and_leaks_no_segment(worker):
    before = _segments()
    pid, desc = worker(dict(steps=STEPS, dtype="float32", hidden=8, layers=2, pad=0, seed=1,
                            segment_bytes=256))
    assert _segments(pid)
    wrong = [("d", 1), ("a", 9), ("b", 4), ("c", 10), ("e", 8), ("zz", 3)]
    with pytest.raises(RowCountError) as info:
        materialize(desc, wrong)
    msg = str(info.value)
    assert "b: 3 != 4" in msg and "zz" in msg and "a:" not in msg
    assert _segments(pid) == set() and _segments() <= before


def test_store_rejects_more_scheduled_tokens_than_rows():
    store = SegmentedCapture()
    with pytest.raises(RowCountError, match="scheduled 5 tokens"):
        store.store_rows([torch.zeros(4, 8)], [("a", 2), ("b", 3)])
    assert store.finish() is None


def test_empty_capture():
    store = SegmentedCapture()
    assert store.finish() is None
    store.store([torch.zeros(3, 8)], ["a"])  # no step begun: ignored
    store.begin_step({"a": 0})
    store.store([torch.zeros(3, 8)], ["a"])  # scheduled, but no rows
    assert store.finish() is None
    assert materialize(None, []) == []
    with pytest.raises(RowCountError, match="no rows for 1 request"):
        materialize(None, [("a", 3)])


def test_descriptor_pickles_to_bytes_not_payload():
    def desc_for(n_requests: int, hidden: int) -> tuple[int, int]:
        store = SegmentedCapture()
        for start in range(0, n_requests, 100):  # steps of 100 requests, 4 rows each
            ids = [f"req-{i}" for i in range(start, min(start + 100, n_requests))]
            store.store_rows([torch.ones(4 * len(ids), hidden, dtype=torch.bfloat16)] * 4,
                             [(r, 4) for r in ids])
        payload = store.captured_bytes
        desc = store.finish()
        size = len(pickle.dumps(desc, protocol=pickle.HIGHEST_PROTOCOL))
        discard(desc)
        return size, payload

    small, _ = desc_for(100, 64)
    assert small < 4096, small
    big, payload = desc_for(2000, 1024)  # 64 MB of rows
    same_layout, _ = desc_for(2000, 16)
    assert big < 64 * 2000 and big < payload / 1000, (big, payload)
    assert abs(big - same_layout) < 64  # the size does not depend on the payload


def test_discard_and_double_materialize(worker):
    spec = dict(steps=STEPS, dtype="float32", hidden=8, layers=2, pad=0, seed=2, segment_bytes=512)
    pid, desc = worker(spec)
    discard(desc)
    assert _segments(pid) == set()
    pid, desc = worker(spec)
    materialize(desc, ORDER)
    with pytest.raises(HandoffError, match="is gone"):
        materialize(desc, ORDER)
    assert _segments(pid) == set()

    store = SegmentedCapture(segment_bytes=100)
    store.store_rows([torch.zeros(10, 8)], [("a", 10)])
    assert _segments(os.getpid())
    store.discard()
    assert _segments(os.getpid()) == set() and store.finish() is None


def test_inconsistent_steps_are_refused():
    store = SegmentedCapture(segment_bytes=100)
    store.store_rows([torch.zeros(2, 8)], [("a", 2)])
    with pytest.raises(HandoffError, match="changed between"):
        store.store_rows([torch.zeros(2, 8, dtype=torch.float64)], [("b", 2)])
    with pytest.raises(HandoffError, match="changed between"):
        store.store_rows([torch.zeros(2, 8), torch.zeros(2, 4)], [("b", 2)])
    with pytest.raises(HandoffError, match="more than 1 layers"):
        store.store_rows([torch.zeros(2, 8), torch.zeros(2, 8)], [("b", 2)])
    writer = store.rows_writer([("b", 2)])
    with pytest.raises(HandoffError, match="captured 0 layers|not closed"):
        store.rows_writer([("c", 1)])
    writer.add(torch.full((2, 8), 3.0))
    writer.close()
    assert store.rows == 4
    assert sum(b[4] for b in store._blocks) == 4  # failed forwards left no block behind
    assert [o.tolist() for o in materialize(store.finish(), [("a", 2), ("b", 2)])] == [
        [[0.0] * 8] * 2 + [[3.0] * 8] * 2]
    store.discard()
    assert _segments(os.getpid()) == set()


cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")


@cuda
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_cuda_ipc_round_trip_across_processes(worker, dtype):
    spec = dict(steps=STEPS, dtype=dtype, hidden=24, layers=3, pad=2, seed=5,
                segment_bytes=1000, device="cuda")
    _, desc = worker(spec)
    assert desc.kind == "cuda" and len(desc.segments) > 1
    out = materialize(desc, ORDER)
    worker(dict(spec, steps=[]))  # acknowledgement: the worker releases its segments
    ref = _reference(STEPS, _layers(STEPS, getattr(torch, dtype), 24, 3, 2, 5), ORDER)
    assert all(o.is_cuda and _same_bytes(o.cpu(), r) for o, r in zip(out, ref))
    cpu = materialize(_capture(dict(spec, mode="shm"))[1], ORDER)  # CUDA rows through /dev/shm
    assert all(not c.is_cuda and _same_bytes(c, r) for c, r in zip(cpu, ref))


@cuda
def test_cuda_same_process():
    store = SegmentedCapture(segment_bytes=4096)
    layers = _layers(STEPS, torch.bfloat16, 16, 2, 0, 9, "cuda")
    for step, ls in zip(STEPS, layers):
        store.store_rows(ls, step)
    desc = store.finish()
    wire = pickle.dumps(desc, protocol=pickle.HIGHEST_PROTOCOL)  # as collective_rpc would send it
    assert len(wire) < 16384 and all(isinstance(s, tuple) for s in pickle.loads(wire).segments)
    out = materialize(desc, ORDER)  # same process, not pickled: the segment tensors themselves
    store.release()
    ref = _reference(STEPS, layers, ORDER)
    assert all(_same_bytes(o, r) for o, r in zip(out, ref))


def test_worker_keeps_the_pickled_reply_when_dev_shm_is_small(monkeypatch, caplog):
    """capture-handoff-shm checks free /dev/shm before each capture (a container's default is
    64 MB): below MIN_FREE_SHM the worker keeps the pickled reply and says so."""
    from spec_compat.patches.extraction import capture_handoff_shm

    monkeypatch.setattr(capture_handoff_shm, "MIN_FREE_SHM", 1 << 62)
    assert capture_handoff_shm.shm_usable() is False
    assert "captured rows go back pickled" in caplog.text
    monkeypatch.setattr(capture_handoff_shm, "MIN_FREE_SHM", 0)
    assert capture_handoff_shm.shm_usable() is True


# -- recycling: segments the driver has read go back to the worker ------------------------
from spec_compat.core.switches import parse_pool_bytes as pool_bytes_from_env  # noqa: E402
from spec_compat.shims.handoff import pooled_segments, release_pool, reopen_pool, take_spares  # noqa: E402


@pytest.fixture
def pool():
    release_pool()
    reopen_pool()
    yield
    release_pool()
    reopen_pool()


def _spec(seed: int, spares=(), steps=None) -> dict:
    return dict(steps=steps or [[("a", 40), ("b", 24)], [("c", 30)]], dtype="float32", hidden=32, layers=2,
                pad=1, seed=seed, segment_bytes=1 << 16, spares=list(spares))


def _ref(spec: dict, order) -> list:
    return _reference(spec["steps"], _layers(spec["steps"], torch.float32, spec["hidden"], spec["layers"],
                                             spec["pad"], spec["seed"]), order)


ORDER3 = [("a", 40), ("b", 24), ("c", 30)]


@pytest.mark.parametrize("map_pages", [True, False])
def test_recycled_segments_are_written_again_byte_identical(worker, pool, map_pages):
    """Call 1's segments, once read (copied) or once their tensors are gone (mapped), are
    pooled; call 2's worker writes into exactly those and its rows equal the reference."""
    import gc

    spec1 = _spec(1)
    pid, d1 = worker(spec1)
    out1 = materialize(d1, ORDER3, map_pages=map_pages, recycle_bytes=1 << 30)
    assert all(_same_bytes(o, r) for o, r in zip(out1, _ref(spec1, ORDER3)))
    if map_pages:  # the tensors view the pages: not reusable yet
        assert pooled_segments() == {}
        del out1
        gc.collect()
    assert set(pooled_segments()) == set(d1.segments)
    assert all(size > 0 for size in pooled_segments().values())  # pages allocated
    spares = take_spares()
    assert pooled_segments() == {}
    spec2 = _spec(2, spares)
    pid, d2 = worker(spec2)
    assert set(d2.segments) == set(spares) and d2.spares == ()  # every segment reused
    out2 = materialize(d2, ORDER3, map_pages=map_pages, recycle_bytes=1 << 30)
    assert all(_same_bytes(o, r) for o, r in zip(out2, _ref(spec2, ORDER3)))
    del out2
    gc.collect()
    assert set(pooled_segments()) == set(spares)
    release_pool()
    assert _segments(pid) == set()


def test_a_live_mapped_tensor_is_never_written_over(worker, pool):
    """A caller keeps call 1's mapped layer: call 2 gets no spare and writes fresh segments;
    call 1's rows stay as they were.  Once the caller drops them, call 3 reuses the pages."""
    import gc

    spec1 = _spec(1)
    _, d1 = worker(spec1)
    kept = materialize(d1, ORDER3, recycle_bytes=1 << 30)[1]  # layer 0's tensor dropped at once
    gc.collect()
    assert set(pooled_segments()) <= set(d1.segments) and len(pooled_segments()) == 1
    spares = take_spares()
    spec2 = _spec(2, spares)
    _, d2 = worker(spec2)
    assert set(spares) < set(d2.segments)  # the dropped layer's segment reused, one fresh
    out2 = materialize(d2, ORDER3, recycle_bytes=1 << 30)
    assert all(_same_bytes(o, r) for o, r in zip(out2, _ref(spec2, ORDER3)))
    assert _same_bytes(kept, _ref(spec1, ORDER3)[1])  # untouched by call 2
    del kept, out2
    gc.collect()
    assert len(pooled_segments()) == 3


def test_unused_spares_come_back_and_a_cap_unlinks(worker, pool):
    """More spares than a call needs: the rest come back in the descriptor and return to
    the pool; a pool cap below a segment's pages unlinks instead of pooling; a worker store
    discarded with spares unlinks them."""
    spec1 = _spec(1)
    pid, d1 = worker(spec1)
    materialize(d1, ORDER3, map_pages=False, recycle_bytes=1 << 30)
    spares = take_spares()
    small = dict(_spec(3, spares, steps=[[("x", 5)]]), layers=1)
    _, d2 = worker(small)
    assert len(d2.segments) == 1 and set(d2.spares) == set(spares) - set(d2.segments)
    out = materialize(d2, [("x", 5)], map_pages=False, recycle_bytes=1)  # cap: 1 byte
    assert _same_bytes(out[0], _ref(small, [("x", 5)])[0])
    assert pooled_segments() == {} and _segments(pid) == set()  # nothing fits the cap: all unlinked

    _, d3 = worker(spec1)
    materialize(d3, ORDER3, map_pages=False, recycle_bytes=1 << 30)
    store = SegmentedCapture()
    store.adopt(take_spares())
    store.discard()
    assert _segments(pid) == set() and _segments(os.getpid()) == set()


def test_release_pool_unlinks_pooled_and_mapped_names(worker, pool):
    import gc

    _, d1 = worker(_spec(1))
    out = materialize(d1, ORDER3, recycle_bytes=1 << 30)
    release_pool()  # at exit: nothing of spec-compat's left in /dev/shm, mapped pages still readable
    assert live_segments() & set(d1.segments) == set()
    assert _same_bytes(out[0], _ref(_spec(1), ORDER3)[0])
    del out
    gc.collect()
    assert pooled_segments() == {}  # a return after release is unlinked, not pooled


def test_pool_switch():
    assert pool_bytes_from_env(None) == pool_bytes_from_env("") == 0  # opt-in
    assert pool_bytes_from_env(" 0 ") == 0 and pool_bytes_from_env("64") == 64 << 20
    from spec_compat import REGISTRY
    from spec_compat.core import switches

    assert switches.POOL_VAR in REGISTRY.get("capture-handoff-shm").reads  # names the patch in the message
    for bad in ("-1", "1.5", "lots", "64MB"):
        with pytest.raises(ValueError, match=r"^SPEC_COMPAT_SHM_POOL_MB="):
            pool_bytes_from_env(bad)
        with pytest.raises(ValueError, match=r"spec_compat\[capture-handoff-shm\]: SPEC_COMPAT_SHM_POOL_MB="):
            switches.value(switches.POOL_VAR, {switches.POOL_VAR: bad})
