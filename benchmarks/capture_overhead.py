"""P2 / P3: throughput of hidden-state extraction against plain vLLM prefill of the same tokens.

Variants (each runs in its own process with its own engine; the parent alternates them so that
drift of this noisy machine hits every variant alike):

* ``plain``    - ``vllm.LLM(..., enforce_eager=True)``, ``generate(prompt_token_ids, max_tokens=1)``
                 with the generator's engine settings (block 16, 32 sequences, 8192 batched tokens,
                 prefix caching off): prefill of the same token ids, nothing captured.
* ``capture``  - speculators' ``VllmHiddenStatesGenerator.generate`` under spec-compat (the python
                 of the cell given by ``--python``; speculators 0.3.0 in the default cell).
* ``capture-sleep`` - ``capture`` with ``SPEC_COMPAT_DRIVER_WAIT=sleep`` (opt-in patch
                 driver-wait-yields-cpu: the driver sleeps while its worker computes): ``--sleep``.
* ``capture-copied`` - ``capture`` with the hand-off's driver side copying every layer into fresh
                 tensors (``materialize(..., map_pages=False)``, the shipped path before layers were
                 returned as views of the mapped segment): ``--copied``.
* ``capture-pool`` - ``capture`` with ``SPEC_COMPAT_SHM_POOL_MB=1024`` (segments recycled: the worker
                 writes pages it has written before): ``--pool``.
* ``capture-threads-kept`` - ``capture`` with ``SPEC_COMPAT_DRIVER_THREADS=keep`` (patch
                 driver-torch-threads off: the driver copies with torch's default thread count): ``--threads-kept``.
* ``capture-no-pool`` - ``capture`` with ``SPEC_COMPAT_SHM_POOL_MB=0`` (the hand-off's segments are
                 unlinked after each call, the worker writes fresh pages every call): ``--no-pool``.
* ``capture-exact-check`` - ``capture`` with the NaN/inf check of ``generator-input-checks`` taking
                 ``isfinite(h).all()`` of every layer (its form before the one-sum fast path): ``--exact-check``.
* ``plain-inproc`` - ``plain`` with ``VLLM_ENABLE_V1_MULTIPROCESSING=0`` (``--plain-inproc``): vLLM's
                 engine core in the calling process, which then schedules, steps and handles the outputs
                 one after another, as speculators' driver does; its executor's steps are timed.
* ``capture-predict`` - experiment (``--predict``): the driver sleeping once per step instead of polling.
* ``native04`` - the same call in a speculators 0.4.0.1 cell (``--python-04``): its own generator,
                 with only the patches that cell needs (P3).

usage:
    python benchmarks/capture_overhead.py [--model llama|kimi-k25|wide] [--seqs 64] [--len 512]
        [--repeats 3] [--rounds 2 | --interleave CYCLES] [--sleep] [--copied] [--threads-kept] [--pool] [--no-pool] [--exact-check]
        [--calls-per-turn K] [--plain-inproc] [--python PY] [--python-04 PY]
        [--json OUT]

``--rounds``: each variant's engine is started ``rounds`` times (alternating order) and timed for
``repeats`` calls.  With ``--interleave CYCLES`` every round starts one engine per variant and
keeps each frozen (SIGSTOP) while another runs; the variants take turns one call at a time, the
order rotating each cycle, and the ratios are also given per cycle (median and quartiles of the
cycle-by-cycle ratios) and per round: drift of the machine hits neighbouring calls alike, and the
rounds sample the speed an engine instance keeps for its whole life.

Interleaved runs of the ``capture`` variants and ``plain-inproc`` also print each call's model steps (the
executor's ``execute_model`` / ``sample_tokens`` as the calling process waits for them) and what is
left of the call outside them (request set-up, scheduling, the hand-off, speculators' clone loop).

Prints tokens/s per variant (min / median / max over every timed repeat) and the ratios
capture/plain (P2, goal >= 0.95) and capture/native04 (P3, goal >= 1.0).  Engine start-up
and one warm-up call are excluded from the timings.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
ENGINE = dict(block_size=16, max_num_seqs=32, max_num_batched_tokens=8192)

#: hidden 7168 (Kimi-K2.5's width), 2 layers; a small MLP keeps the CPU run short, which makes
#: capture a larger share of the step than on the real model (the harder case for P2)
WIDE = dict(vocab_size=512, hidden_size=7168, intermediate_size=2048, num_hidden_layers=2,
            num_attention_heads=56, num_key_value_heads=8, head_dim=128, max_position_embeddings=4096,
            rms_norm_eps=1e-5, rope_theta=10000.0, tie_word_embeddings=False)


def build_model(name: str, out: Path) -> Path:
    if name != "wide":
        from spec_compat.fixtures import build

        return build(name, out)
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    from spec_compat.fixtures.llama import SPECIALS, LLAMA_CHAT_TEMPLATE
    from spec_compat.fixtures.tokenizer import byte_level_tokenizer

    out.mkdir(parents=True, exist_ok=True)
    tok = byte_level_tokenizer(SPECIALS, LLAMA_CHAT_TEMPLATE, bos="<|begin_of_text|>", eos="<|eot_id|>", out_dir=out)
    torch.manual_seed(0)
    cfg = LlamaConfig(**WIDE, bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id,
                      pad_token_id=tok.eos_token_id, torch_dtype="bfloat16")
    model = LlamaForCausalLM(cfg).to(torch.bfloat16)
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0.0, 0.02)
    model.save_pretrained(out, safe_serialization=True)
    return out


def token_ids(seqs: int, length: int, vocab: int, seed: int = 0) -> list[list[int]]:
    import random

    rng = random.Random(seed)
    # a shared 64-token prefix on every other sequence (prefix caching is off in both variants)
    prefix = [rng.randrange(4, vocab) for _ in range(64)]
    out = []
    for i in range(seqs):
        body = [rng.randrange(4, vocab) for _ in range(length)]
        out.append((prefix + body)[:length] if i % 2 else body)
    return out


# ---------------------------------------------------------------- child process


def predict_wait(executor) -> None:
    """Experiment (variant ``capture-predict``): while the driver waits for ``execute_model``,
    sleep once for 80 % of the previous steps' duration (moving average), then poll as vLLM does,
    so the driver leaves the worker's cores alone for most of a step with a single wake-up."""
    from spec_compat.patches.extraction.driver_wait_yields_cpu import reply_queues

    state = {"expect": 0.0, "avg": 0.0}

    class PredictingTimer:
        def __init__(self) -> None:
            self.fresh = True

        def record_activity(self) -> None:
            self.fresh = True

        def spin(self) -> None:
            if self.fresh and state["expect"] > 0:
                time.sleep(state["expect"])
                state["expect"] = 0.0  # once per step, however many reads the step takes
            self.fresh = False
            os.sched_yield()

    queues = reply_queues(executor)
    assert queues, "no reply queue to time"
    for mq in queues:
        mq._read_spin_timer = PredictingTimer()
    inner = executor.execute_model

    def execute_model(*args, **kwargs):
        state["expect"] = 0.8 * state["avg"]
        t = time.perf_counter()
        try:
            return inner(*args, **kwargs)
        finally:
            state["expect"] = 0.0
            d = time.perf_counter() - t
            state["avg"] = d if not state["avg"] else 0.5 * (state["avg"] + d)

    executor.execute_model = execute_model


#: seconds of the engine's model steps in the current call, as the calling process sees them
#: (``execute_model`` / ``sample_tokens`` of the executor; empty where the engine core is in another process)
STEP_SECONDS: collections.defaultdict[str, float] = collections.defaultdict(float)


def time_steps(executor, names: tuple[str, ...]) -> None:
    """Add the wall time of ``executor``'s ``names`` methods to :data:`STEP_SECONDS`."""
    from driver_phases import timed  # this directory: the phase timer of driver_phases.py

    for name in names:
        if getattr(executor, name, None) is not None:
            setattr(executor, name, timed(STEP_SECONDS, name, getattr(executor, name)))


def child(variant: str, model: str, ids_file: str, repeats: int, max_model_len: int) -> None:
    ids = json.loads(Path(ids_file).read_text())
    tokens = sum(len(s) for s in ids)
    if variant in ("plain", "plain-inproc"):
        from vllm import LLM, SamplingParams

        llm = LLM(model=model, enforce_eager=True, max_model_len=max_model_len, enable_prefix_caching=False,
                  dtype="auto", trust_remote_code=True, **ENGINE)
        params = SamplingParams(max_tokens=1, temperature=0.0)
        prompts = [{"prompt_token_ids": s} for s in ids]

        def call() -> None:
            out = llm.generate(prompts, params, use_tqdm=False)
            assert len(out) == len(ids)

        if variant == "plain-inproc":  # the engine core is here: its executor's steps can be timed
            time_steps(llm.llm_engine.engine_core.engine_core.model_executor, ("execute_model", "sample_tokens"))
    else:
        import spec_compat  # noqa: F401  (before speculators)
        if variant == "capture-exact-check":
            from spec_compat.patches.extraction import generator_input_checks

            generator_input_checks._sum_is_finite = lambda torch, h: False  # every layer through isfinite(h).all()
        if variant == "capture-copied":
            import functools

            from spec_compat.shims import handoff

            handoff.driver.materialize = functools.partial(handoff.driver.materialize, map_pages=False)
        from speculators.data_generation.vllm_hidden_states_generator import VllmHiddenStatesGenerator

        cfg = json.loads((Path(model) / "config.json").read_text())
        layers = cfg.get("num_hidden_layers") or cfg.get("text_config", {}).get("num_hidden_layers", 4)
        # speculators' default ids need >= 4 layers (the wide fixture has 2): then capture every layer
        gen = VllmHiddenStatesGenerator(model, max_model_len=max_model_len,
                                        layer_ids=None if layers >= 4 else list(range(layers)))

        if variant == "capture-predict":
            predict_wait(gen.executor)
        time_steps(gen.executor, ("execute_model",))  # its sample_tokens RPC runs inside execute_model

        def call() -> None:
            out = gen.generate(ids)
            rows = sum(int(r["hidden_states"][0].shape[0]) for r in out)
            assert rows == tokens, (rows, tokens)

    import psutil  # a vLLM dependency

    me = psutil.Process()

    def cpu() -> dict[int, float]:
        """CPU seconds (user + system) of this process and of every process below it (the engine)."""
        out = {}
        for proc in [me, *me.children(recursive=True)]:
            try:
                t = proc.cpu_times()
                out[proc.pid] = t.user + t.system
            except psutil.NoSuchProcess:
                pass
        return out

    def timed() -> tuple[float, float, float]:
        """(wall seconds, CPU seconds of this process, CPU seconds of the engine below it)."""
        before = cpu()
        t = time.perf_counter()
        call()
        seconds = time.perf_counter() - t
        after = cpu()
        delta = {pid: after[pid] - before.get(pid, 0.0) for pid in after}
        front = delta.pop(me.pid)
        return seconds, front, sum(delta.values())

    call()  # warm-up
    if repeats == 0:  # interleaved: one timed call per "go" line from the parent, until EOF
        print("SPEC_COMPAT_READY", flush=True)
        for line in sys.stdin:
            if line.strip() != "go":
                break
            STEP_SECONDS.clear()
            seconds, front, engine = timed()
            print("SPEC_COMPAT_CALL " + json.dumps({"variant": variant, "tokens": tokens, "seconds": seconds,
                                                    "cpu_front": front, "cpu_engine": engine,
                                                    "step_seconds": sum(STEP_SECONDS.values())}), flush=True)
        return
    times, cpu_front, cpu_engine = [], [], []
    for _ in range(repeats):
        seconds, front, engine = timed()
        times.append(seconds)
        cpu_front.append(front)
        cpu_engine.append(engine)
    # the parent kills this process group once it has the line (engine teardown is not measured)
    print("SPEC_COMPAT_RESULT " + json.dumps({"variant": variant, "tokens": tokens, "seconds": times,
                                              "cpu_front": cpu_front, "cpu_engine": cpu_engine}), flush=True)
    time.sleep(600)


# ---------------------------------------------------------------- parent


def child_env(variant: str) -> dict[str, str]:
    env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    env.setdefault("VLLM_CPU_KVCACHE_SPACE", "2")
    env.setdefault("VLLM_HOST_IP", "127.0.0.1")
    env.setdefault("VLLM_MLA_DISABLE", "1")  # the CPU platform has no MLA backend (Kimi fixture)
    env.pop("SPEC_COMPAT_DISABLE", None)
    env.pop("SPEC_COMPAT_DRIVER_WAIT", None)
    env.pop("SPEC_COMPAT_DRIVER_THREADS", None)
    env.pop("SPEC_COMPAT_SHM_POOL_MB", None)
    if variant == "capture-no-pool":
        env["SPEC_COMPAT_SHM_POOL_MB"] = "0"
    if variant == "capture-pool":
        env["SPEC_COMPAT_SHM_POOL_MB"] = "1024"
    if variant == "plain-inproc":
        env["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    if variant == "capture-threads-kept":
        env["SPEC_COMPAT_DRIVER_THREADS"] = "keep"
    if variant == "capture-sleep":
        env["SPEC_COMPAT_DRIVER_WAIT"] = "sleep"
    return env


def run_child(py: str, variant: str, model: Path, ids_file: Path, repeats: int, max_model_len: int) -> dict:
    env = child_env(variant)
    # own session: the engine's helper processes are killed with the child (they keep the pipes open)
    errlog = ids_file.parent / f"{variant}.stderr"
    with open(errlog, "w") as errf:
        proc = subprocess.Popen([py, __file__, "--child", variant, str(model), str(ids_file), str(repeats),
                                 str(max_model_len)], env=env, stdout=subprocess.PIPE, stderr=errf,
                                text=True, start_new_session=True)
    line = None
    try:
        for ln in proc.stdout:  # type: ignore[union-attr]
            if ln.startswith("SPEC_COMPAT_RESULT "):
                line = ln
                break
    finally:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        proc.wait()
    err = errlog.read_text() if line is None else ""
    if line is None:
        raise SystemExit(f"{variant} failed (exit {proc.returncode}):\n{err[-3000:]}")
    return json.loads(line[len("SPEC_COMPAT_RESULT "):])


class PausedEngine:
    """A child holding a warmed-up engine, frozen (SIGSTOP on its whole process group) except
    while it runs one timed call: variants take turns call by call, so drift of the machine
    hits neighbouring calls of every variant alike, and a frozen engine's idle polling takes
    no CPU from the one being timed."""

    def __init__(self, py: str, variant: str, model: Path, ids_file: Path, max_model_len: int) -> None:
        self.variant = variant
        self.errlog = ids_file.parent / f"{variant}.stderr"
        with open(self.errlog, "w") as errf:
            self.proc = subprocess.Popen([py, __file__, "--child", variant, str(model), str(ids_file), "0",
                                          str(max_model_len)], env=child_env(variant), stdin=subprocess.PIPE,
                                         stdout=subprocess.PIPE, stderr=errf, text=True, start_new_session=True)
        self._expect("SPEC_COMPAT_READY")
        self._signal(signal.SIGSTOP)

    def _signal(self, sig: int) -> None:
        os.killpg(self.proc.pid, sig)

    def _expect(self, prefix: str) -> str:
        for ln in self.proc.stdout:  # type: ignore[union-attr]
            if ln.startswith(prefix):
                return ln[len(prefix):].strip()
        self.kill()
        raise SystemExit(f"{self.variant} failed (exit {self.proc.returncode}):\n{self.errlog.read_text()[-3000:]}")

    def call(self, n: int = 1) -> list[dict]:
        """``n`` timed calls in a row while the engine is awake (the first one right after its
        resume)."""
        self._signal(signal.SIGCONT)
        try:
            out = []
            for _ in range(n):
                self.proc.stdin.write("go\n")  # type: ignore[union-attr]
                self.proc.stdin.flush()  # type: ignore[union-attr]
                out.append(json.loads(self._expect("SPEC_COMPAT_CALL ")))
            return out
        finally:
            if self.proc.poll() is None:
                self._signal(signal.SIGSTOP)

    def kill(self) -> None:
        try:
            self._signal(signal.SIGKILL)
        except ProcessLookupError:
            pass
        self.proc.wait()


#: interleaved runs: (call seconds, step seconds) per variant whose steps the calling process sees
STEPS: dict[str, list[tuple[float, float]]] = {}


def interleaved(variants: list[tuple[str, str]], model: Path, ids_file: Path, cycles: int,
                max_model_len: int, per_turn: int = 1,
                first: dict[str, list[float]] | None = None,
                ) -> tuple[dict[str, list[float]], dict[str, dict[str, list[float]]], int]:
    """``cycles`` x one turn of every variant, the order rotating from cycle to cycle.  A turn is
    ``per_turn`` calls in a row; the last one is the sample, the first one (right after the
    engine's resume) is also appended to ``first`` when ``per_turn`` > 1."""
    engines: list[PausedEngine] = []
    seconds: dict[str, list[float]] = {v: [] for v, _ in variants}
    cpu: dict[str, dict[str, list[float]]] = {v: {"front": [], "engine": []} for v, _ in variants}
    tokens = 0
    try:
        for variant, py in variants:  # one engine starts at a time, the others frozen
            engines.append(PausedEngine(py, variant, model, ids_file, max_model_len))
            print(f"{variant} ready", file=sys.stderr, flush=True)
        for c in range(cycles):
            k = c % len(engines)
            line = []
            for eng in engines[k:] + engines[:k]:
                calls = eng.call(per_turn)
                res = calls[-1]
                if first is not None and per_turn > 1:
                    first.setdefault(eng.variant, []).append(calls[0]["seconds"])
                seconds[eng.variant].append(res["seconds"])
                cpu[eng.variant]["front"].append(res["cpu_front"])
                cpu[eng.variant]["engine"].append(res["cpu_engine"])
                tokens = res["tokens"]
                step = res.get("step_seconds") or 0.0
                if step:
                    STEPS.setdefault(eng.variant, []).append((res["seconds"], step))
                line.append(f"{eng.variant} {tokens / res['seconds']:7.0f}"
                            + (f" (steps {1000 * step:.0f} of {1000 * res['seconds']:.0f} ms)" if step else ""))
            print(f"cycle {c + 1:3d}: " + "  ".join(line) + " tok/s", file=sys.stderr, flush=True)
    finally:
        for eng in engines:
            eng.kill()
    return seconds, cpu, tokens


def paired(seconds: dict[str, list[float]], num: str, den: str) -> dict[str, float]:
    """Throughput ratio num/den per cycle (den's time / num's time of the same cycle)."""
    r = sorted(d / n for n, d in zip(seconds[num], seconds[den]))
    q = statistics.quantiles(r, n=4) if len(r) >= 2 else [r[0]] * 3
    return {"median": statistics.median(r), "q1": q[0], "q3": q[2], "min": r[0], "max": r[-1],
            "share_ge_1": sum(x >= 1.0 for x in r) / len(r), "n": len(r)}


def main() -> int:
    if len(sys.argv) > 1 and sys.argv[1] == "--child":
        child(sys.argv[2], sys.argv[3], sys.argv[4], int(sys.argv[5]), int(sys.argv[6]))
        return 0
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="llama", choices=["llama", "kimi-k25", "wide"])
    ap.add_argument("--seqs", type=int, default=64)
    ap.add_argument("--len", type=int, default=512, dest="length")
    ap.add_argument("--repeats", type=int, default=3, help="timed calls per engine")
    ap.add_argument("--rounds", type=int, default=2, help="engine starts per variant (alternating)")
    ap.add_argument("--python", default=sys.executable, help="python of the spec-compat cell (capture, plain)")
    ap.add_argument("--python-04", default=None, help="python of a speculators 0.4.0.1 cell (native04, P3)")
    ap.add_argument("--sleep", action="store_true", help="also run capture with SPEC_COMPAT_DRIVER_WAIT=sleep")
    ap.add_argument("--copied", action="store_true",
                    help="also run capture with the driver copying every layer (map_pages=False)")
    ap.add_argument("--predict", action="store_true",
                    help="also run capture with the driver sleeping once per step for 80%% of the last steps' "
                         "time (experiment)")
    ap.add_argument("--threads-kept", action="store_true",
                    help="also run capture with SPEC_COMPAT_DRIVER_THREADS=keep (torch's thread count in the "
                         "driver, the shipped path before patch driver-torch-threads)")
    ap.add_argument("--pool", action="store_true",
                    help="also run capture with SPEC_COMPAT_SHM_POOL_MB=1024 (the worker writes recycled segment pages)")
    ap.add_argument("--no-pool", action="store_true",
                    help="also run capture with SPEC_COMPAT_SHM_POOL_MB=0 (no recycled segments: fresh pages "
                         "every call, the shipped path before the pool)")
    ap.add_argument("--first-round", type=int, default=0,
                    help="round number to start from (odd: reversed order first; to split a run into parts)")
    ap.add_argument("--interleave", type=int, default=0, metavar="CYCLES",
                    help="per round, every variant's engine stays up (frozen while another runs) and the "
                         "variants take turns for CYCLES cycles of one call each (--repeats is then unused); "
                         "ratios per cycle and per round")
    ap.add_argument("--plain-inproc", action="store_true",
                    help="also run plain with VLLM_ENABLE_V1_MULTIPROCESSING=0 (engine core in the calling process)")
    ap.add_argument("--exact-check", action="store_true",
                    help="also run capture with the NaN/inf check counting every layer exactly "
                         "(isfinite(h).all(), the check before its one-sum fast path)")
    ap.add_argument("--calls-per-turn", type=int, default=1, metavar="K",
                    help="with --interleave: K calls in a row per turn, the last one timed as the sample "
                         "(the first one after the engine's resume is reported apart)")
    ap.add_argument("--json", default=None, help="write the results here")
    args = ap.parse_args()

    with tempfile.TemporaryDirectory(prefix="spec-compat-bench-") as tmp:
        build = subprocess.run([args.python, "-c", "import sys; sys.path.insert(0, sys.argv[3]);"
                                "from benchmarks.capture_overhead import build_model; from pathlib import Path;"
                                "build_model(sys.argv[1], Path(sys.argv[2]))", args.model, f"{tmp}/model", str(ROOT)],
                               capture_output=True, text=True)
        if build.returncode != 0:
            raise SystemExit(build.stderr[-3000:])
        model = Path(tmp) / "model"
        vocab = json.loads((model / "config.json").read_text()).get("vocab_size") or \
            json.loads((model / "config.json").read_text())["text_config"]["vocab_size"]
        ids = token_ids(args.seqs, args.length, vocab)
        ids_file = Path(tmp) / "ids.json"
        ids_file.write_text(json.dumps(ids))
        max_model_len = args.length + 8

        variants = [("plain", args.python), ("capture", args.python)]
        if args.sleep:
            variants.append(("capture-sleep", args.python))
        if args.copied:
            variants.append(("capture-copied", args.python))
        if args.predict:
            variants.append(("capture-predict", args.python))
        if args.threads_kept:
            variants.append(("capture-threads-kept", args.python))
        if args.no_pool:
            variants.append(("capture-no-pool", args.python))
        if args.pool:
            variants.append(("capture-pool", args.python))
        if args.exact_check:
            variants.append(("capture-exact-check", args.python))
        if args.plain_inproc:
            variants.append(("plain-inproc", args.python))
        if args.python_04:
            variants.append(("native04", args.python_04))
        seconds: dict[str, list[float]] = {v: [] for v, _ in variants}
        cpu: dict[str, dict[str, list[float]]] = {v: {"front": [], "engine": []} for v, _ in variants}
        tokens = 0
        rounds: list[dict[str, list[float]]] = []  # interleaved: each round's seconds per variant
        firsts: list[dict[str, list[float]]] = []  # --calls-per-turn > 1: each round's first calls
        for r in range(args.rounds if args.interleave else 0):
            # fresh engines every round: an engine instance keeps its own speed for its whole life
            # (measured: P2 per cycle 0.87 with one pair of engines, 0.99 with the next), so the
            # cycles of one round are paired and the rounds are the independent samples
            print(f"round {r + 1}", file=sys.stderr, flush=True)
            first: dict[str, list[float]] = {}
            rs, rc, tokens = interleaved(variants if r % 2 == 0 else variants[::-1], model, ids_file,
                                         args.interleave, max_model_len, args.calls_per_turn, first)
            rounds.append(rs)
            firsts.append(first)
            for v in rs:
                seconds[v].extend(rs[v])
                cpu[v]["front"].extend(rc[v]["front"])
                cpu[v]["engine"].extend(rc[v]["engine"])
        for r in range(0 if args.interleave else args.rounds):
            order = variants if (r + args.first_round) % 2 == 0 else variants[::-1]
            for variant, py in order:
                res = run_child(py, variant, model, ids_file, args.repeats, max_model_len)
                seconds[variant].extend(res["seconds"])
                cpu[variant]["front"].extend(res["cpu_front"])
                cpu[variant]["engine"].extend(res["cpu_engine"])
                tokens = res["tokens"]
                print(f"round {r + 1} {variant:9s} " + " ".join(f"{tokens / s:9.0f}" for s in res["seconds"])
                      + " tok/s", file=sys.stderr, flush=True)

    def tps(v: str) -> list[float]:
        return sorted(tokens / s for s in seconds[v])

    summary = {v: {"min": tps(v)[0], "median": statistics.median(tps(v)), "max": tps(v)[-1], "n": len(tps(v))}
               for v in seconds}
    ratios = {"P2 capture/plain": summary["capture"]["median"] / summary["plain"]["median"]}
    if "capture-sleep" in summary:
        ratios["P2 with the driver sleeping (capture-sleep/plain)"] = \
            summary["capture-sleep"]["median"] / summary["plain"]["median"]
    if "native04" in summary:
        ratios["P3 capture/native04"] = summary["capture"]["median"] / summary["native04"]["median"]
    per_cycle: dict[str, dict] = {}
    if args.interleave:
        pairs = [("P2 capture/plain", "capture", "plain")]
        if "capture-sleep" in seconds:
            pairs.append(("P2 with the driver sleeping (capture-sleep/plain)", "capture-sleep", "plain"))
        if "capture-copied" in seconds:
            pairs.append(("capture/capture-copied (pages mapped vs copied)", "capture", "capture-copied"))
            pairs.append(("P2 with copied layers (capture-copied/plain)", "capture-copied", "plain"))
        if "capture-predict" in seconds:
            pairs.append(("capture-predict/capture (one sleep per step vs spin)", "capture-predict", "capture"))
            pairs.append(("P2 with one sleep per step (capture-predict/plain)", "capture-predict", "plain"))
        if "capture-threads-kept" in seconds:
            pairs.append(("capture/capture-threads-kept (driver-torch-threads on vs off)", "capture",
                          "capture-threads-kept"))
            pairs.append(("P2 without driver-torch-threads (capture-threads-kept/plain)", "capture-threads-kept",
                          "plain"))
        if "capture-exact-check" in seconds:
            pairs.append(("capture/capture-exact-check (NaN/inf check by one sum vs isfinite)", "capture",
                          "capture-exact-check"))
            pairs.append(("P2 with the exact check (capture-exact-check/plain)", "capture-exact-check", "plain"))
        if "capture-pool" in seconds:
            pairs.append(("capture-pool/capture (recycled segments vs fresh ones)", "capture-pool", "capture"))
            pairs.append(("P2 with recycled segments (capture-pool/plain)", "capture-pool", "plain"))
        if "capture-no-pool" in seconds:
            pairs.append(("capture/capture-no-pool (recycled segments on vs off)", "capture", "capture-no-pool"))
            pairs.append(("P2 without recycled segments (capture-no-pool/plain)", "capture-no-pool", "plain"))
        if "plain-inproc" in seconds:
            pairs.append(("plain-inproc/plain (engine core in-process vs its own process)", "plain-inproc", "plain"))
            pairs.append(("capture/plain-inproc", "capture", "plain-inproc"))
        if "native04" in seconds:
            pairs.append(("P3 capture/native04", "capture", "native04"))
        for name, num, den in pairs:
            per_cycle[name] = paired(seconds, num, den)
            per_round = [paired(rs, num, den)["median"] for rs in rounds]
            per_cycle[name]["per_round_medians"] = per_round
            per_cycle[name]["median_of_rounds"] = statistics.median(per_round)
        if args.calls_per_turn > 1:  # the same pairs, from the first call after each resume
            name = "P2 first call after resume (capture/plain)"
            per_cycle[name] = paired({v: [x for f in firsts for x in f[v]] for v in firsts[0]}, "capture", "plain")
            per_round = [paired(f, "capture", "plain")["median"] for f in firsts]
            per_cycle[name]["per_round_medians"] = per_round
            per_cycle[name]["median_of_rounds"] = statistics.median(per_round)
        print(f"model {args.model}: {args.seqs} x {args.length} tokens ({tokens}), interleaved, "
              f"{args.rounds} rounds (fresh engines) x {args.interleave} cycles")
    else:
        print(f"model {args.model}: {args.seqs} x {args.length} tokens ({tokens}), {args.rounds} rounds x "
              f"{args.repeats} calls")
    for v, s in summary.items():
        print(f"  {v:9s} tok/s min {s['min']:9.0f}  median {s['median']:9.0f}  max {s['max']:9.0f}  (n={s['n']})")
    # CPU seconds per 1000 tokens: the work each variant does, which the wall clock of a shared
    # machine blurs; "front" is the calling process (LLM front end / speculators' driver loop),
    # "engine" every process below it (EngineCore / the executor's worker)
    cpu_summary = {v: {part: statistics.median(x) * 1000 / tokens for part, x in c.items()} for v, c in cpu.items()}
    for v, c in cpu_summary.items():
        print(f"  {v:9s} CPU s per 1k tokens (medians): front {c['front']:.3f}  engine {c['engine']:.3f}  "
              f"total {c['front'] + c['engine']:.3f}")
    ratios["P2 CPU engine plain/capture"] = cpu_summary["plain"]["engine"] / cpu_summary["capture"]["engine"]
    ratios["P2 CPU total plain/capture"] = (sum(cpu_summary["plain"].values())
                                            / sum(cpu_summary["capture"].values()))
    if "native04" in cpu_summary:
        ratios["P3 CPU engine native04/capture"] = cpu_summary["native04"]["engine"] / cpu_summary["capture"]["engine"]
    for k, v in ratios.items():
        print(f"  {k}: {v:.3f}")
    for v, pairs_ in STEPS.items():
        print(f"  {v:9s} per call (medians): {1000 * statistics.median(c for c, _ in pairs_):.1f} ms, model steps "
              f"{1000 * statistics.median(st for _, st in pairs_):.1f} ms, outside the steps "
              f"{1000 * statistics.median(c - st for c, st in pairs_):.1f} ms (n={len(pairs_)})")
    for k, v in per_cycle.items():
        print(f"  {k} per cycle: median {v['median']:.3f}  quartiles {v['q1']:.3f} .. {v['q3']:.3f}  "
              f"min {v['min']:.3f}  max {v['max']:.3f}  (>= 1.0 in {v['share_ge_1']:.0%} of {v['n']})")
        print("    per round (median of its cycles): " + " ".join(f"{x:.3f}" for x in v["per_round_medians"])
              + f"  -> median of rounds {v['median_of_rounds']:.3f}")
    if args.json:
        Path(args.json).write_text(json.dumps({"model": args.model, "seqs": args.seqs, "len": args.length,
                                               "tokens": tokens, "engine": ENGINE, "summary": summary,
                                               "seconds": seconds, "cpu_per_1k_tokens": cpu_summary,
                                               "cpu_seconds": cpu, "ratios": ratios,
                                               "interleave_cycles": args.interleave,
                                               "calls_per_turn": args.calls_per_turn, "per_cycle": per_cycle,
                                               "call_and_step_seconds": STEPS},
                                              indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
