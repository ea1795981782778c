"""Aux-layer id conventions with a trained draft (#34): what reading a head's ids in the wrong
convention costs, side by side in one run.

One draft is trained (speculators' demo training, every fix on) on hidden states of the target's
layers; its ids are in vLLM's *input* convention.  The same weights are written again as an SGLang /
TorchSpec head, whose ``eagle_config`` names the same layers as *outputs* (each id one less).  Served
by vLLM 0.16 through spec-compat, greedy, k = 3, every run checked lossless:

* the speculators head, read as its framework intends (input convention);
* the SGLang head, read as its framework intends (spec-compat's default for ``eagle_config`` ids:
  output convention);
* the SGLang head read in the other convention (``SPEC_COMPAT_AUX_IDS=input``: the layers stock vLLM
  would serve if it read those ids): each layer one earlier;
* the speculators head read in the other convention (``SPEC_COMPAT_AUX_IDS=output``): one later.

usage (inside a matrix cell with speculators 0.3.x and vLLM 0.16):
    python benchmarks/head_conventions.py OUT_DIR [--model kimi-k25|llama] [--layers 8] [--epochs 16]
        [--lr 3e-3] [--max-tokens 64] [--json]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent / "tests" / "support"))
from serving_o6_o7 import prepare_data, train_variant  # noqa: E402
from sglang_head import as_sglang_head  # noqa: E402

#: (row name, which head, SPEC_COMPAT_AUX_IDS)
VARIANTS = (
    ("speculators head, input convention (its own)", "speculators", "auto"),
    ("SGLang head, output convention (its own)", "sglang", "auto"),
    ("SGLang head misread as input convention", "sglang", "input"),
    ("speculators head misread as output convention", "speculators", "output"),
)


def served(head: Path, override: str) -> list[int] | None:
    from spec_compat.shims.draft_heads import served_ids

    ids, _, _ = served_ids(json.loads((head / "config.json").read_text()), override)
    return list(ids) if ids is not None else None


def evaluate_under(convention: str, heads: list[Path], model: Path, max_tokens: int = 64) -> list[dict]:
    """``evaluate_drafts`` with SPEC_COMPAT_AUX_IDS set (read when vLLM builds each SpeculativeConfig);
    a head spec-compat refuses (an id outside the target) becomes a row with the refusal."""
    from spec_compat.cli.compare_drafts import evaluate_drafts, spec_compat_refusal

    os.environ["SPEC_COMPAT_AUX_IDS"] = convention
    try:
        return [r.as_dict() for r in evaluate_drafts(str(model), [str(h) for h in heads], k=3, max_tokens=max_tokens,
                                                        max_model_len=1024)]
    except Exception as exc:  # noqa: BLE001 -- a refusal is a result here
        why = spec_compat_refusal(exc)
        if why is None:
            raise
        return [{"refused": why} for _ in heads]
    finally:
        os.environ.pop("SPEC_COMPAT_AUX_IDS", None)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("out")
    ap.add_argument("--model", default="kimi-k25", choices=["kimi-k25", "llama"])
    ap.add_argument("--layers", type=int, default=8, help="llama only")
    ap.add_argument("--epochs", type=int, default=16)
    ap.add_argument("--lr", type=float, default=3e-3)
    ap.add_argument("--max-tokens", type=int, default=64, help="new tokens per held-out prompt")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()

    import spec_compat  # noqa: F401
    from spec_compat import installed_versions

    out = Path(args.out).resolve()
    if out.exists() and any(out.iterdir()):
        raise SystemExit(f"{out} is not empty")
    if args.model != "llama":
        args.layers = 4
    model, captured = prepare_data(out, args.model, args.layers)
    t = time.perf_counter()
    draft, tr = train_variant(model, out, out / "draft", args.epochs, args.lr)
    train_s = round(time.perf_counter() - t, 1)
    heads = {"speculators": draft, "sglang": out / "sglang-head"}
    sglang_ids = as_sglang_head(draft, heads["sglang"])
    print(f"trained in {train_s}s; speculators ids "
          f"{json.loads((draft / 'config.json').read_text())['eagle_aux_hidden_state_layer_ids']}, "
          f"SGLang ids {sglang_ids}", file=sys.stderr)

    rows = []
    for convention in ("auto", "input", "output"):
        group = [(name, which) for name, which, conv in VARIANTS if conv == convention]
        results = evaluate_under(convention, [heads[w] for _, w in group], model, args.max_tokens)
        for (name, which), res in zip(group, results):
            rows.append({"variant": name, "head": which, "convention": convention,
                         "served_layer_inputs": served(heads[which], convention), **res})
            print(f"{name}: {res.get('mean_acceptance_length', res.get('refused'))}", file=sys.stderr)

    result = {"versions": {k: v for k, v in installed_versions().items() if v}, "model": args.model,
              "layers": args.layers,
              "captured_layer_ids": captured.get("layer_ids") or captured.get("hidden_states", {}).get("layer_ids"),
              "epochs": args.epochs,
              "lr": args.lr, "max_tokens": args.max_tokens, "train_s": train_s,
              "final_loss": sum(tr["losses"][-3:]) / 3, "rows": rows}
    (out / "head_conventions.json").write_text(json.dumps(result, indent=2))
    if args.json:
        print(json.dumps(result))
        return 0
    print(f"{args.model} fixture, {args.layers} layers, {args.epochs} epochs, lr {args.lr}, k=3, "
          f"16 held-out prompts x {args.max_tokens} tokens")
    print("| head, read as | layer inputs served | acceptance rate | mean acceptance length | per position "
          "| lossless |")
    print("|---|---|---|---|---|---|")
    for r in rows:
        if "refused" in r:
            print(f"| {r['variant']} | {r['served_layer_inputs']} | refused: {r['refused']} | | | |")
            continue
        pos = " / ".join(f"{p:.3f}" for p in r["per_position"])
        print(f"| {r['variant']} | {r['served_layer_inputs']} | {r['acceptance_rate']:.3f} | "
              f"{r['mean_acceptance_length']:.3f} | {pos} | {r['lossless']} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
