"""Driver-side patches around every ``generate()`` call (speculators 0.3-0.4): input, row-count
and NaN/inf checks, and the driver's torch thread count on a CPU platform."""

from __future__ import annotations

from types import ModuleType
from typing import Any

from ...core import switches
from ...core.proof import Claim, Proof
from ...core.registry import Changes, NotNeeded, Patch, TargetChanged, register
from ._generator_target import GENERATOR, check_generate_params, generator_source
from ..ranges import SPEC_03


@register
class GeneratorInputChecks(Patch):
    """speculators 0.3-0.4 (generator:228/251) passes token ids to the engine unchecked and cuts
    sequences over ``max_model_len - 1`` silently; rows lost on the way (upstream #279) go
    unnoticed, and NaN/inf states are returned (and saved) as they are (upstream checks them since
    #615).  Bad ids now raise before the engine, truncation is logged, rows are counted, non-finite
    values are counted per result and layer (``SPEC_COMPAT_NONFINITE``: raise, or warn)."""

    id = "generator-input-checks"
    after = ("generate-in-fitting-batches",)
    reads = (switches.NONFINITE_VAR,)
    proof = Proof("guard", "tests/engine/test_generator_inputs.py::test_lost_rows_raise_instead_of_passing_silently", r"FAIL chunked-8x2000: sequence \d+ layer \d+: (?:shape engine \[\d+, \d+\] != reference \[\d+, \d+\]|max\|diff\|=\S+ > tolerance)", also_off=("keep-unfinished-prefill", "capture-per-request", "rows-by-request-id"))
    summary = ("generate() inputs checked before the engine (empty, non-int, out-of-vocabulary ids), "
               "truncation logged with counts, every result's rows counted, NaN/inf captured values "
               "counted per result and layer: an error (SPEC_COMPAT_NONFINITE=warn: a warning with the counts)")
    upstream = ("speculators 0.3.0-0.4.x generator: ids[:max_len] truncates silently, bad ids reach vLLM; "
                "issue #279: lost rows go unnoticed; NaN/inf states saved silently (checked upstream since #615)")
    fixes = ("#279",)
    target = f"{GENERATOR}:VllmHiddenStatesGenerator"
    requires = {"speculators": ">=0.3,<0.5"}

    def check(self, module: ModuleType) -> None:
        check_generate_params(module)
        if "ids[:max_len]" not in generator_source(module):
            raise TargetChanged("generate() no longer truncates with ids[:max_len]")

    def install(self, module: ModuleType, changes: Changes) -> None:
        from ...shims.inputs import check_finite, check_inputs, check_results

        cls = module.VllmHiddenStatesGenerator
        inner = cls.generate
        pid = self.id

        def generate(self: Any, token_ids: Any) -> list[dict]:
            model_config = self.vllm_config.model_config
            try:
                vocab = int(model_config.get_vocab_size())
            except Exception:  # noqa: BLE001 - an unreadable vocabulary size only skips the range check
                vocab = None
            max_len = model_config.max_model_len - 1
            nonfinite = switches.value(switches.NONFINITE_VAR)  # a bad switch fails before the engine
            seqs, _ = check_inputs(token_ids, vocab, max_len, pid)
            results = inner(self, seqs)
            check_results(results, seqs, max_len, pid)
            check_finite(results, pid, nonfinite, getattr(self, "layer_ids", None))
            return results

        changes.setattr(cls, "generate", generate)


@register
class DriverTorchThreads(Patch):
    """speculators 0.3.0 (generator:283) clones every captured row in the driver with torch's intra-op
    pool on the cores vLLM's CPU worker computes on (P2): on vLLM 0.16 (Llama fixture, 2 cores) those
    copies took ten times as long as alone (a cProfile of the driver, benchmarks/RESULTS.md);
    extraction ran at 0.84-0.89 of plain prefill per round, and faster with this patch in the same
    interleaved rounds (benchmarks/results/capture_overhead_llama_driver_threads.json: there
    ``capture-threads-kept`` is the run without it)."""

    id = "driver-torch-threads"
    reads = (switches.DRIVER_THREADS_VAR,)
    after = ("generator-input-checks",)
    proof = Proof("optimization", "tests/engine/test_handoff_engine.py::test_handoff_rows_equal_the_pickled_path", benchmark="benchmarks/results/capture_overhead_llama_driver_threads.json", claims=(
        Claim("without the patch / plain prefill, extraction tok/s (medians, 3 rounds x 10 cycles)",
              "summary.capture-threads-kept.median", "summary.plain.median", at_least=0.84, at_most=0.89),
        Claim("with / without the patch, extraction tok/s (medians, same interleaved cycles)",
              "summary.capture.median", "summary.capture-threads-kept.median", at_least=1.0)))
    summary = ("CPU platform: generate() runs with SPEC_COMPAT_DRIVER_THREADS (default 1) torch threads "
               "in the driver; the caller's count is restored after each call")
    upstream = ("speculators 0.3.0 generator:283 per-sequence clone() in the driver, split over torch's "
                "threads on the cores vLLM's CPU worker computes on")
    target = f"{GENERATOR}:VllmHiddenStatesGenerator"
    requires = {"speculators": SPEC_03, "vllm": ">=0.16,<0.17"}  # the cell that measured it (P2)

    def check(self, module: ModuleType) -> None:
        import torch

        check_generate_params(module)
        if torch.cuda.is_available():
            raise NotNeeded("CUDA platform: the driver's copies do not share the model's CPU cores")
        if switches.value(switches.DRIVER_THREADS_VAR) is None:
            raise NotNeeded(f"{switches.DRIVER_THREADS_VAR}=keep: the driver keeps torch's thread count")

    def install(self, module: ModuleType, changes: Changes) -> None:
        import torch

        from ...shims.threads import torch_threads

        n = switches.value(switches.DRIVER_THREADS_VAR)
        assert n is not None  # check() made 'keep' not-needed
        cls = module.VllmHiddenStatesGenerator
        inner = cls.generate

        def generate(self: Any, token_ids: Any) -> list[dict]:
            with torch_threads(torch, n):
                return inner(self, token_ids)

        changes.setattr(cls, "generate", generate)
