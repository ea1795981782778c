"""#44 item 3 on this machine: the stock speculators 0.3 recipe (in-process generator) on the real
SmolLM2-135M-Instruct and ShareGPT, under spec-compat on the cell's vLLM, ending with the draft served
by vLLM on held-out ShareGPT prompts (greedy, lossless; acceptance per position).

    python benchmarks/real_recipe.py --conversations 64 --out /tmp/real64 --json results/real_recipe_64.json

Steps (each timed): the smollm2 checkpoint (cached_checkpoint, as in tests/engine/test_real_model.py) -> the first
N conversations of ShareGPT's train split (first ``--turns`` turns) -> their assistant turns regenerated
by the target (vLLM, greedy, at most ``--max-new`` tokens each) -> speculators' preprocessing -> stock
``VllmHiddenStatesGenerator`` rows of speculators' default layers -> vocabulary mapping -> the EAGLE-3
draft trained by ``speculators.train.Trainer`` -> ``spec-compat evaluate`` on ``--eval-prompts``
held-out prompts for each ``--k``.  Run it in a 0.3 cell's environment (matrix/env).
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
import time
from pathlib import Path

log = logging.getLogger("real_recipe")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--conversations", type=int, default=64)
    ap.add_argument("--turns", type=int, default=2, help="first turns kept of each conversation (default 2)")
    ap.add_argument("--max-new", type=int, default=192, help="regenerated reply tokens (default 192)")
    ap.add_argument("--seq-len", type=int, default=768)
    ap.add_argument("--epochs", type=int, default=10)
    ap.add_argument("--lr", type=float, default=3e-4)
    ap.add_argument("--draft-vocab", type=int, default=16384)
    ap.add_argument("--eval-prompts", type=int, default=40)
    ap.add_argument("--eval-tokens", type=int, default=64)
    ap.add_argument("--k", default="3", help="comma-separated speculative token counts (default 3)")
    ap.add_argument("--no-regenerate", action="store_true")
    ap.add_argument("--out", required=True)
    ap.add_argument("--cache", default=None, help="converted checkpoints (default $SPEC_COMPAT_REAL_CACHE or "
                                                  "~/.cache/spec-compat/real)")
    ap.add_argument("--json", default=None, help="write the result here")
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="[real_recipe %(asctime)s] %(message)s", datefmt="%H:%M:%S")

    import spec_compat  # noqa: F401  (before speculators)
    from spec_compat.cli.demo_steps import MetricCollector, extract, preprocess, train, vocab_mapping

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=False)
    timings: dict[str, float] = {}
    result: dict = {"args": vars(args), "timings": timings}

    def step(name, fn):
        log.info("%s ...", name)
        t0 = time.perf_counter()
        value = fn()
        timings[name] = round(time.perf_counter() - t0, 1)
        log.info("%s: %.1f s", name, timings[name])
        return value

    from spec_compat.fixtures.sharegpt import recipe_chats
    from spec_compat.fixtures.smollm2 import cached_checkpoint

    model = step("checkpoint", lambda: cached_checkpoint(args.cache))
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(model)
    tr, ev, result["sharegpt"] = step("sharegpt", lambda: recipe_chats(args.conversations, args.turns, args.eval_prompts,
                                                                tok, args.seq_len - args.max_new - 16))
    src = out / "train_chats.jsonl"
    src.write_text("".join(json.dumps(c) + "\n" for c in tr))
    prompts = out / "eval_prompts.jsonl"
    prompts.write_text("".join(json.dumps(c) + "\n" for c in ev))
    if not args.no_regenerate:
        from spec_compat.cli.regenerate import regenerate_chats

        regen = out / "regenerated.jsonl"
        result["regenerated"] = step("regenerate", lambda: regenerate_chats(
            model, src, regen, max_tokens=args.max_new, max_model_len=args.seq_len))
        src = regen
    dataset = step("preprocess", lambda: preprocess(model, src, out, args.seq_len))
    samples, tokens = step("extract", lambda: extract(model, dataset, out / "hidden_states", None, args.seq_len,
                                                       16, src))
    result.update(samples=samples, tokens=tokens)
    d2t, t2d = step("vocab", lambda: vocab_mapping(model, out, args.draft_vocab))
    collector = MetricCollector()
    step("train", lambda: train(model, out / "hidden_states", d2t, t2d, out / "draft", args.epochs, args.seq_len,
                                args.lr, collector))
    result["loss"] = {"train_first": collector.train[:3], "train_last": collector.train[-3:], "val": collector.val}
    last = max((d for d in (out / "draft").iterdir() if d.name.isdigit()), key=lambda d: int(d.name))
    from spec_compat.cli.evaluate import evaluate

    result["evaluate"] = {}
    for k in [int(x) for x in args.k.split(",")]:
        res = step(f"evaluate k={k}", lambda: evaluate(model, last, prompts=str(prompts), k=k,
                                                       max_tokens=args.eval_tokens, max_model_len=args.seq_len))
        result["evaluate"][k] = res.as_dict()
        log.info("k=%d: %s", k, {key: res.as_dict().get(key) for key in ("mean_acceptance_length", "acceptance_rate",
                                                                        "per_position", "lossless")})
    text = json.dumps(result, indent=1, default=str)
    if args.json:
        Path(args.json).write_text(text + "\n")
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
