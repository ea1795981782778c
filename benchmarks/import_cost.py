"""P1 (issue #7): the cost of ``import spec_compat``.

Interleaved runs of ``python -c "import spec_compat"`` and ``python -c pass`` with the same
interpreter (wall time of the whole process, ``time.perf_counter`` around
``subprocess.run``), min / median / max of each and the added milliseconds; then checks
in one process that none of vllm / torch / transformers / speculators is in sys.modules
after ``import spec_compat``.  Writes benchmarks/results/import_cost.json.

  python benchmarks/import_cost.py [--runs 30] [--python PATH]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
HEAVY = ("vllm", "torch", "transformers", "speculators")
CHECK = (
    "import sys, json, spec_compat; "
    f"print(json.dumps({{m: m in sys.modules for m in {HEAVY!r}}}))"
)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--runs", type=int, default=30)
    ap.add_argument("--python", default=sys.executable)
    ap.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "import_cost.json"))
    args = ap.parse_args(argv)

    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH")) if p)
    env.pop("SPEC_COMPAT_LOG", None)

    def once(code: str) -> float:
        t0 = time.perf_counter()
        subprocess.run([args.python, "-c", code], env=env, check=True, cwd=ROOT)
        return (time.perf_counter() - t0) * 1000

    once("import spec_compat")  # warm the file cache and __pycache__
    once("pass")
    times: dict[str, list[float]] = {"pass": [], "import spec_compat": []}
    for i in range(args.runs):
        pair = ("pass", "import spec_compat") if i % 2 == 0 else ("import spec_compat", "pass")
        for code in pair:
            times[code].append(once(code))
    added = [a - b for a, b in zip(times["import spec_compat"], times["pass"])]
    proc = subprocess.run([args.python, "-c", CHECK], env=env, check=True, cwd=ROOT,
                          capture_output=True, text=True)
    imported = json.loads(proc.stdout.strip().splitlines()[-1])

    def stats(xs: list[float]) -> dict:
        return {"min": round(min(xs), 2), "median": round(statistics.median(xs), 2),
                "max": round(max(xs), 2)}

    version = subprocess.run([args.python, "-c", "import sys; print(sys.version.split()[0])"],
                             capture_output=True, text=True, check=True).stdout.strip()
    result = {
        "python": args.python, "python_version": version, "platform": platform.platform(),
        "cpus": os.cpu_count(), "loadavg": os.getloadavg(), "runs": args.runs,
        "ms": {k: stats(v) for k, v in times.items()},
        "added_ms": {**stats(added),
                     "of_medians": round(statistics.median(times["import spec_compat"])
                                         - statistics.median(times["pass"]), 2),
                     "of_mins": round(min(times["import spec_compat"]) - min(times["pass"]), 2)},
        "heavy_modules_imported": imported,
        "all": times,
    }
    for code in ("pass", "import spec_compat"):
        s = result["ms"][code]
        print(f"{code:20s} min {s['min']:7.1f} / median {s['median']:7.1f} / max {s['max']:7.1f} ms")
    a = result["added_ms"]
    print(f"added (paired)       min {a['min']:7.1f} / median {a['median']:7.1f} / max {a['max']:7.1f} ms;"
          f" of medians {a['of_medians']:.1f} ms, of mins {a['of_mins']:.1f} ms")
    print("heavy modules in sys.modules after import spec_compat:", imported)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=1) + "\n")
    print(f"wrote {args.out}")
    return 0 if not any(imported.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
