"""Inputs to speculators' generator on the real engine, property-based (hypothesis),
bounded in count: every accepted batch yields exact rows (values against a
transformers forward), bad ids are refused before the engine sees them, truncation
is logged with counts, and the row-count guard turns upstream #279's silent row
loss into an error.

Examples are derandomized (the same in every CI run); SPEC_COMPAT_HYPOTHESIS_EXAMPLES
raises the count for a longer local search."""

from __future__ import annotations

import logging
import os
import random

import pytest

from proof_runs import proof_cases  # tests/support (on sys.path: tests/conftest.py)

if os.environ.get("SPEC_COMPAT_REQUIRE_ENGINE") == "1":
    import hypothesis  # an engine cell installs it (matrix/cells.py TEST_REQUIREMENTS)
else:
    hypothesis = pytest.importorskip("hypothesis")
from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from spec_compat.cli.selftest import TOLERANCE, compare  # noqa: E402

pytestmark = pytest.mark.engine

PID = "generator-input-checks"
MAX_MODEL_LEN = 512  # over-long inputs stay cheap; a batch over 8192 tokens still spans scheduler steps
MAX_LEN = MAX_MODEL_LEN - 1
VOCAB = 512  # the Llama fixture's
BLOCK = 16  # speculators' VLLM_BLOCK_SIZE on CPU/CUDA
LAYER_IDS = [0, 1, 2, 3]
EXAMPLES = int(os.environ.get("SPEC_COMPAT_HYPOTHESIS_EXAMPLES", "0"))


def _settings(n: int):
    return settings(max_examples=EXAMPLES or n, deadline=None, derandomize=not EXAMPLES, database=None,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])


@pytest.fixture(scope="module")
def engine(llama_dir):
    from speculators.data_generation.vllm_hidden_states_generator import VllmHiddenStatesGenerator

    from spec_compat import REGISTRY
    from spec_compat.verify.reference import load_reference_model
    from spec_compat.verify.settings import pinned_dtype

    if not _applied(PID):
        pytest.skip(f"{PID} is not applied here ({REGISTRY.status(PID)})")
    with pinned_dtype("float32"):
        gen = VllmHiddenStatesGenerator(str(llama_dir), layer_ids=LAYER_IDS, max_model_len=MAX_MODEL_LEN)
    yield gen, load_reference_model(str(llama_dir))
    gen.executor.shutdown()


def _applied(pid: str) -> bool:
    from spec_compat import REGISTRY

    status = REGISTRY.status(pid)
    return status is not None and status.value == "applied"


class _Warnings(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())


def _generate(gen, batch):
    handler = _Warnings()
    logger = logging.getLogger("spec_compat")
    logger.addHandler(handler)
    try:
        return gen.generate(batch), handler.messages
    finally:
        logger.removeHandler(handler)


def _assert_exact(results, batch, ref):
    from spec_compat.verify.reference import reference_states

    cache: dict[tuple[int, ...], list] = {}

    def reference(ids):
        key = tuple(ids)
        if key not in cache:
            cache[key] = reference_states(ref, ids, LAYER_IDS)
        return cache[key]

    expected = [ids[:MAX_LEN] for ids in batch]
    ok, worst, detail = compare(results, expected, LAYER_IDS, reference)
    assert ok and worst <= TOLERANCE, detail
    for res, ids in zip(results, expected):
        assert [h.shape[0] for h in res["hidden_states"]] == [len(ids)] * len(LAYER_IDS)


# lengths that sit on and next to KV-block and max_model_len boundaries, plus anything in range
_LENGTH = st.one_of(st.sampled_from([1, BLOCK - 1, BLOCK, BLOCK + 1, 2 * BLOCK, 8 * BLOCK + 1, MAX_LEN - 1,
                                     MAX_LEN, MAX_LEN + 1, MAX_MODEL_LEN + BLOCK]),
                    st.integers(1, MAX_MODEL_LEN + 64))


@st.composite
def batches(draw):
    """A batch: 1-45 sequences, some sharing one of up to three prefixes (block-boundary lengths
    likely), some exact repeats; token values from a drawn seed (hypothesis draws the shape)."""
    rng = random.Random(draw(st.integers(0, 2 ** 32 - 1)))
    n = draw(st.one_of(st.integers(1, 45), st.sampled_from([32, 33, 40])))
    prefixes = [[rng.randrange(VOCAB) for _ in range(draw(_LENGTH))] for _ in range(draw(st.integers(0, 3)))]
    batch: list[list[int]] = []
    for _ in range(n):
        choice = draw(st.integers(-1, len(prefixes) + 1))
        if batch and choice == len(prefixes) + 1:
            batch.append(list(batch[draw(st.integers(0, len(batch) - 1))]))  # exact repeat
            continue
        head = prefixes[choice] if 0 <= choice < len(prefixes) else []
        tail = draw(st.integers(0 if head else 1, MAX_MODEL_LEN + 32 - len(head))) if len(head) < MAX_MODEL_LEN else 0
        batch.append(head + [rng.randrange(VOCAB) for _ in range(tail)])
    return batch


@_settings(6)
@given(batch=batches())
def test_accepted_batches_yield_exact_rows(engine, batch):
    gen, ref = engine
    results, warnings = _generate(gen, batch)
    _assert_exact(results, batch, ref)
    print(f"{len(batch)} sequences, {sum(map(len, batch))} tokens, lengths {min(map(len, batch))}-"
          f"{max(map(len, batch))}, {len(set(map(tuple, batch)))} distinct")
    long = [len(s) for s in batch if len(s) > MAX_LEN]
    ours = [m for m in warnings if f"spec_compat[{PID}]" in m]
    if long:
        assert len(ours) == 1, warnings
        assert f"{len(long)} of {len(batch)} sequences are longer than max_model_len - 1 = {MAX_LEN}" in ours[0]
        assert f"{sum(n - MAX_LEN for n in long)} tokens dropped" in ours[0]
    else:
        assert not ours, ours


def test_a_batch_spanning_scheduler_steps_with_chunked_tails(engine):
    """Fixed, large case next to the random ones: 40 sequences, 12 000+ tokens (> one 8192-token
    step, so prompts are split across steps), shared 16/17-token prefixes, 5 over-long."""
    gen, ref = engine
    rng = random.Random(7)
    p16, p17 = [rng.randrange(VOCAB) for _ in range(16)], [rng.randrange(VOCAB) for _ in range(17)]
    batch = []
    for i in range(40):
        head = p16 if i % 3 == 0 else p17 if i % 3 == 1 else []
        n = MAX_MODEL_LEN + 20 if i % 8 == 7 else rng.randrange(200, 400)
        batch.append(head + [rng.randrange(VOCAB) for _ in range(n - len(head))])
    assert sum(len(s) for s in batch) > 12000
    results, warnings = _generate(gen, batch)
    _assert_exact(results, batch, ref)
    assert any("5 of 40 sequences are longer" in m for m in warnings), warnings


_BAD_ID = st.one_of(
    st.integers(max_value=-1),
    st.integers(min_value=VOCAB),
    st.floats(allow_nan=True),
    st.booleans(),
    st.none(),
    st.text(max_size=3),
)


@st.composite
def bad_batches(draw):
    """A batch with exactly one defect: an empty batch, an empty sequence, or one bad id somewhere."""
    kind = draw(st.sampled_from(["empty-batch", "empty-sequence", "bad-id"]))
    if kind == "empty-batch":
        return [], "holds no sequences"
    n = draw(st.integers(1, 5))
    batch = [draw(st.lists(st.integers(0, VOCAB - 1), min_size=1, max_size=40)) for _ in range(n)]
    i = draw(st.integers(0, n - 1))
    if kind == "empty-sequence":
        batch[i] = []
        return batch, f"sequence {i} is empty"
    p = draw(st.integers(0, len(batch[i]) - 1))
    batch[i][p] = draw(_BAD_ID)
    return batch, f"sequence {i} position {p}:"


@_settings(40)
@given(case=bad_batches())
def test_bad_inputs_are_refused_before_the_engine(engine, case):
    from spec_compat.patches.extraction.generator_input_checks import GeneratorInputError

    gen, _ = engine
    batch, where = case
    before = gen._request_counter
    with pytest.raises(GeneratorInputError) as exc:
        gen.generate(batch)
    assert f"spec_compat[{PID}]" in str(exc.value) and where in str(exc.value), str(exc.value)
    # the engine saw nothing: no request was added, no request id was used
    assert gen._request_counter == before
    assert not gen.scheduler.requests


def test_engine_still_exact_after_refusals(engine):
    gen, ref = engine
    with pytest.raises(ValueError):
        gen.generate([[1, 2, 3], [4, -5]])
    batch = [[1, 2, 3], [4, 5]]
    results, _ = _generate(gen, batch)
    _assert_exact(results, batch, ref)


@pytest.mark.parametrize("pid", proof_cases("test_lost_rows_raise_instead_of_passing_silently"))
def test_lost_rows_raise_instead_of_passing_silently(llama_dir, selftest, prove, pid):
    """With speculators 0.3.x's partial-prefill abort back (keep-unfinished-prefill off) and the
    stock input-order slicing (F10 patches off) -- the fault, ``also_off`` in the proof -- the
    chunked batch loses rows: the guard raises naming itself; with the guard off too the rows come
    back short, silently (the declared symptom)."""
    from spec_compat import REGISTRY

    proof = prove(pid)
    if not all(REGISTRY.get(p).needed()[0] for p in proof.proof.disabled_ids(pid)):
        pytest.skip("the row loss needs speculators 0.3.x on vLLM >= 0.11.1 (patches not applied here)")
    guarded = selftest(llama_dir, "chunked-8x2000", disable=proof.baseline)
    line = next(ln for ln in guarded.stdout.splitlines() if "chunked-8x2000" in ln)
    assert line.startswith("FAIL") and f"RowCountError: spec_compat[{pid}]" in line and "lost rows" in line, line
    proof.assert_absent(guarded.stdout)
    silent = selftest(llama_dir, "chunked-8x2000", disable=proof.disable)
    verdict = next((ln for ln in silent.stdout.splitlines() if "chunked-8x2000" in ln), "")
    line = proof.assert_symptom(verdict, report=True)  # the check's verdict line
    assert line.startswith("FAIL") and "Error" not in line, line
