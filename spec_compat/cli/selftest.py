"""``spec-compat selftest``: stock speculators extraction checked against transformers.

In the current environment: build (or take) a fixture, run speculators'
``VllmHiddenStatesGenerator`` under the registry, and compare every captured
layer of every sequence with an independent transformers forward of the same
weights (fp32 pinned).  Workloads cover the silent failure classes: long prompts
over many KV blocks, more sequences than one scheduler step, shared prefixes and
exact repeats, 8 prompts of ~2000 tokens (a prompt split across steps while new
prompts join), and consecutive calls.
"""

from __future__ import annotations

import argparse
import logging
import math
import random
import sys
import time
import traceback
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from .checkpoints import TRUST_FLAG, TRUST_HELP

#: the commands this module defines (spec_compat.cli discovers them): name -> one-line help
COMMANDS = {
    'selftest': 'stock extraction in this environment vs a transformers reference',
}

log = logging.getLogger("spec_compat")

TOLERANCE = 1e-5


@dataclass
class Check:
    name: str
    ok: bool
    detail: str

    def line(self) -> str:
        return f"{'PASS' if self.ok else 'FAIL'} {self.name}: {self.detail}"


def workloads(vocab: int, seed: int = 0) -> dict[str, list[list[list[int]]]]:
    """name -> list of generate() calls, each a list of token-id sequences."""
    rng = random.Random(seed)

    def seq(n: int) -> list[int]:
        return [rng.randrange(1, vocab) for _ in range(n)]

    prefix_a, prefix_b = seq(64), seq(37)
    shared = []
    for i in range(40):
        base = prefix_a if i % 2 else prefix_b
        shared.append(base + seq(rng.randrange(1, 200)))
    shared += [list(shared[3]), list(shared[3]), list(shared[10])]  # exact repeats
    return {
        "short": [[seq(7)]],
        "many-blocks": [[seq(700)]],
        "batch-43-shared-prefixes": [shared],
        "chunked-8x2000": [[seq(rng.randrange(1950, 2040)) for _ in range(8)]],
        "consecutive-calls": [[seq(300), seq(33)], [seq(450), seq(1), seq(129)]],
    }


def compare(results: Sequence[dict], calls: Sequence[Sequence[int]], layer_ids: Sequence[int],
            reference: Callable[[Sequence[int]], list[Any]]) -> tuple[bool, float, str]:
    """(ok, max |diff|, detail) of one generate() result against the reference, every layer through
    :func:`spec_compat.verify.compare.compare_states` (equal dtype; a non-finite value on either side, an
    empty or mis-shaped layer fails).  On a failure max |diff| is ``inf`` and the detail names the
    first failing sequence and layer (and, for non-finite values, the side: engine / reference)."""
    from ..verify.compare import compare_states

    if len(results) != len(calls):
        return False, math.inf, f"{len(results)} results for {len(calls)} sequences"
    worst = 0.0
    for j, (res, ids) in enumerate(zip(results, calls)):
        if list(res["input_ids"].tolist()) != list(ids):
            return False, math.inf, f"sequence {j}: input_ids differ from the input"
        states = res["hidden_states"]
        if len(states) != len(layer_ids):
            return False, math.inf, f"sequence {j}: {len(states)} layers, expected {len(layer_ids)}"
        ref = reference(ids)
        for layer, got, want in zip(layer_ids, states, ref):
            c = compare_states(got, want, tolerance=TOLERANCE, sides=("engine", "reference"))
            if not c.ok:
                return False, math.inf, f"sequence {j} layer {layer}: {c.detail}"
            assert c.max_abs_diff is not None
            worst = max(worst, c.max_abs_diff)  # finite: compare_states refused every non-finite value
    return True, worst, f"max|diff|={worst:.2e} over {len(calls)} sequences"



def run_checks(model_dir: str, max_model_len: int = 2048, seed: int = 0,
               only: Sequence[str] | None = None, tensor_parallel_size: int = 1,
               trust_remote_code: bool = False) -> Iterator[Check]:
    """The checks on a checkpoint already checked by :func:`.checkpoints.checked_target` (whose
    answer is ``trust_remote_code``)."""
    import os

    import spec_compat  # noqa: F401  (registry applied before speculators is imported)

    from ..core.switches import NONFINITE_VAR, NONFINITE_WARN

    # the compare below checks both sides for NaN/inf and names the side (engine / reference):
    # generator-input-checks only warns about the engine's, unless the caller set the switch
    saved_nonfinite = os.environ.get(NONFINITE_VAR)
    os.environ.setdefault(NONFINITE_VAR, NONFINITE_WARN)
    try:
        yield from _run_checks(model_dir, max_model_len, seed, only, tensor_parallel_size, trust_remote_code)
    finally:
        if saved_nonfinite is None:
            os.environ.pop(NONFINITE_VAR, None)


def _run_checks(model_dir: str, max_model_len: int, seed: int, only: Sequence[str] | None,
                tensor_parallel_size: int, trust_remote_code: bool) -> Iterator[Check]:
    from speculators.data_generation.vllm_hidden_states_generator import VllmHiddenStatesGenerator
    from transformers import AutoConfig

    from ..verify.reference import load_reference_model, reference_states
    from ..verify.settings import pinned_dtype, preferring_non_mla

    cfg = AutoConfig.from_pretrained(model_dir, trust_remote_code=trust_remote_code)
    text_cfg = getattr(cfg, "text_config", cfg)
    with preferring_non_mla(text_cfg):
        n_layers = text_cfg.num_hidden_layers
        layer_ids = list(range(n_layers))
        t0 = time.perf_counter()
        with pinned_dtype("float32"):
            gen = VllmHiddenStatesGenerator(model_dir, layer_ids=layer_ids, max_model_len=max_model_len,
                                            tensor_parallel_size=tensor_parallel_size)
        yield Check("engine-start", True,
                    f"{time.perf_counter() - t0:.1f}s, layers {layer_ids}, tensor parallel {tensor_parallel_size}")
        sched = gen.vllm_config.scheduler_config
        yield Check("synchronous-loop", not getattr(sched, "async_scheduling", False),
                    f"async_scheduling={getattr(sched, 'async_scheduling', None)}")
        ref_model = load_reference_model(model_dir)

        def reference(ids: Sequence[int]) -> list[Any]:
            return reference_states(ref_model, ids, layer_ids)

        try:
            for name, calls in workloads(text_cfg.vocab_size, seed).items():
                if only and name not in only:
                    continue
                t = time.perf_counter()
                ok, worst, detail = True, 0.0, ""
                try:
                    tokens = 0
                    for batch in calls:
                        res = gen.generate(batch)
                        tokens += sum(len(s) for s in batch)
                        good, w, detail = compare(res, batch, layer_ids, reference)
                        ok, worst = ok and good, max(worst, w)
                        if not good:
                            break
                    detail = f"max|diff|={worst:.2e}, {tokens} tokens, {time.perf_counter() - t:.1f}s" if ok else detail
                except Exception as exc:  # a failing shim shows up as a failing check
                    ok, detail = False, f"{type(exc).__name__}: {exc}"
                    traceback.print_exc()
                yield Check(name, ok, detail)
        finally:
            del gen


def main(model: str | None, only: Sequence[str] | None = None, seed: int = 0,
         tensor_parallel_size: int = 1, trust_remote_code: bool = False) -> int:
    import tempfile

    from ..fixtures import FIXTURES, build
    from .checkpoints import CheckpointError, checked_target

    tmp = None
    if model is None or model in FIXTURES:
        tmp = tempfile.TemporaryDirectory(prefix="spec-compat-fixture-")
        model = str(build(model or "llama", tmp.name, seed=seed))
        trust_remote_code = True  # written by this command: its code is spec-compat's own
    else:
        try:
            trust_remote_code = checked_target(model, "model", trust_remote_code)[1]
        except CheckpointError as exc:
            print(f"spec-compat selftest: {exc}", file=sys.stderr)
            return 2
    failed = 0
    try:
        for check in run_checks(model, only=only, tensor_parallel_size=tensor_parallel_size,
                                trust_remote_code=trust_remote_code):
            print(check.line(), flush=True)
            failed += not check.ok
    except Exception as exc:
        traceback.print_exc()
        print(f"FAIL engine-start: {type(exc).__name__}: {exc}", flush=True)
        failed += 1
    print(f"selftest: {'FAILED' if failed else 'OK'} ({failed} failed)", flush=True)
    if tmp is not None:
        tmp.cleanup()
    return 1 if failed else 0


def add_arguments(command: str, p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", default=None,
                   help="checkpoint directory, or a fixture name (default: build the llama fixture); a fixture "
                        "built here (kimi-k25 ships remote code) is trusted: this command wrote it")
    p.add_argument(TRUST_FLAG, action="store_true", help=TRUST_HELP)
    p.add_argument("--checks", default="", help="comma list of workloads to run (default: all)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--tensor-parallel-size", "--tp", type=int, default=1,
                   help="tensor parallel size of the engine (on vLLM's CPU platform also set "
                        "VLLM_CPU_OMP_THREADS_BIND, e.g. '0|1' for 2 ranks on one NUMA node)")
    p.set_defaults(func=cmd_selftest)


def cmd_selftest(args: argparse.Namespace) -> int:
    only = [c for c in args.checks.split(",") if c] if args.checks else None
    return main(args.model, only=only, seed=args.seed, tensor_parallel_size=args.tensor_parallel_size,
                trust_remote_code=args.trust_remote_code)
