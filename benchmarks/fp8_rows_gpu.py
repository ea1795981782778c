#!/usr/bin/env python3
"""hs-connectors' fp8 backend through the backport's row path at Kimi-K2.5 width, on a GPU (issue #35, item 1).

Each step stands for one extraction step of rank 0 (as in ``writer_overlap.py``): a forward of
``--tflop`` TFLOP of bf16 matmuls, then the prompt's rows [T, L, H] bf16 gathered on the device (a
copy), then one of four modes, interleaved in rounds (the order rotates):

* ``none``       - no file: the ceiling;
* ``bf16``       - the backport's plain connector: :func:`host_rows` (pinned copy on the stream, an
  event) and :meth:`BackgroundWriter.submit` (safetensors write on the writer thread);
* ``fp8-host``   - hs-connectors 0.9.0's ``FP8HiddenStatesConnector._write_tensors`` as the backport
  calls it (:func:`write_through`): bf16 rows cross PCIe, the writer thread quantizes them on the host
  (upstream's order);
* ``fp8-device`` - the rows quantized on the device before the pinned copy by spec-compat's
  :func:`quantize_rows` (hs-connectors' format and bytes): fp8 rows + fp32 scales cross PCIe, the
  writer only saves.

Reported per mode: tokens/s (median over rounds, and its ratio to ``none`` and between the fp8 orders),
bytes over PCIe per step (the nbytes of the tensors copied device -> host: computed, not sniffed), the
writer thread's CPU time per file (``time.thread_time`` around each write), file bytes. Before the
rounds, one prompt is written through both fp8 orders and the two files' bytes compared: equal
SHA-256 or the benchmark fails. For the record it also writes the prompt with hs-connectors' own
``quantize_tensor_to_fp8`` run on the device, and says where that file differs from the host's.

hs-connectors' fp8 module subclasses vLLM's ``ExampleHiddenStatesConnector``; where vLLM is not
installed (the device machine) a bare stand-in class is put at that module path only so the module
imports - ``_write_tensors`` is a static method that uses nothing of its base.

usage: python benchmarks/fp8_rows_gpu.py [--tokens 4096] [--layers 4] [--hidden 7168] [--tflop 33]
       [--steps 6] [--rounds 5] [--dir /tmp/hs-fp8] [--json OUT]
"""

from __future__ import annotations

import argparse
import hashlib
import json
import shutil
import statistics
import sys
import time
import types
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import spec_compat  # noqa: E402,F401  (where vLLM is installed, the registry provides the connector module)
from spec_compat.shims.hidden_states.files import hidden_states_tensors  # noqa: E402
from spec_compat.patches.hidden_states.ehs_config.fp8_rows import quantize_rows  # noqa: E402
from spec_compat.shims.hidden_states.upstream_writer import save_and_release  # noqa: E402
from spec_compat.shims.hidden_states.writer import BackgroundWriter, host_rows  # noqa: E402

MODES = ("none", "bf16", "fp8-host", "fp8-device")
CHECKS = MODES[1:] + ("hs-quantize-on-device",)  # the last: written once, never timed
EHS_MODULE = "vllm.distributed.kv_transfer.kv_connector.v1.example_hidden_states_connector"


def fp8_connector() -> Any:
    """hs-connectors' ``FP8HiddenStatesConnector`` (a stand-in base where vLLM is absent)."""
    try:
        import vllm  # noqa: F401
    except ImportError:
        names = EHS_MODULE.split(".")
        for i in range(1, len(names) + 1):
            sys.modules.setdefault(".".join(names[:i]), types.ModuleType(".".join(names[:i])))
        sys.modules[EHS_MODULE].ExampleHiddenStatesConnector = type("ExampleHiddenStatesConnector", (), {})
        for i in range(1, len(names)):
            setattr(sys.modules[".".join(names[:i])], names[i], sys.modules[".".join(names[: i + 1])])
    from hs_connectors.fp8_hidden_states_connector import FP8HiddenStatesConnector

    return FP8HiddenStatesConnector


def fp8_difference(host_file: Path, device_file: Path, rows: Any) -> dict[str, Any]:
    """Where two fp8 files of the same rows differ: per tensor, the elements whose bytes differ; for
    the fp8 payload, the fp32 values before the cast (computed on the host) at the first few of them."""
    import torch
    from safetensors.torch import load_file

    a, b = load_file(str(host_file)), load_file(str(device_file))
    out: dict[str, Any] = {"keys": sorted(a) if sorted(a) == sorted(b) else [sorted(a), sorted(b)]}
    for key in sorted(set(a) & set(b)):
        x, y = a[key], b[key]
        if x.dtype != y.dtype or x.shape != y.shape:
            out[key] = {"host": [str(x.dtype), list(x.shape)], "device": [str(y.dtype), list(y.shape)]}
            continue
        bx, by = x.contiguous().view(torch.uint8), y.contiguous().view(torch.uint8)
        diff = (bx != by).reshape(-1)
        out[key] = {"bytes_differing": int(diff.sum()), "of": int(diff.numel())}
        if key == "hidden_states" and diff.any():
            scale = a["hidden_states_scales"]
            exact = (rows.detach().cpu().float() / scale).reshape(-1)
            idx = diff.nonzero().flatten()[:6]
            out[key]["examples"] = [{"pre_cast": float(exact[i]), "host": float(x.reshape(-1)[i].float()),
                                     "device": float(y.reshape(-1)[i].float())} for i in idx.tolist()]
    return out


class TimedWriter(BackgroundWriter):
    """The backport's writer, with the writer thread's CPU seconds summed over its writes."""

    def __init__(self) -> None:
        super().__init__()
        self.cpu_s = 0.0

    def _write(self, *args: Any, **kwargs: Any) -> None:
        t0 = time.thread_time()
        try:
            super()._write(*args, **kwargs)
        finally:
            self.cpu_s += time.thread_time() - t0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tokens", type=int, default=4096)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--hidden", type=int, default=7168)
    ap.add_argument("--tflop", type=float, default=33.0, help="forward work per step (TFLOP)")
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--dir", default="/tmp/hs-fp8")
    ap.add_argument("--json")
    args = ap.parse_args()

    import torch
    from hs_connectors.fp8_utils import SCALES_KEY, quantize_tensor_to_fp8

    fp8_write = fp8_connector()._write_tensors
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    sync = torch.cuda.synchronize if dev == "cuda" else (lambda: None)
    T, L, H = args.tokens, args.layers, args.hidden
    x = torch.randn(T, H, device=dev, dtype=torch.bfloat16)
    w = torch.randn(H, H, device=dev, dtype=torch.bfloat16) / H ** 0.5
    per_mm = 2 * T * H * H / 1e12
    n_mm = max(1, round(args.tflop / per_mm))
    cache = torch.randn(T, L, H, device=dev, dtype=torch.bfloat16) * 3  # the rows of one prompt
    ids = list(range(T))
    storage = Path(args.dir)
    shutil.rmtree(storage, ignore_errors=True)
    storage.mkdir(parents=True)
    writer = TimedWriter()
    counter = [0]
    pcie: dict[str, int] = {}

    def forward() -> None:
        h = x
        for _ in range(n_mm):
            h = h @ w
        h.sum().item()  # the sampler's sync at the end of a step

    def emit(mode: str, rows: Any, path: str) -> None:
        if mode in ("fp8-device", "hs-quantize-on-device"):
            q, scales = (quantize_rows if mode == "fp8-device" else quantize_tensor_to_fp8)(rows)
            host_q, _ = host_rows(q)
            host_s, ready = host_rows(scales)  # same stream: its event follows both copies
            tensors = {**hidden_states_tensors(host_q, ids), SCALES_KEY: host_s}
            pcie[mode] = q.nbytes + scales.nbytes
            writer.submit(path, tensors, ready=ready, write=save_and_release)
            return
        host, ready = host_rows(rows)
        pcie[mode] = rows.nbytes
        writer.submit(path, hidden_states_tensors(host, ids), ready=ready,
                      write=fp8_write if mode == "fp8-host" else save_and_release)

    def step(mode: str) -> None:
        forward()
        rows = cache.clone()  # the connector's gather: a copy on the cache's device
        if mode != "none":
            counter[0] += 1
            emit(mode, rows, str(storage / f"r{counter[0]}.safetensors"))

    # the two fp8 orders write the same bytes
    digests, sizes = {}, {}
    for mode in CHECKS:
        p = storage / f"check-{mode}.safetensors"
        emit(mode, cache.clone(), str(p))
        writer.drain()
        digests[mode], sizes[mode] = hashlib.sha256(p.read_bytes()).hexdigest(), p.stat().st_size
    host_file = storage / "check-fp8-host.safetensors"
    hs_on_device = fp8_difference(host_file, storage / "check-hs-quantize-on-device.safetensors", cache)
    if digests["fp8-host"] != digests["fp8-device"]:
        raise SystemExit("spec-compat's device quantization does not write hs-connectors' bytes: "
                         f"{fp8_difference(host_file, storage / 'check-fp8-device.safetensors', cache)}")
    q_ms = []
    for _ in range(5):
        sync(); t0 = time.perf_counter(); quantize_rows(cache); sync()
        q_ms.append((time.perf_counter() - t0) * 1e3)
    for _ in range(2):
        forward()
    sync(); t0 = time.perf_counter(); forward(); fwd_ms = (time.perf_counter() - t0) * 1e3
    name = torch.cuda.get_device_name() if dev == "cuda" else "cpu"
    print(f"device {dev} ({name}), T={T} L={L} H={H}; forward {n_mm * per_mm:.1f} TFLOP {fwd_ms:.1f} ms; "
          f"device quantize {statistics.median(q_ms):.2f} ms; file bytes {sizes}; fp8 orders byte-identical "
          f"(sha256 {digests['fp8-host'][:16]}); hs-connectors' quantize_tensor_to_fp8 on the device: {hs_on_device}",
          flush=True)

    per_round: list[dict[str, float]] = []
    cpu_ms: dict[str, list[float]] = {m: [] for m in MODES[1:]}
    for rnd in range(args.rounds):
        order = list(MODES[rnd % 4:] + MODES[:rnd % 4])
        rates: dict[str, float] = {}
        for mode in order:
            writer.drain()
            cpu0 = writer.cpu_s
            sync()
            t0 = time.perf_counter()
            for _ in range(args.steps):
                step(mode)
            writer.drain()  # the round counts until every file is in place
            rates[mode] = args.steps * T / (time.perf_counter() - t0)
            if mode != "none":
                cpu_ms[mode].append((writer.cpu_s - cpu0) / args.steps * 1e3)
            for f in storage.glob("r*.safetensors"):
                f.unlink()
        per_round.append(rates)
        print(f"round {rnd + 1}: " + ", ".join(f"{m} {rates[m]:.0f} tok/s" for m in MODES), flush=True)
    writer.close()

    def med(a: str, b: str) -> float:
        return round(statistics.median(r[a] / r[b] for r in per_round), 3)

    summary = {
        "device": name, "tokens": T, "layers": L, "hidden": H, "tflop": round(n_mm * per_mm, 1),
        "forward_ms": round(fwd_ms, 1), "device_quantize_ms": round(statistics.median(q_ms), 2),
        "steps": args.steps, "rounds": args.rounds, "fp8_orders_byte_identical": True,
        "hs_connectors_quantize_on_device_vs_host": hs_on_device, "sha256": digests,
        "file_bytes": sizes, "pcie_bytes_per_step": pcie,
        "tokens_per_s": {m: round(statistics.median(r[m] for r in per_round)) for m in MODES},
        "writer_cpu_ms_per_file": {m: round(statistics.median(v), 1) for m, v in cpu_ms.items()},
        "ratios": {f"{m}/none": med(m, "none") for m in MODES[1:]}
        | {"fp8-device/fp8-host": med("fp8-device", "fp8-host"), "fp8-host/bf16": med("fp8-host", "bf16"),
           "fp8-device/bf16": med("fp8-device", "bf16")},
        "per_round": per_round,
    }
    print("RESULT_JSON " + json.dumps({k: v for k, v in summary.items() if k != "per_round"}), flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps(summary, indent=1) + "\n")
    shutil.rmtree(storage, ignore_errors=True)


if __name__ == "__main__":
    main()
