"""#44 item 4: the silent defects of the stock pipeline, each left in alone, on the real model's 4,096
conversations of the learning curve (``real_gpu_curve.py``), trained by speculators 0.9.0 with the same
settings and seed as the clean draft, served here by vLLM 0.16.

Each variant changes what the defect changes and nothing else (docs/failures.md has each symptom):

* ``o6``   rows are the *outputs* of layers 2, 15, 27 (what speculators 0.3/0.4 capture), while vLLM feeds
           the served draft their *inputs* (the draft's config names no layers);
* ``o7``   targets from the last layer *without* the final norm (speculators < 0.4's trainer): the
           0.9.0 trainer runs with its ``verifier_norm`` skipped (``o7-train``);
* ``bos2`` training rows and tokens of the rendered template tokenized with a second BOS; served with one;
* ``vocab`` the draft vocabulary (``token_freq.pt``) counted on other data: Python source, not the replies;
* ``f8``   prefix caching on with a block hasher, speculators 0.3.0's generator at its default batch of 8:
           the cached full blocks of each prompt are not computed (no rows), and the generator slices the
           shorter capture by the full lengths in input order (rows shift into the next sequence, the last
           ones come up short; ids and mask cut to the rows, samples under 2 rows dropped);
* ``g1``   speculators 0.4.0.1's generator with ``--batch-size 32``: results come in text-sorted request-id
           order (``req_c_0, req_c_1, req_c_10, ...``) and the stock script pairs loss masks by position.

F9 and F10 need a generator call larger than one scheduler step (8,192 tokens); ``plan`` counts the
calls that exceed it at the stock batch size (8) on this data.
"""

from __future__ import annotations

import json
import logging
import os
import runpy
import sys
from collections import OrderedDict
from pathlib import Path

log = logging.getLogger("real_defects")
VARIANTS = ("clean", "o6", "o7", "bos2", "vocab", "f8", "g1")
BLOCK = 16  # speculators' VLLM_BLOCK_SIZE
STEP_BUDGET = 8192  # speculators 0.3's max_num_batched_tokens floor
# the CPU engine's KV cache the stock script would run with (VLLM_CPU_KVCACHE_SPACE=4 GiB): SmolLM2 holds
# 30 layers x K and V x 3 heads x 64 x fp32 = 46,080 bytes per token
CACHE_BLOCKS = (4 << 30) // (BLOCK * 46080)


def f8_skips(samples: list[list[int]], batch: int = 8, cache_blocks: int = CACHE_BLOCKS) -> list[int]:
    """Per sample, how many leading tokens vLLM's prefix cache serves (no forward, so no rows): whole
    blocks whose chain of tokens an earlier request (this call's included: blocks are cached when they
    are allocated) already holds; never the last token.  LRU over ``cache_blocks``."""
    cache: OrderedDict = OrderedDict()
    skips = []
    for s in samples:
        h, hit = None, 0
        for b in range((len(s) - 1) // BLOCK):
            h = hash((h, tuple(s[b * BLOCK:(b + 1) * BLOCK])))
            if h not in cache:
                break
            cache.move_to_end(h)
            hit += 1
        skips.append(hit * BLOCK)
        h = None
        for b in range(len(s) // BLOCK):
            h = hash((h, tuple(s[b * BLOCK:(b + 1) * BLOCK])))
            cache[h] = None
            cache.move_to_end(h)
        while len(cache) > cache_blocks:
            cache.popitem(last=False)
    return skips


def f8_layout(lengths: list[int], skips: list[int], batch: int = 8) -> list[list[tuple[int, int, int]]]:
    """For each sample, the pieces ``(source sample, first row, end row)`` its saved rows are made of: the
    capture of a call is each request's uncached rows in input order, sliced by the full lengths."""
    out: list[list[tuple[int, int, int]]] = []
    for c in range(0, len(lengths), batch):
        idx = range(c, min(c + batch, len(lengths)))
        pieces = [(i, skips[i], lengths[i]) for i in idx]  # the capture, in order
        pos = 0
        for i in idx:
            want, got, start = lengths[i], [], pos
            for src, a, b in pieces:
                n = b - a
                if start >= n:
                    start -= n
                    continue
                take = min(n - start, want - sum(e - f for _, f, e in got))
                got.append((src, a + start, a + start + take))
                start = 0
                if sum(e - f for _, f, e in got) == want:
                    break
            out.append(got)
            pos += want
    return out


def g1_order(n: int, batch: int = 32) -> list[int]:
    """Sample j's tokens and rows come from ``order[j]`` (0.4.0.1: ``sorted`` request ids per call)."""
    order: list[int] = []
    for c in range(0, n, batch):
        size = min(batch, n - c)
        ids = sorted(f"req_{c // batch}_{i}" for i in range(size))
        order += [c + int(r.rsplit("_", 1)[1]) for r in ids]
    return order


def plan(samples: list[list[int]]) -> dict:
    """What each engine defect touches on this data (no rows needed)."""
    lengths = [len(s) for s in samples]
    skips = f8_skips(samples)
    calls8 = [sum(lengths[c:c + 8]) for c in range(0, len(lengths), 8)]
    lay = f8_layout(lengths, skips)
    own = sum(1 for i, p in enumerate(lay) if p and p[0][0] == i and p[0][1] == 0 and len(p) == 1
              and p[0][2] == lengths[i])
    order = g1_order(len(samples))
    return {"f8": {"samples_with_cached_prefix": sum(1 for s in skips if s), "rows_not_computed": sum(skips),
                   "rows": sum(lengths), "samples_with_own_rows": own, "samples": len(samples)},
            "g1": {"samples_not_their_own": sum(1 for j, i in enumerate(order) if i != j)},
            "f9_f10": {"stock_batch": 8, "step_budget": STEP_BUDGET, "largest_call_tokens": max(calls8),
                       "calls_over_budget": sum(1 for t in calls8 if t > STEP_BUDGET)}}


def other_counts(tok, vocab: int) -> dict[int, int]:
    """Token counts of other data: the Python source of the installed ``transformers`` models (~4 MB)."""
    import torch
    import transformers

    root = Path(transformers.__file__).parent / "models"
    text, size = [], 0
    for f in sorted(root.rglob("modeling_*.py")):
        t = f.read_text(errors="replace")
        text.append(t)
        size += len(t)
        if size > 4 << 20:
            break
    ids = torch.tensor(tok("\n".join(text), add_special_tokens=False)["input_ids"])
    counts = torch.bincount(ids, minlength=vocab)
    nz = counts.nonzero().flatten()
    return dict(zip(nz.tolist(), counts[nz].tolist()))


def build(name: str, root: Path, samples, masks, dirs: dict[str, Path], tok, vocab: int) -> tuple[Path, dict]:
    """The 0.9.0 data directory of variant ``name`` under ``root``; returns it and what changed."""
    import torch
    from datasets import Dataset
    from safetensors.torch import load_file, save_file

    d = root / f"data_{name}"
    hs = d / "hidden_states"
    hs.mkdir(parents=True, exist_ok=True)
    info: dict = {}
    src = dirs["bos2"] if name == "bos2" else dirs["o6"] if name == "o6" else dirs["base"]
    ids_out, mask_out = [], []
    if name == "bos2":
        samples = [[tok.bos_token_id] + s for s in samples]
        masks = [[0] + m for m in masks]
    if name == "f8":
        lay = f8_layout([len(s) for s in samples], f8_skips(samples))
        cache: dict[int, torch.Tensor] = {}
        dropped = 0
        for i, pieces in enumerate(lay):
            n = sum(e - a for _, a, e in pieces)
            if n < 2:
                dropped += 1
                continue
            parts = []
            for s, a, e in pieces:
                if s not in cache:
                    cache = {k: v for k, v in cache.items() if k >= s - 8}
                    cache[s] = load_file(str(src / f"hs_{s}.safetensors"))["hidden_states"]
                parts.append(cache[s][a:e])
            j = len(ids_out)
            ids_out.append(samples[i][:n])
            mask_out.append(masks[i][:n])
            save_file({"hidden_states": torch.cat(parts).contiguous(), "token_ids": torch.tensor(ids_out[-1])},
                      str(hs / f"hs_{j}.safetensors"))
        info = {"dropped_under_2_rows": dropped}
    elif name == "g1":
        order = g1_order(len(samples))
        for j, i in enumerate(order):
            n = len(samples[i])
            ids_out.append(samples[i])
            mask_out.append((masks[j][:n] + [0] * n)[:n])  # the stock script's mask of j, cut (or padded) to n
            os.symlink(src / f"hs_{i}.safetensors", hs / f"hs_{j}.safetensors")
        info = {"moved": sum(1 for j, i in enumerate(order) if i != j)}
    else:
        ids_out, mask_out = samples, masks
        for j in range(len(samples)):
            os.symlink(src / f"hs_{j}.safetensors", hs / f"hs_{j}.safetensors")
    ds = Dataset.from_dict({"input_ids": ids_out, "loss_mask": mask_out, "seq_len": [len(s) for s in ids_out]})
    ds.set_format(type="torch")
    ds.save_to_disk(str(d))
    if name == "vocab":
        freq = other_counts(tok, vocab)
    else:
        flat = torch.cat([torch.tensor(s)[torch.tensor(m).bool()] for s, m in zip(ids_out, mask_out)])
        counts = torch.bincount(flat, minlength=vocab)
        nz = counts.nonzero().flatten()
        freq = dict(zip(nz.tolist(), counts[nz].tolist()))
    torch.save(freq, d / "token_freq.pt")
    info.update(samples=len(ids_out), tokens=sum(map(len, ids_out)), reply_tokens=sum(map(sum, mask_out)))
    return d, info


def export_sample(d: Path, tar: Path, n: int = 6) -> None:
    """The first ``n`` samples of data directory ``d`` (dataset, rows, ``token_freq.pt``) as a tar, for
    ``spec-compat doctor --data`` here (it reads a sample)."""
    import shutil
    import tarfile

    from datasets import load_from_disk

    tmp = tar.with_suffix(".dir") / d.name
    shutil.rmtree(tmp.parent, ignore_errors=True)
    load_from_disk(str(d)).select(range(n)).save_to_disk(str(tmp))
    (tmp / "hidden_states").mkdir()
    for i in range(n):
        shutil.copyfile(d / "hidden_states" / f"hs_{i}.safetensors", tmp / "hidden_states" / f"hs_{i}.safetensors")
    shutil.copyfile(d / "token_freq.pt", tmp / "token_freq.pt")
    tar.parent.mkdir(parents=True, exist_ok=True)
    with tarfile.open(tar, "w") as t:
        t.add(tmp, arcname=d.name)
    shutil.rmtree(tmp.parent)


def o7_train(argv: list[str]) -> int:
    """``real_defects.py o7-train SCRIPT ARGS...``: speculators' CLI under spec-compat with the trainer's
    targets taken without the final norm (speculators < 0.4's ``Eagle3DraftModel.forward``)."""
    import spec_compat
    from speculators.models.eagle3 import core

    spec_compat.apply()
    init = core.Eagle3DraftModel.__init__

    def without_norm(self, *a, **k):
        init(self, *a, **k)
        norm = self.verifier_norm  # the targets see the last layer as it is, in the norm's output dtype
        norm.forward = lambda x: x.to(norm.weight.dtype)

    core.Eagle3DraftModel.__init__ = without_norm
    sys.argv = argv
    runpy.run_path(argv[0], run_name="__main__")
    return 0


def run(args) -> int:
    """On the GPU: the learning curve's data (``real_gpu_curve.prepare``, with the layers' outputs too), the
    two-BOS rows, each variant's data directory, then every variant's training at once (one process each;
    the draft is small), packed into ``--work``/ret; ``--out``/defects.json records them."""
    import shutil
    import time
    from concurrent.futures import ThreadPoolExecutor

    import torch

    import real_gpu_curve as rgc

    args.points = str(args.chats)
    result, state, ckpt, tok, model, sm, hs_all = rgc.prepare(args, outputs_too=True)
    work, out = Path(args.work), Path(args.out)
    samples, masks = sm["samples"][:args.chats], sm["masks"][:args.chats]
    dirs = {"base": hs_all, "o6": work / "hidden_states_outputs", "bos2": work / "hidden_states_bos2"}
    variants = [v for v in args.variants.split(",") if v]
    if "bos2" in variants and not (work / "bos2.done").exists():
        t0 = time.perf_counter()
        rgc.rows(model, [[tok.bos_token_id] + s for s in samples], dirs["bos2"], args.device)
        result["timings"]["rows_bos2"] = round(time.perf_counter() - t0, 1)
        (work / "bos2.done").touch()
    res = result.setdefault("defects", {})
    res["plan"] = plan(samples)
    embed = model.get_input_embeddings().weight.detach().cpu()
    vocab = model.config.vocab_size
    del model
    torch.cuda.empty_cache()
    no_train = set(args.no_train.split(",")) if args.no_train else set()
    todo = [v for v in variants if v not in res]
    built = {}
    for v in todo:
        pw = work / f"defect_{v}"
        shutil.rmtree(pw, ignore_errors=True)
        t0 = time.perf_counter()
        d, info = build(v, pw, samples, masks, dirs, tok, vocab)
        info["build_seconds"] = round(time.perf_counter() - t0, 1)
        built[v] = (pw, d, info)
        export_sample(d, work / "ret" / f"sample_{v}.tar", args.export_samples)
        log.info("%s: %s", v, info)
    o7 = f"{sys.executable} {Path(__file__).resolve()} o7-train {args.launcher.split()[-1]}"
    for v in [v for v in todo if v in no_train]:
        res[v] = {**built[v][2], "trained": False}
    todo = [v for v in todo if v not in no_train]
    with ThreadPoolExecutor(max(1, len(todo))) as ex:
        futs = {v: ex.submit(rgc.train, ckpt, built[v][1], built[v][0], args, args.seed, o7 if v == "o7" else None)
                for v in todo}
        for v, f in futs.items():
            try:
                info = {**built[v][2], **f.result(), "seed": args.seed}
                info.update(rgc.pack(built[v][0], embed, work / "ret", f"defect_{v}"))
            except Exception as e:  # noqa: BLE001 - recorded; the other variants go on
                info = {**built[v][2], "failed": str(e)[-3000:]}
            res[v] = info
            state.write_text(json.dumps(result))
            log.info("%s trained: %s", v, {k: info.get(k) for k in ("seconds", "failed")})
    result["device"] = torch.cuda.get_device_name(0) if args.device == "cuda" else args.device
    out.mkdir(parents=True, exist_ok=True)
    (out / "defects.json").write_text(json.dumps(result, indent=1))
    return 0


def collect(args) -> int:
    """Here: the device's ``defects.json``, the ``spec-compat evaluate --json`` of the defect drafts and the
    clean draft's (the learning curve's ``draft4096``, same data, settings and seed) into one JSON and a
    markdown table; the acceptance rate's ratio to the clean draft's says what each defect costs."""
    dev = json.loads(Path(args.defects).read_text())
    rows: dict[str, dict] = {}  # "label k=K" -> one draft's evaluate row
    for path in args.eval:
        for r in json.loads(Path(path).read_text())["drafts"]:
            name = Path(r["draft"]).name
            label = {"draft4096": "clean (learning curve)", "draft4096e20": "clean, 20 epochs"}.get(
                name, name.removeprefix("defect_"))
            rows[f"{label} k={r['k']}"] = r
    table = ["| variant | what is left in | conversations | k | mean acceptance length | acceptance rate | rate / clean |"
             " per position | lossless |", "|---|---|---|---|---|---|---|---|---|"]
    what = {v: line.split(None, 2)[2].strip() for v, line in
            ((ln.split()[1].strip("`"), ln) for ln in __doc__.splitlines() if ln.startswith("* ``"))}
    for key, r in rows.items():
        name = key.rsplit(" k=", 1)[0]
        clean = rows.get(f"clean (learning curve) k={r['k']}")
        info = dev["defects"].get(name, {})
        ratio = r["acceptance_rate"] / clean["acceptance_rate"] if clean and clean["acceptance_rate"] else float("nan")
        table.append(f"| {name} | {what.get(name, 'nothing (clean)')[:90]} | {info.get('samples', 4096):,} | {r['k']} | "
                     f"{r['mean_acceptance_length']:.3f} | {r['acceptance_rate']:.3f} | {ratio:.2f} | "
                     f"{' / '.join(f'{x:.3f}' for x in r['per_position'])} | {'yes' if r['lossless'] else 'NO'} |")
    out = {"device": dev.get("device"), "plan": dev["defects"].get("plan"), "trained": {
        k: {kk: vv for kk, vv in v.items() if kk not in ("parts", "log_tail")} for k, v in dev["defects"].items()
        if k != "plan"}, "evaluate": rows, "notes": args.note}
    Path(args.out).write_text(json.dumps(out, indent=1) + "\n")
    print("\n".join(table))
    return 0


def main(argv: list[str] | None = None) -> int:
    import argparse

    import real_gpu_curve as rgc

    if (argv or sys.argv[1:])[:1] == ["o7-train"]:
        return o7_train((argv or sys.argv[1:])[1:])
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("plan", help="here: what each engine defect touches in a samples.json")
    p.add_argument("samples")
    r = sub.add_parser("run", help="on the GPU")
    rgc.add_run_arguments(r)
    r.add_argument("--chats", type=int, default=4096)
    r.add_argument("--variants", default=",".join(VARIANTS))
    r.add_argument("--seed", type=int, default=0)
    r.add_argument("--no-train", default="", help="variants only built and exported (e.g. clean: its draft exists)")
    r.add_argument("--export-samples", type=int, default=4, help="samples per variant in ret/sample_V.tar")
    c = sub.add_parser("collect", help="here: the table of item 4")
    c.add_argument("--defects", required=True, help="the device's defects.json")
    c.add_argument("--eval", action="append", default=[], help="spec-compat evaluate --json output (repeat)")
    c.add_argument("--note", default="")
    c.add_argument("--out", required=True)
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="[real_defects %(asctime)s] %(message)s", datefmt="%H:%M:%S")
    if args.cmd == "plan":
        print(json.dumps(plan(json.loads(Path(args.samples).read_text())["samples"]), indent=1))
        return 0
    return collect(args) if args.cmd == "collect" else run(args)


if __name__ == "__main__":
    sys.exit(main())
