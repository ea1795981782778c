"""A plain speculators 0.3.0 extraction script - no spec-compat import.

    spec-compat run examples/extract.py --model DIR --out states.pt

spec-compat applies its registry before running this file as __main__.
"""

import argparse

import torch
from speculators.data_generation.vllm_hidden_states_generator import VllmHiddenStatesGenerator


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--layers", default="0,1,2,3")
    ap.add_argument("--lengths", default="5,300,1000")
    args = ap.parse_args()
    gen = VllmHiddenStatesGenerator(args.model, layer_ids=[int(x) for x in args.layers.split(",")],
                                    max_model_len=2048)
    g = torch.Generator().manual_seed(0)
    prompts = [torch.randint(1, 500, (int(n),), generator=g).tolist() for n in args.lengths.split(",")]
    results = gen.generate(prompts)
    torch.save(results, args.out)
    print(f"saved {len(results)} sequences to {args.out}")


if __name__ == "__main__":
    main()
