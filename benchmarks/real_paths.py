"""#44 item 3 on this CPU: stock speculators 0.9.0's server path on vLLM 0.16 (``prepare-data`` ->
``vllm serve`` with the ``extract_hidden_states`` backport -> ``generate-offline-data`` -> ``speculators
train``) on the real SmolLM2 and the first point's ShareGPT conversations, once with the backport's file
connector and once with hs-connectors 0.9.0's fp8 backend, trained with the same settings and seeds;
the file path twice (seeds 0 and 1: the noise the paths are compared against). Every draft is served
by vLLM 0.16 (``spec-compat evaluate``, greedy) on the same held-out prompts.

The conversations are the token ids and loss masks of a speculators 0.3.0 in-process run
(``real_recipe.py``'s ``data_*.pt``): the same data the first point (0.3.0 in-process) trained on.
The trainer runs on CPU with the flags it needs there (``--loss-implementation eager``,
``--draft-attn-impl sdpa``, ``--optimizer adamw``; tests/server/test_speculators_pipeline.py).

    python benchmarks/real_paths.py --target DIR --inprocess /tmp/real64/hidden_states \
        --prompts /tmp/real64/eval_prompts.jsonl --work /tmp/paths --out benchmarks/results/real_paths_cpu.json

Run with the server env's python (``spec0.9.0-vllm0.16.0``); ``--client`` is the client env's python.
Steps already done in ``--work`` are not repeated.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from extract_hidden_states_server import ROOT, Server, _server_env, extraction_args, hs_connectors_config  # noqa: E402
from real_paths_rows import SERVER_IDS as LAYER_IDS  # noqa: E402  (aux layers, then the last state)
CPU_FLAGS = ["--loss-implementation", "eager", "--draft-attn-impl", "sdpa", "--optimizer", "adamw",
             "--num-workers", "0", "--on-missing", "raise", "--log-freq", "1000"]


def _client(client: str, *args: str, timeout: int = 7200) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "SPEC_COMPAT_DISABLE"}
    env.update(HF_HUB_OFFLINE="1", COLUMNS="200",
               PYTHONPATH=os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH", "")) if p))
    proc = subprocess.run([client, "-m", "spec_compat", "run", str(Path(client).parent / "speculators"), *args],
                          capture_output=True, text=True, timeout=timeout, env=env, cwd=str(ROOT))
    if proc.returncode:
        raise SystemExit(f"speculators {args[0]} failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-5000:]}")
    return proc


def main(argv: list[str] | None = None) -> int:
    import torch

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--target", required=True)
    ap.add_argument("--inprocess", required=True, help="speculators 0.3.0 data_*.pt directory (real_recipe.py)")
    ap.add_argument("--samples", type=int, default=64)
    ap.add_argument("--prompts", required=True, help="held-out prompts (.jsonl) for spec-compat evaluate")
    ap.add_argument("--client", default=str(Path.home() / ".cache/spec-compat/envs/spec0.9.0-vllm0.16.0.client/bin/python"))
    ap.add_argument("--epochs", type=int, default=10)
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--draft-vocab", type=int, default=16384)
    ap.add_argument("--total-seq-len", type=int, default=2048)
    ap.add_argument("--k", default="3")
    ap.add_argument("--runs", default="file:0,file:1,fp8:0", help="backend:seed list")
    ap.add_argument("--work", required=True)
    ap.add_argument("--out", required=True)
    a = ap.parse_args(argv)
    target = str(Path(a.target).resolve())
    work = Path(a.work)
    work.mkdir(parents=True, exist_ok=True)
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "2")
    os.environ.setdefault("VLLM_HOST_IP", "127.0.0.1")
    state_file = work / "state.json"
    state: dict = json.loads(state_file.read_text()) if state_file.exists() else {"seconds": {}}

    def save() -> None:
        state_file.write_text(json.dumps(state, indent=1))

    raw = work / "rows.jsonl"
    longest = 0
    if not raw.exists():
        lines = []
        for i in range(a.samples):
            s = torch.load(Path(a.inprocess) / f"data_{i}.pt", weights_only=True)
            lines.append(json.dumps({"input_ids": [int(x) for x in s["input_ids"]],
                                     "loss_mask": [int(x) for x in s["loss_mask"]]}))
        raw.write_text("\n".join(lines) + "\n")
    rows = [json.loads(x) for x in raw.read_text().splitlines()]
    longest = max(len(r["input_ids"]) for r in rows)
    state.update(samples=len(rows), tokens=sum(len(r["input_ids"]) for r in rows),
                 trained_tokens=sum(sum(r["loss_mask"]) for r in rows))
    prepared = work / "prepared"
    if not (prepared / "token_freq.pt").exists():
        t0 = time.perf_counter()
        _client(a.client, "prepare-data", "--model", target, "--data", str(raw), "--output", str(prepared),
                "--seq-length", str(longest + 1), "--no-skip-token-freq")
        state["seconds"]["prepare"] = round(time.perf_counter() - t0, 1)
        save()
    runs = [(r.split(":")[0], int(r.split(":")[1])) for r in a.runs.split(",")]
    for backend in dict.fromkeys(b for b, _ in runs):
        data = work / f"data_{backend}"
        if (data / "done").exists():
            continue
        shutil.rmtree(data, ignore_errors=True)
        shutil.copytree(prepared, data)
        storage = work / f"storage_{backend}"
        kv = hs_connectors_config(backend, storage, None) if backend != "file" else None
        common = [target, "--dtype", "float32", "--max-model-len", str(longest + 64), "--block-size", "16",
                  "--enforce-eager"]
        server = Server(extraction_args(common, LAYER_IDS, storage, kv), work / f"server_{backend}.log",
                        env=_server_env(work, f"srv-{backend}", ROOT))
        t0 = time.perf_counter()
        try:
            server.wait_ready()
            _client(a.client, "generate-offline-data", "--endpoint", server.url + "/v1", "--model", target,
                    "--preprocessed-data", str(data), "--output", str(data / "hidden_states"), "--concurrency", "16",
                    "--validate-outputs", "--fail-on-error", "--max-retries", "0")
        finally:
            server.stop()
        state["seconds"][f"extract_{backend}"] = round(time.perf_counter() - t0, 1)
        (data / "done").touch()
        save()
    drafts = {}
    for backend, seed in runs:
        name = f"{backend}_s{seed}"
        ckpt = work / f"ckpt_{name}"
        if not (work / f"{name}.done").exists():
            shutil.rmtree(ckpt, ignore_errors=True)
            t0 = time.perf_counter()
            proc = _client(a.client, "train", "--verifier-name-or-path", target, "--data-path",
                           str(work / f"data_{backend}"), "--save-path", str(ckpt), "--log-dir", str(work / f"logs_{name}"),
                           "--target-layer-ids", *map(str, LAYER_IDS[:-1]), "--draft-vocab-size", str(a.draft_vocab),
                           "--total-seq-len", str(a.total_seq_len), "--epochs", str(a.epochs), "--lr", str(a.lr),
                           "--seed", str(seed), "--hidden-states-backend", backend, *CPU_FLAGS)
            state["seconds"][f"train_{name}"] = round(time.perf_counter() - t0, 1)
            (work / f"train_{name}.log").write_text(proc.stdout[-20000:] + proc.stderr[-20000:])
            (work / f"{name}.done").touch()
            save()
        drafts[name] = ckpt / str(max(int(p.name) for p in ckpt.iterdir() if p.is_dir() and p.name.isdigit()))
    for k in a.k.split(","):
        key = f"evaluate_k{k}"
        if key in state:
            continue
        cmd = [sys.executable, "-m", "spec_compat", "evaluate", "--target", target, "--prompts", a.prompts, "--k", k,
               "--max-tokens", "64", "--json"]
        for d in drafts.values():
            cmd += ["--draft", str(d)]
        t0 = time.perf_counter()
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=3600, cwd=str(ROOT))
        if proc.returncode:
            raise SystemExit(f"evaluate failed:\n{proc.stderr[-5000:]}")
        state[key] = {"seconds": round(time.perf_counter() - t0, 1),
                      "drafts": {n: r for n, r in zip(drafts, json.loads(proc.stdout.strip().splitlines()[-1])["drafts"])}}
        save()
    for k in a.k.split(","):
        for n, r in state[f"evaluate_k{k}"]["drafts"].items():
            print(f"k={k} {n}: mean acceptance length {r['mean_acceptance_length']:.3f} rate {r['acceptance_rate']:.3f}"
                  f" per position {[round(x, 3) for x in r['per_position']]} lossless {r['lossless']}")
    Path(a.out).write_text(json.dumps({**state, "settings": vars(a)}, indent=1, default=str) + "\n")
    for k in a.k.split(","):
        _plot(state[f"evaluate_k{k}"]["drafts"], Path(a.out).with_name(Path(a.out).stem + f"_k{k}.png"), k)
    return 0


def _plot(drafts: dict, png: Path, k: str) -> None:
    """Served acceptance per position, one line per draft."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4))
    for name, r in drafts.items():
        ax.plot(range(1, len(r["per_position"]) + 1), r["per_position"], marker="o",
                label=f"{name}: {r['mean_acceptance_length']:.3f}")
    ax.set(xlabel="draft position", ylabel="acceptance", title=f"speculators 0.9.0 server path, k = {k}",
           xticks=range(1, int(k) + 1))
    ax.legend(title="mean acceptance length")
    fig.tight_layout()
    fig.savefig(png, dpi=100)


if __name__ == "__main__":
    sys.exit(main())
