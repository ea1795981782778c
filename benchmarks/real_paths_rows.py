"""#44 item 3, the data side: the rows each extraction path gives for the same real conversations, against
the transformers forward the learning curve's drafts were trained from (``real_gpu_curve.py``).

Paths, on the same token ids (the first N samples of a speculators 0.3.0 in-process run of
``real_recipe.py``, ``data_*.pt``):

* ``inprocess-0.3``: those samples' own rows (speculators 0.3.0's generator in vLLM 0.16, layer *outputs*
  of the ids it was given; read from the directory);
* ``server-file``: ``vllm serve`` (vLLM 0.16 + spec-compat's ``extract_hidden_states`` backport), the
  backport's file connector, as speculators 0.9.0's ``generate-offline-data`` drives it (one completion of
  ``max_tokens=1`` per sample; the client's pairing by request is proven in tests/server);
* ``server-fp8``: the same server with hs-connectors 0.9.0's fp8 backend (its own ``kv_transfer_config``),
  rows dequantized as its reader does.

For each path and slot: rows per sample against tokens, worst cosine, and the largest absolute difference
over the largest reference value; NaN/inf fail the run. Where a path's rows equal the forward, a draft
trained from them is trained on the learning curve's data. Run in the server env
(``spec0.9.0-vllm0.16.0``), one engine at a time:

    python benchmarks/real_paths_rows.py --target DIR --inprocess /tmp/real64/hidden_states --samples 16 \
        --out benchmarks/results/real_paths_rows.json
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from extract_hidden_states_server import (  # noqa: E402
    ROOT, Server, _one, _server_env, extraction_args, hs_connectors_config)

#: speculators' default aux layers on a 30-layer target, then the last state (the backport's ids)
SERVER_IDS = [2, 15, 27, 30]


def _stats(rows, ref) -> dict:
    import torch

    if not bool(torch.isfinite(rows).all()):
        raise SystemExit("non-finite rows")
    if rows.shape != ref.shape:
        return {"shape": list(rows.shape), "reference_shape": list(ref.shape), "equal_shape": False}
    cos = torch.nn.functional.cosine_similarity(rows.float(), ref.float(), dim=-1)
    return {"equal_shape": True, "min_cosine": float(cos.min()),
            "max_abs_diff_over_max_ref": float((rows.float() - ref.float()).abs().max() / ref.abs().max())}


def _worst(per_sample: list[list[dict]]) -> list[dict]:
    """Per slot, the worst sample."""
    out = []
    for slot in range(len(per_sample[0])):
        s = [p[slot] for p in per_sample]
        ok = all(x["equal_shape"] for x in s)
        out.append({"rows_equal_tokens": ok,
                    "min_cosine": min(x.get("min_cosine", math.nan) for x in s) if ok else None,
                    "max_abs_diff_over_max_ref": max(x.get("max_abs_diff_over_max_ref", math.nan) for x in s)
                    if ok else None})
    return out


def main(argv: list[str] | None = None) -> int:
    import torch
    from safetensors.torch import load_file

    from spec_compat.verify.reference import layer_states, load_reference_model

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--target", required=True)
    ap.add_argument("--inprocess", required=True, help="a speculators 0.3.0 data_*.pt directory (real_recipe.py)")
    ap.add_argument("--samples", type=int, default=16)
    ap.add_argument("--out", required=True)
    a = ap.parse_args(argv)
    target = str(Path(a.target).resolve())
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "2")
    os.environ.setdefault("VLLM_HOST_IP", "127.0.0.1")
    inproc = Path(a.inprocess)
    cfg = json.loads((inproc / "data_config.json").read_text()) if (inproc / "data_config.json").is_file() else {}
    in_ids = list(cfg.get("hidden_states", {}).get("layer_ids") or [2, 15, 27, 29])
    samples = [torch.load(inproc / f"data_{i}.pt", weights_only=True) for i in range(a.samples)]
    ids = [[int(x) for x in s["input_ids"]] for s in samples]
    longest = max(len(x) for x in ids)
    print(f"{len(ids)} samples, {sum(map(len, ids))} tokens (longest {longest}); in-process layers {in_ids}",
          flush=True)

    model = load_reference_model(target)
    n = int(model.config.num_hidden_layers)
    ref_in, ref_srv = [], []
    for x in ids:
        ref_in.append(torch.stack(layer_states(model, x, [(i, "output") for i in in_ids]), 1))
        taps = [(i, "input") if i < n else (n - 1, "output") for i in SERVER_IDS]
        ref_srv.append(torch.stack(layer_states(model, x, taps), 1))
    del model

    result: dict = {"target": target, "samples": len(ids), "tokens": sum(map(len, ids)), "paths": {}}
    per = []
    for s, r in zip(samples, ref_in):
        hs = s["hidden_states"]
        rows = torch.stack(list(hs), 1) if isinstance(hs, (list, tuple)) else hs
        per.append([_stats(rows[:, j], r[:, j]) for j in range(r.shape[1])])
    result["paths"]["inprocess-0.3"] = {"layers": [f"output:{i}" for i in in_ids], "dtype": str(rows.dtype),
                                        "slots": _worst(per)}

    work = Path(tempfile.mkdtemp(prefix="real-paths-"))
    os.chdir(work)
    common = [target, "--dtype", "float32", "--max-model-len", str(longest + 64), "--block-size", "16",
              "--max-num-batched-tokens", "2048", "--enforce-eager"]
    for name, backend in (("server-file", None), ("server-fp8", "fp8")):
        where = work / name
        kv = hs_connectors_config(backend, where, None) if backend else None
        server = Server(extraction_args(common, SERVER_IDS, where, kv), work / f"{name}.log",
                        env=_server_env(work, name, ROOT))
        t0 = time.perf_counter()
        try:
            server.wait_ready()
            start = time.perf_counter() - t0
            per, t1 = [], time.perf_counter()
            for x, r in zip(ids, ref_srv):
                ans = _one(server.url, target, x)
                t = load_file(ans["kv_transfer_params"]["hidden_states_path"])
                rows = t["hidden_states"]
                if "hidden_states_scales" in t:
                    rows = rows.float() * t["hidden_states_scales"].float()
                assert [int(v) for v in t.get("token_ids", torch.tensor(x)).tolist()] == x, "rows of other tokens"
                per.append([_stats(rows[:, j], r[:, j]) for j in range(r.shape[1])])
            result["paths"][name] = {"layers": [f"input:{i}" if i < n else f"output:{n - 1}" for i in SERVER_IDS],
                                     "stored_dtype": str(t["hidden_states"].dtype), "slots": _worst(per),
                                     "server_start_s": round(start, 1),
                                     "requests_s": round(time.perf_counter() - t1, 1)}
        finally:
            server.stop()
        print(name, json.dumps(result["paths"][name]), flush=True)
    print("inprocess-0.3", json.dumps(result["paths"]["inprocess-0.3"]), flush=True)
    Path(a.out).write_text(json.dumps(result, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
