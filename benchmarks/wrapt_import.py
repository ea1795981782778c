"""What importing wrapt would add to ``import spec_compat`` (the reason the post-import hooks
are our own finder and wrapt is imported only when a patch installs a wrapper).

Interleaved fresh interpreters: ``import spec_compat`` alone, then ``import spec_compat`` plus
``import wrapt``; prints the medians and their ratio.  usage: python benchmarks/wrapt_import.py [ROUNDS]
"""

from __future__ import annotations

import json
import statistics
import subprocess
import sys

PROBE = ("import time; t = time.perf_counter(); import spec_compat; a = time.perf_counter() - t; "
         "t = time.perf_counter(); {extra}; b = time.perf_counter() - t; "
         "import sys; print(a, b, 'asyncio' in sys.modules)")


def once(extra: str) -> tuple[float, float, bool]:
    out = subprocess.run([sys.executable, "-c", PROBE.format(extra=extra)], capture_output=True, text=True,
                         check=True).stdout.split()
    return float(out[0]), float(out[1]), out[2] == "True"


def main() -> None:
    rounds = int(sys.argv[1]) if len(sys.argv) > 1 else 15
    alone, wrapt_added, asyncio = [], [], False
    for _ in range(rounds):
        a, _b, _ = once("pass")
        alone.append(a)
        a2, b2, asyncio = once("import wrapt")
        wrapt_added.append(b2)
    import wrapt

    res = {"rounds": rounds, "wrapt": wrapt.__version__,
           "import_spec_compat_ms": round(statistics.median(alone) * 1e3, 1),
           "import_wrapt_after_ms": round(statistics.median(wrapt_added) * 1e3, 1),
           "wrapt_imports_asyncio": asyncio}
    res["ratio_wrapt_to_spec_compat"] = round(res["import_wrapt_after_ms"] / res["import_spec_compat_ms"], 2)
    print(json.dumps(res))


if __name__ == "__main__":
    main()
