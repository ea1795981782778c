"""P4 / P5 (issue #7): handing captured hidden states from a worker process to the driver.

P4, timed side by side in one run (variants alternate within every repeat):

  pickled  what upstream does.  The worker ``torch.cat``-s its per-layer step lists
           (speculators 0.3.x ``_get_captured_states``) and returns the tensors as the
           reply of ``collective_rpc``: vLLM's ``WorkerProc.enqueue_output`` puts
           ``(SUCCESS, output)`` on the worker's response ``MessageQueue``, which pickles it
           (protocol 5, out-of-band buffers >= 1 MiB) and, past the ring buffer's chunk size,
           sends the frames over a ZeroMQ IPC socket; the driver's ``dequeue`` unpickles.
           Transport ``vllm`` uses that very ``MessageQueue`` class
           (vllm.distributed.device_communicators.shm_broadcast); ``zmq`` is a copy of its
           overflow path (pickle protocol 5 + oob callback, send_multipart/recv_multipart
           with copy=False over ipc://) for machines without vLLM; ``pipe`` a
           multiprocessing Connection.  A torch tensor pickles its storage in-band
           (torch.save into bytes), so the whole payload goes through the pickle stream.
           CUDA tensors are pickled as they are (torch.save copies them to the host, the
           driver's unpickling puts them back on the GPU).
  handoff  spec_compat.shims.handoff: the worker's SegmentedCapture copies every step into
           shared-memory segments (CUDA: device segments) as it is captured, returns the
           small descriptor through the same transport; the driver's ``materialize``
           reads the rows into the final per-layer tensors in request order (CUDA: IPC
           handles, device-to-device copies).
  per-request (--per-request) the current spec_compat F10 path: PerRequestStore.collect()
           pickled through the same transport, then assemble_in_order in the driver.

Timed: from "the worker holds every step's captured tensors" (the driver sends the
request) to "the driver holds the final per-layer tensors" (CUDA: synchronized).  The
handoff variant's per-step copies, which in a real run happen during the forward steps,
are inside the timed region.  Every result is compared byte for byte with a torch.cat
reference.

P5: peak memory of the capture in a fresh process per variant, over captured bytes:
upstream (list per layer + torch.cat), handoff (SegmentedCapture fed a step's layers
together) and handoff-layers (fed each layer as it is computed, LayerWriter).  CPU: RSS
(VmHWM) plus the bytes of the process's /dev/shm segments (sampled every 0.5 ms, and the
upper bound HWM + all segment bytes); CUDA: torch.cuda.max_memory_allocated.

  python benchmarks/handoff.py [--device cpu|cuda] [--tokens 8192] [--hidden 7168]
      [--layers 4] [--dtype bfloat16] [--repeats 5] [--transport auto|vllm|zmq|pipe]
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import pickle
import platform
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

LENGTHS = [640, 1152, 384, 896, 512, 1408, 256, 768, 1024, 320, 960, 448]


# -- workload ---------------------------------------------------------------------------
def requests_for(tokens: int) -> list[tuple[str, int]]:
    out, total, i = [], 0, 0
    while total < tokens:
        n = min(LENGTHS[i % len(LENGTHS)], tokens - total)
        out.append((f"req-{i}", n))
        total += n
        i += 1
    return out


def schedule(requests: list[tuple[str, int]], budget: int) -> list[list[tuple[str, int]]]:
    """FCFS chunked prefill: every step takes up to ``budget`` tokens, in arrival order."""
    steps: list[list[tuple[str, int]]] = []
    step: list[tuple[str, int]] = []
    room = budget
    for rid, n in requests:
        while n:
            k = min(n, room)
            step.append((rid, k))
            n -= k
            room -= k
            if room == 0:
                steps.append(step)
                step, room = [], budget
    if step:
        steps.append(step)
    return steps


def make_steps(cfg: dict, device: str) -> list[list[Any]]:
    import torch

    dtype = getattr(torch, cfg["dtype"])
    gen = torch.Generator().manual_seed(1234)
    out = []
    for step in cfg["steps"]:
        rows = sum(n for _, n in step)
        layers = []
        for _ in range(cfg["layers"]):
            t = torch.empty(rows, cfg["hidden"], dtype=dtype)
            t.uniform_(-4, 4, generator=gen)
            layers.append(t.to(device))
        out.append(layers)
    return out


# -- transports -------------------------------------------------------------------------
class Transport:
    """Writer in the worker, reader in the driver; ``handle`` travels over the control pipe."""

    name = "?"

    def send(self, obj: Any) -> None:
        raise NotImplementedError

    def recv(self) -> Any:
        raise NotImplementedError


class VllmMQ(Transport):
    name = "vllm"

    def __init__(self, handle: Any = None) -> None:
        from vllm.distributed.device_communicators.shm_broadcast import MessageQueue

        if handle is None:
            self.mq = MessageQueue(1, 1)  # as WorkerProc's worker_response_mq
        else:
            self.mq = MessageQueue.create_from_handle(handle, 0)
        self.handle = self.mq.export_handle()

    def ready(self) -> None:
        self.mq.wait_until_ready()

    def send(self, obj: Any) -> None:
        self.mq.enqueue(("SUCCESS", obj))

    def recv(self) -> Any:
        return self.mq.dequeue(indefinite=True)[1]


class ZmqCopy(Transport):
    """vLLM MessageQueue's overflow path: pickle protocol 5 with out-of-band buffers of
    at least 1 MiB, frames sent with send_multipart(copy=False), unpickled with them."""

    name = "zmq"

    def __init__(self, handle: Any = None) -> None:
        import zmq

        self.ctx = zmq.Context()
        self.sock = self.ctx.socket(zmq.PAIR)
        if handle is None:
            handle = f"ipc://{tempfile.mkdtemp()}/handoff.sock"
            self.sock.bind(handle)
        else:
            self.sock.connect(handle)
        self.handle = handle

    def ready(self) -> None:
        pass

    def send(self, obj: Any) -> None:
        bufs: list[Any] = [b""]

        def oob(buf: pickle.PickleBuffer) -> bool:
            raw = buf.raw()
            if len(raw) < 1024 * 1024:
                return True
            bufs.append(raw)
            return False

        bufs[0] = pickle.dumps(("SUCCESS", obj), protocol=pickle.HIGHEST_PROTOCOL, buffer_callback=oob)
        self.sock.send_multipart(bufs, copy=False)

    def recv(self) -> Any:
        first, *rest = self.sock.recv_multipart(copy=False)
        return pickle.loads(first, buffers=rest)[1]


class PipeConn(Transport):
    name = "pipe"

    def __init__(self, handle: Any = None) -> None:
        self.conn = handle
        self.handle = None

    def ready(self) -> None:
        pass

    def send(self, obj: Any) -> None:
        self.conn.send_bytes(pickle.dumps(("SUCCESS", obj), protocol=pickle.HIGHEST_PROTOCOL))

    def recv(self) -> Any:
        return pickle.loads(self.conn.recv_bytes())[1]


TRANSPORTS = {"vllm": VllmMQ, "zmq": ZmqCopy, "pipe": PipeConn}


def pick_transport(name: str) -> str:
    if name != "auto":
        return name
    import importlib.util

    if importlib.util.find_spec("vllm") is not None:
        return "vllm"
    if importlib.util.find_spec("zmq") is not None:
        return "zmq"
    return "pipe"


# -- worker process ---------------------------------------------------------------------
def worker_main(ctrl: Any, data_conn: Any, cfg: dict) -> None:
    import torch

    from spec_compat.shims.capture import PerRequestStore
    from spec_compat.shims.handoff import SegmentedCapture

    torch.set_num_threads(cfg["threads"])
    device = cfg["device"]
    cls = TRANSPORTS[cfg["transport"]]
    tr = cls(data_conn) if cls is PipeConn else cls()
    ctrl.send(tr.handle)
    tr.ready()
    steps = make_steps(cfg, device)
    if device == "cuda":
        torch.cuda.synchronize()
    ctrl.send("ready")
    held: list[Any] = []
    while True:
        cmd = ctrl.recv()
        if cmd is None:
            return
        if cmd == "release":
            for store in held:
                store.release()
            held.clear()
            continue
        t_start = time.perf_counter()
        if cmd == "pickled":
            out = [torch.cat([s[i] for s in steps], dim=0) for i in range(cfg["layers"])]
            tr.send(out)
            del out
        elif cmd == "per-request":
            store = PerRequestStore()
            for step, layers in zip(cfg["steps"], steps):
                store.begin_step(dict(step))
                store.store(layers, [rid for rid, _ in step])
                store.end_step()
            tr.send(store.collect())
        elif cmd == "handoff":
            store = SegmentedCapture(segment_bytes=cfg["segment_bytes"])
            for step, layers in zip(cfg["steps"], steps):
                store.begin_step(dict(step))
                store.store(layers, [rid for rid, _ in step])
                store.end_step()
            desc = store.finish()
            held.append(store)  # CUDA: segments alive until the driver's "release"
            tr.send(desc)
        ctrl.send(time.perf_counter() - t_start)  # worker side: capture copies + reply sent


# -- P4 -----------------------------------------------------------------------------------
def run_p4(cfg: dict, variants: list[str], repeats: int) -> dict:
    import torch

    from spec_compat.verify.compare import compare_identical
    from spec_compat.shims.capture import assemble_in_order
    from spec_compat.shims.handoff import materialize

    ctx = mp.get_context("spawn")
    ctrl, child_ctrl = ctx.Pipe()
    data_r, data_w = ctx.Pipe(duplex=False)
    proc = ctx.Process(target=worker_main, args=(child_ctrl, data_w, cfg), daemon=True)
    proc.start()
    handle = ctrl.recv()
    cls = TRANSPORTS[cfg["transport"]]
    tr = cls(data_r) if cls is PipeConn else cls(handle)
    tr.ready()
    assert ctrl.recv() == "ready"

    device = cfg["device"]
    ref = [torch.cat([s[i] for s in make_steps(cfg, "cpu")]) for i in range(cfg["layers"])]
    if device == "cuda":
        ref = [r.to(device) for r in ref]
    order = cfg["order"]

    def once(variant: str) -> tuple[float, bool, float]:
        t0 = time.perf_counter()
        ctrl.send(variant)
        reply = tr.recv()
        if variant == "pickled":
            out = reply
        elif variant == "per-request":
            out = assemble_in_order(reply, order)
        else:
            out = materialize(reply, order, threads=cfg["read_threads"])
        if device == "cuda":
            torch.cuda.synchronize()
        dt = time.perf_counter() - t0
        worker_s = ctrl.recv()
        if variant == "handoff" and reply.kind == "cuda":
            ctrl.send("release")
        same = len(out) == len(ref) > 0 and all(o.device == r.device and compare_identical(o, r).ok
                                                 for o, r in zip(out, ref))
        del out, reply
        return dt, same, worker_s

    once("handoff")  # warm-up (first-time costs: CUDA contexts, IPC, imports)
    once("pickled")
    times: dict[str, list[float]] = {v: [] for v in variants}
    worker_times: dict[str, list[float]] = {v: [] for v in variants}
    identical = {v: True for v in variants}
    for r in range(repeats):
        for v in (variants if r % 2 == 0 else variants[::-1]):
            dt, same, worker_s = once(v)
            times[v].append(dt)
            worker_times[v].append(worker_s)
            identical[v] &= same
            print(f"  repeat {r + 1} {v:12s} {dt * 1000:9.1f} ms (worker side {worker_s * 1000:8.1f} ms)"
                  f"  identical={same}", flush=True)
    ctrl.send(None)
    proc.join(60)

    def stats(xs: list[float]) -> dict:
        return {"min": min(xs), "median": statistics.median(xs), "max": max(xs), "all": xs}

    result = {"seconds": {v: stats(times[v]) for v in variants},
              "worker_side_seconds": {v: stats(worker_times[v]) for v in variants},
              "identical": identical, "ratios": {}}
    for v in variants:
        if v == "handoff":
            continue
        paired = [a / b for a, b in zip(times[v], times["handoff"])]
        result["ratios"][f"{v}/handoff"] = {
            **stats(paired),
            "of_medians": statistics.median(times[v]) / statistics.median(times["handoff"]),
        }
    return result


# -- P5 -----------------------------------------------------------------------------------
def _status_kb(field: str) -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    return 0


def _own_shm_bytes() -> int:
    from spec_compat.shims.handoff import segment_prefix

    prefix = f"{segment_prefix()}{os.getpid()}_"
    total = 0
    for name in os.listdir("/dev/shm"):
        if name.startswith(prefix):
            try:
                total += os.stat(os.path.join("/dev/shm", name)).st_blocks * 512
            except FileNotFoundError:
                pass
    return total


def mem_child(conn: Any, variant: str, cfg: dict) -> None:
    """One capture in a fresh process; reports peaks in bytes above the start."""
    import torch

    from spec_compat.shims.handoff import SegmentedCapture, discard

    torch.set_num_threads(cfg["threads"])
    device = cfg["device"]
    dtype = getattr(torch, cfg["dtype"])
    peak = {"total": 0}
    stop = threading.Event()

    def sampler() -> None:
        while not stop.is_set():
            peak["total"] = max(peak["total"], _status_kb("VmRSS") * 1024 + _own_shm_bytes())
            time.sleep(0.0005)

    def step_tensors(step: list[tuple[str, int]], k: int) -> list[Any]:
        rows = sum(n for _, n in step)  # what the forward hands over: one fresh tensor a layer
        return [torch.full((rows, cfg["hidden"]), float(k % 7), dtype=dtype, device=device)
                for _ in range(cfg["layers"])]

    if device == "cuda":
        torch.zeros(1, device=device)
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        base_cuda = torch.cuda.memory_allocated()
    base_rss = _status_kb("VmRSS") * 1024
    thread = threading.Thread(target=sampler, daemon=True)
    thread.start()
    t0 = time.perf_counter()
    extra: dict = {}
    if variant == "upstream":  # speculators 0.3.x: a list per layer, torch.cat at the end
        lists: list[list[Any]] = [[] for _ in range(cfg["layers"])]
        for k, step in enumerate(cfg["steps"]):
            for i, h in enumerate(step_tensors(step, k)):
                lists[i].append(h)
        out = [torch.cat(parts, dim=0) for parts in lists]
        del lists
        if device == "cuda":
            torch.cuda.synchronize()
        hwm_capture = _status_kb("VmHWM") * 1024
        if cfg.get("pickle_reply"):
            payload = pickle.dumps(out, protocol=pickle.HIGHEST_PROTOCOL)  # the reply, as enqueue does
            extra["reply_bytes"] = len(payload)
            extra["rss_hwm_with_reply_above_start"] = _status_kb("VmHWM") * 1024 - base_rss
            del payload
        del out
    else:
        store = SegmentedCapture(segment_bytes=cfg["segment_bytes"])
        for k, step in enumerate(cfg["steps"]):
            if variant == "handoff":  # a step's layers together, as capture_forward collects them
                layers = step_tensors(step, k)
                store.store_rows(layers, step)
                del layers
            else:  # "handoff-layers": each layer written as the forward produces it
                writer = store.rows_writer(step)
                for _ in range(cfg["layers"]):
                    h = torch.full((sum(n for _, n in step), cfg["hidden"]), float(k % 7),
                                   dtype=dtype, device=device)
                    writer.add(h)
                    del h
                writer.close()
        if device == "cuda":
            torch.cuda.synchronize()
        hwm_capture = _status_kb("VmHWM") * 1024
        shm_final = _own_shm_bytes()
        desc = store.finish()
        extra["descriptor_bytes"] = len(pickle.dumps(desc, protocol=pickle.HIGHEST_PROTOCOL))
        extra["shm_bytes_at_finish"] = shm_final
        discard(desc)
        store.release()
    seconds = time.perf_counter() - t0
    stop.set()
    thread.join()
    res = {
        "variant": variant,
        "seconds": seconds,
        "rss_hwm_above_start": hwm_capture - base_rss,
        "sampled_rss_plus_shm_peak_above_start": peak["total"] - base_rss,
        **extra,
    }
    if variant != "upstream":  # upper bound: anonymous peak + every segment byte at once
        res["bound_rss_hwm_plus_shm"] = res["rss_hwm_above_start"] + extra["shm_bytes_at_finish"]
    if device == "cuda":
        res["cuda_peak_above_start"] = torch.cuda.max_memory_allocated() - base_cuda
    conn.send(res)


def run_p5(cfg: dict, captured: int, pickle_reply: bool) -> dict:
    ctx = mp.get_context("spawn")
    out = {}
    for variant in ("upstream", "handoff", "handoff-layers"):
        parent, child = ctx.Pipe()
        proc = ctx.Process(target=mem_child, args=(child, variant, dict(cfg, pickle_reply=pickle_reply)))
        proc.start()
        res = parent.recv()
        proc.join(60)
        for key in ("rss_hwm_above_start", "sampled_rss_plus_shm_peak_above_start",
                    "rss_hwm_with_reply_above_start",
                    "bound_rss_hwm_plus_shm", "cuda_peak_above_start"):
            if key in res:
                res[key.replace("_above_start", "") + "_over_captured"] = res[key] / captured
        out[variant] = res
        print(f"  {variant}: " + ", ".join(f"{k}={v:.3f}" for k, v in res.items()
                                           if k.endswith("over_captured")), flush=True)
    return out


# -- main -----------------------------------------------------------------------------------
def machine() -> dict:
    import torch

    info = {"python": platform.python_version(), "torch": torch.__version__,
            "platform": platform.platform(), "cpus": os.cpu_count(),
            "loadavg_start": os.getloadavg()}
    try:
        with open("/proc/cpuinfo") as f:
            info["cpu"] = next(line.split(":", 1)[1].strip() for line in f if line.startswith("model name"))
        info["mem_total_gib"] = round(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30, 1)
    except Exception:
        pass
    for mod in ("vllm", "zmq"):
        try:
            info[mod] = __import__(mod).__version__
        except Exception:
            info[mod] = None
    if torch.cuda.is_available():
        info["gpu"] = torch.cuda.get_device_name(0)
        info["cuda"] = torch.version.cuda
    return info


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    ap.add_argument("--tokens", type=int, default=8192)
    ap.add_argument("--hidden", type=int, default=7168)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--step-tokens", type=int, default=2048, help="scheduler token budget per step")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--segment-mb", type=float, default=64)
    ap.add_argument("--transport", default="auto", choices=["auto", *TRANSPORTS])
    ap.add_argument("--threads", type=int, default=0, help="torch threads per process (0: torch default)")
    ap.add_argument("--read-threads", type=int, default=0,
                    help="materialize(threads=...) for shm segments (0: the module's default)")
    ap.add_argument("--per-request", action="store_true", help="also time the PerRequestStore path")
    ap.add_argument("--skip-p4", action="store_true")
    ap.add_argument("--skip-p5", action="store_true")
    ap.add_argument("--out", default=None, help="JSON path (default benchmarks/results/handoff_<device>.json)")
    args = ap.parse_args(argv)

    import torch

    requests = requests_for(args.tokens)
    cfg = {
        "device": args.device, "dtype": args.dtype, "hidden": args.hidden, "layers": args.layers,
        "steps": schedule(requests, args.step_tokens), "order": requests,
        "segment_bytes": int(args.segment_mb * 2**20), "transport": pick_transport(args.transport),
        "threads": args.threads or torch.get_num_threads(), "read_threads": args.read_threads or None,
    }
    itemsize = getattr(torch, args.dtype).itemsize
    captured = args.tokens * args.hidden * args.layers * itemsize
    print(f"{args.tokens} tokens x hidden {args.hidden} x {args.layers} layers, {args.dtype}: "
          f"{captured / 2**20:.0f} MiB captured; {len(requests)} requests in {len(cfg['steps'])} steps "
          f"(budget {args.step_tokens}); device {args.device}; transport {cfg['transport']}", flush=True)
    result: dict = {"machine": machine(), "config": {k: v for k, v in cfg.items() if k not in ("steps", "order")}
                    | {"tokens": args.tokens, "requests": len(requests), "steps": len(cfg["steps"]),
                       "captured_bytes": captured, "repeats": args.repeats}}
    if not args.skip_p4:
        variants = ["pickled", "handoff"] + (["per-request"] if args.per_request else [])
        print("P4 hand-off, seconds per repeat:", flush=True)
        p4 = run_p4(cfg, variants, args.repeats)
        result["p4"] = p4
        for name, r in p4["ratios"].items():
            print(f"P4 {name}: paired ratio min {r['min']:.2f} / median {r['median']:.2f} / max {r['max']:.2f}"
                  f" (ratio of medians {r['of_medians']:.2f}); identical: {p4['identical']}", flush=True)
        for v, s in p4["seconds"].items():
            w = p4["worker_side_seconds"][v]
            print(f"   {v:12s} min {s['min'] * 1000:.1f} / median {s['median'] * 1000:.1f} / "
                  f"max {s['max'] * 1000:.1f} ms (worker side median {w['median'] * 1000:.1f} ms)", flush=True)
    if not args.skip_p5:
        print("P5 capture memory (peak above start / captured bytes):", flush=True)
        result["p5"] = run_p5(cfg, captured, pickle_reply=args.device == "cpu")
    result["machine"]["loadavg_end"] = os.getloadavg()
    out = Path(args.out) if args.out else ROOT / "benchmarks" / "results" / f"handoff_{args.device}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=1) + "\n")
    print(f"wrote {out}")
    return 0 if all(result.get("p4", {}).get("identical", {"": True}).values()) else 1


if __name__ == "__main__":
    sys.exit(main())
