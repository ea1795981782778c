"""#45 item 2: ``spec-compat doctor`` against the ground truth of #44's defect table: each draft of
``real_defects.py`` (trained on the GPU with one defect left in) with a sample of its own training data
(``ret/sample_V.tar``, the first samples of its data directory).  The doctor must name the planted
defect in the check that owns it and raise no problem on the clean draft.

    python benchmarks/doctor_defects.py --target DIR --drafts DIR --samples DIR --out results/doctor_defects.json

``--drafts`` holds ``defect_V/`` (joined by ``real_gpu_curve.py join --prefix defect_``), ``--samples`` the
unpacked ``data_V/`` directories.  A variant trained on the clean data (``o7``, ``vocab``: their rows and
tokens are the clean data's) is checked with ``data_clean``'s sample.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

#: the check that must name each planted defect, and a phrase of its cause
EXPECTED = {
    "clean": (None, None),
    "o6": ("rows", "one layer off (O6"),
    "f8": ("rows", "(F8)"),
    "g1": ("tokens", "(G1"),
    "bos2": ("tokens", "two BOS"),
    "vocab": ("vocabulary", "built from other data"),
    "o7": ("targets", "(O7"),
}
SAME_DATA_AS_CLEAN = {"o7", "vocab"}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--target", required=True)
    ap.add_argument("--drafts", required=True)
    ap.add_argument("--samples", required=True)
    ap.add_argument("--clean-draft", help="the clean draft's directory when it is not DRAFTS/defect_clean")
    ap.add_argument("--out", required=True)
    args = ap.parse_args(argv)

    from spec_compat.doctor import Inputs, as_json, run_checks

    model = None
    out: dict = {"variants": {}}
    shown = ("fit", "rows", "tokens", "vocabulary", "targets")
    table = ["| planted defect | " + " | ".join(shown) + " | named? | seconds |", "|---" * (len(shown) + 3) + "|"]
    for v, (check, phrase) in EXPECTED.items():
        draft = Path(args.clean_draft) if v == "clean" and args.clean_draft else Path(args.drafts) / f"defect_{v}"
        data = Path(args.samples) / f"data_{'clean' if v in SAME_DATA_AS_CLEAN else v}"
        if not draft.is_dir() or not data.is_dir():
            print(f"{v}: skipped ({draft} or {data} missing)", file=sys.stderr)
            continue
        inp = Inputs(Path(args.target), draft, data)
        if model is not None:
            inp._cache["model"] = model
        t0 = time.perf_counter()
        found = {c["check"]: c for c in as_json(run_checks(inp))["checks"]}
        model = inp._cache.get("model", model)
        problems = [c for c, f in found.items() if f["status"] == "problem"]
        if check is None:
            verdict = "no problem (right)" if not problems else f"FALSE problem in {problems}"
        else:
            hit = found.get(check, {})
            named = hit.get("status") == "problem" and phrase in hit.get("summary", "")
            verdict = "named" if named else "NOT named"
            extra = [c for c in problems if c != check]
            if extra:
                verdict += f" (also {extra})"
        out["variants"][v] = {"expected_check": check, "verdict": verdict, "findings": found,
                              "seconds": round(time.perf_counter() - t0, 1)}
        cells = " | ".join(found.get(c, {}).get("status", "-") for c in shown)
        table.append(f"| {v} | {cells} | {verdict} | {out['variants'][v]['seconds']} |")
        print(table[-1], flush=True)
    Path(args.out).write_text(json.dumps(out, indent=1, default=str) + "\n")
    print("\n".join(table))
    return 0


if __name__ == "__main__":
    sys.exit(main())
