"""generator-input-checks' helpers alone: what generate() refuses before the engine, what truncation logs,
and the row-count guard on results (no engine; the engine property test is
tests/engine/test_generator_inputs.py)."""

from __future__ import annotations

import logging

import pytest

from spec_compat.shims.capture import RowCountError
from spec_compat.patches.extraction.generator_input_checks import GeneratorInputError, check_inputs, check_results

PID = "generator-input-checks"


@pytest.mark.parametrize("token_ids, where", [
    ([], "holds no sequences"),
    ([[]], "sequence 0 is empty"),
    ([[1, 2], []], "sequence 1 is empty"),
    ([[1, 2.0]], "sequence 0 position 1: 2.0 (float)"),
    ([[1, None]], "position 1: None (NoneType)"),
    ([[True, 1]], "position 0: True (bool)"),
    ([["3"]], "position 0: '3' (str)"),
    ([[1, -1]], "position 1: token id -1 is outside the vocabulary [0, 10)"),
    ([[3], [9, 10]], "sequence 1 position 1: token id 10 is outside"),
    ([[2 ** 70]], "token id 1180591620717411303424 is outside"),
    ("abc", "token_ids is a str"),
    (7, "token_ids is a int"),
    ([[1], "ab"], "sequence 1 is a str"),
    ([[1], 5], "sequence 1 is a int"),
])
def test_bad_batches_are_refused_with_where(token_ids, where):
    with pytest.raises(GeneratorInputError) as exc:
        check_inputs(token_ids, 10, 100, PID)
    assert f"spec_compat[{PID}]" in str(exc.value)
    assert where in str(exc.value)


def test_valid_batch_passes_as_plain_lists():
    seqs, cut = check_inputs([(1, 2, 3), [0, 9]], 10, 100, PID)
    assert seqs == [[1, 2, 3], [0, 9]] and all(type(s) is list for s in seqs)
    assert cut is None


def test_no_vocabulary_size_skips_only_the_upper_bound():
    assert check_inputs([[10 ** 9]], None, 100, PID)[0] == [[10 ** 9]]
    with pytest.raises(GeneratorInputError):
        check_inputs([[-3]], None, 100, PID)


def test_tensors_and_arrays():
    torch = pytest.importorskip("torch")
    seqs, _ = check_inputs(torch.tensor([[1, 2], [3, 4]]), 10, 100, PID)
    assert seqs == [[1, 2], [3, 4]]
    assert check_inputs([torch.tensor([5, 6])], 10, 100, PID)[0] == [[5, 6]]
    with pytest.raises(GeneratorInputError, match="dtype torch.float32"):
        check_inputs(torch.tensor([[1.0, 2.0]]), 10, 100, PID)
    with pytest.raises(GeneratorInputError, match="1-D array"):
        check_inputs(torch.tensor([1, 2]), 10, 100, PID)
    with pytest.raises(GeneratorInputError, match="dtype torch.bool"):
        check_inputs([torch.tensor([True])], 10, 100, PID)


def test_numpy_integer_scalars_are_token_ids():
    np = pytest.importorskip("numpy")
    seqs, _ = check_inputs([[np.int64(3), 4]], 10, 100, PID)
    assert seqs == [[3, 4]] and all(type(t) is int for t in seqs[0])
    with pytest.raises(GeneratorInputError, match="float64"):
        check_inputs([[np.float64(3.0)]], 10, 100, PID)


def test_truncation_is_logged_with_counts(caplog):
    with caplog.at_level(logging.WARNING, logger="spec_compat"):
        _, cut = check_inputs([[1] * 5, [1] * 12, [1] * 20], 10, 8, PID)
    assert (cut.sequences, cut.tokens, cut.longest, cut.max_len) == (2, 4 + 12, 20, 8)
    msg = caplog.records[-1].getMessage()
    assert "2 of 3 sequences are longer than max_model_len - 1 = 8 tokens (longest 20)" in msg
    assert "16 tokens dropped" in msg and f"spec_compat[{PID}]" in msg


class _T:
    """A tensor stand-in with .shape and .tolist() (the guard reads nothing else)."""

    def __init__(self, rows: int, ids: list[int] | None = None):
        self.shape = (rows, 4)
        self._ids = ids

    def tolist(self):
        return list(self._ids)


def _result(ids, rows, layers=2):
    return {"input_ids": _T(len(ids), ids), "hidden_states": [_T(r) for r in ([rows] * layers)]}


def test_results_guard_accepts_exact_rows_after_truncation():
    seqs = [[1, 2, 3], [4, 5, 6, 7, 8]]
    check_results([_result([1, 2, 3], 3), _result([4, 5, 6, 7], 4)], seqs, 4, PID)


@pytest.mark.parametrize("results, match", [
    ([_result([1, 2, 3], 3)], "1 results for 2 sequences"),
    ([_result([1, 2, 3], 3), _result([4, 5, 6], 3)], "result 1 carries 3 input ids"),
    ([_result([4, 5, 6, 7], 4), _result([1, 2, 3], 3)], "result 0 carries"),
    ([_result([1, 2, 3], 2), _result([4, 5, 6, 7], 4)], "sequence 0 lost rows: layer 0 has 2 rows for 3 tokens"),
    ([_result([1, 2, 3], 3, layers=0), _result([4, 5, 6, 7], 4)], "result 0 has no hidden states"),
])
def test_results_guard_raises_on_lost_or_shifted_rows(results, match):
    with pytest.raises(RowCountError, match=match) as exc:
        check_results(results, [[1, 2, 3], [4, 5, 6, 7, 8]], 4, PID)
    assert f"spec_compat[{PID}]" in str(exc.value)
