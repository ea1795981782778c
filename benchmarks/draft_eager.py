"""What ``draft-eager-without-cuda`` buys on CPU: one epoch of the stock speculators 0.3.0
trainer on the demo's extracted data, with the patch on (the draft's forward runs eagerly off
CUDA) and with only it switched off (speculators 0.3.0's unconditional ``torch.compile``: inductor
compiles each new packed shape on CPU).  Rounds alternate the order of the two variants; each
variant is a fresh process (``python tests/support/training_steps.py train``), timed whole.  Losses of the
first steps are printed side by side: the two paths train the same model.

  python benchmarks/draft_eager.py --demo-json DEMO.json [--rounds 2] [--out benchmarks/results/draft_eager_cpu.json]

DEMO.json: the last line ``spec-compat demo --json`` printed (model_dir, data_dir, draft_dir); the
vocabulary mapping is read from the demo's ``vocab_mapping`` folder next to ``data_dir``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TRAINING_STEPS = ROOT / "tests" / "support" / "training_steps.py"
PID = "draft-eager-without-cuda"


def one_epoch(demo: dict, disable: str, save: Path) -> tuple[float, list[float]]:
    env = {k: v for k, v in os.environ.items() if k != "SPEC_COMPAT_DISABLE"}
    if disable:
        env["SPEC_COMPAT_DISABLE"] = disable
    args = {"model_dir": demo["model_dir"], "data_dir": demo["data_dir"], "vocab_dir": demo["vocab_dir"],
            "save": str(save), "epochs": 1}
    t = time.perf_counter()
    proc = subprocess.run([sys.executable, str(TRAINING_STEPS), "train", json.dumps(args)], env=env,
                          capture_output=True, text=True, cwd=str(ROOT))
    seconds = time.perf_counter() - t
    if proc.returncode != 0:
        raise SystemExit(f"training with SPEC_COMPAT_DISABLE={disable!r} failed:\n{proc.stderr[-3000:]}")
    line = next(ln for ln in reversed(proc.stdout.splitlines()) if ln.startswith("SPEC_COMPAT_RESULT "))
    return seconds, json.loads(line.split(" ", 1)[1])["losses"]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--demo-json", required=True, type=Path)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--out", type=Path, default=ROOT / "benchmarks/results/draft_eager_cpu.json")
    a = ap.parse_args()
    demo = json.loads(a.demo_json.read_text())
    demo.setdefault("vocab_dir", str(Path(demo["data_dir"]).parent / "vocab_mapping"))
    times: dict[str, list[float]] = {"eager (patch on)": [], "compiled (patch off)": []}
    losses: dict[str, list[float]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(a.rounds):
            order = [("eager (patch on)", ""), ("compiled (patch off)", PID)]
            for name, disable in (order if r % 2 == 0 else order[::-1]):
                seconds, ls = one_epoch(demo, disable, Path(tmp) / f"{r}-{bool(disable)}")
                times[name].append(round(seconds, 2))
                losses.setdefault(name, ls)
                print(f"round {r}: {name}: {seconds:.1f} s, {len(ls)} steps", flush=True)
    on, off = (statistics.median(times[k]) for k in times)
    result = {
        "benchmark": "draft_eager", "patch": PID, "machine": platform.processor() or platform.machine(),
        "cpus": os.cpu_count(), "rounds": a.rounds, "seconds_per_epoch": times,
        "median_seconds": {"eager (patch on)": on, "compiled (patch off)": off},
        "ratio_compiled_over_eager": round(off / on, 2),
        "first_losses": {k: [round(x, 4) for x in v[:5]] for k, v in losses.items()},
    }
    a.out.write_text(json.dumps(result, indent=1) + "\n")
    print(f"one epoch: eager {on:.1f} s, compiled {off:.1f} s: compiled / eager = {off / on:.2f} -> {a.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
