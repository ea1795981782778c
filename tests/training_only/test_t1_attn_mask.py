"""The stand-in ``_prepare_4d_causal_attention_mask`` (transformers 5.24 removed the
module speculators imports it from): checked against the mask written out position
by position, and against transformers' own function where transformers still has it."""

from __future__ import annotations

import importlib.util

import pytest

from spec_compat.verify.compare import compare_identical
from spec_compat.patches.training.attn_mask_utils_module import prepare_4d_causal_attention_mask

CASES = [
    # batch, query_len, past, sliding_window, padded (left-padding count per row)
    (2, 5, 0, None, (0, 2)),
    (1, 1, 7, None, (3,)),
    (3, 4, 6, None, (0, 1, 9)),
    (2, 6, 0, 2, (0, 1)),
    (2, 3, 5, 3, (2, 0)),
    (1, 8, 0, None, None),
    (2, 2, 4, 1, None),
]


def expected_mask(torch, batch, query_len, past, window, padding, dtype):
    key_len = past + query_len
    low = torch.finfo(dtype).min
    out = torch.zeros(batch, 1, query_len, key_len, dtype=dtype)
    for b in range(batch):
        for i in range(query_len):
            for j in range(key_len):
                visible = j <= past + i
                if window is not None:
                    visible = visible and (past + i) - j <= window
                if padding is not None:
                    visible = visible and j >= padding[b]
                if not visible:
                    out[b, 0, i, j] = low
    return out


def inputs(torch, batch, query_len, past, padding, dtype):
    embeds = torch.zeros(batch, query_len, 8, dtype=dtype)
    if padding is None:
        return None, embeds
    mask = torch.ones(batch, past + query_len, dtype=torch.long)
    for b, n in enumerate(padding):
        mask[b, :n] = 0
    return mask, embeds


@pytest.mark.parametrize("dtype_name", ["float32", "bfloat16"])
@pytest.mark.parametrize("case", CASES, ids=[str(c) for c in CASES])
def test_mask_positions(case, dtype_name):
    torch = pytest.importorskip("torch")
    dtype = getattr(torch, dtype_name)
    batch, query_len, past, window, padding = case
    mask, embeds = inputs(torch, batch, query_len, past, padding, dtype)
    got = prepare_4d_causal_attention_mask(mask, (batch, query_len), embeds, past, sliding_window=window)
    assert got.dtype == dtype and got.shape == (batch, 1, query_len, past + query_len)
    assert compare_identical(got, expected_mask(torch, batch, query_len, past, window, padding, dtype), allow_inf=True)


def test_four_d_and_shape_errors():
    torch = pytest.importorskip("torch")
    embeds = torch.zeros(1, 3, 4)
    four_d = torch.tensor([[[[1, 0, 0], [1, 1, 0], [0, 1, 1]]]])
    got = prepare_4d_causal_attention_mask(four_d, (1, 3), embeds, 0)
    low = torch.finfo(torch.float32).min
    assert compare_identical(got, torch.where(four_d.bool(), 0.0, low), allow_inf=True)
    with pytest.raises(ValueError, match="4-D attention mask should be of shape"):
        prepare_4d_causal_attention_mask(four_d, (1, 2), embeds, 0)
    with pytest.raises(ValueError, match="2-D attention mask should be of shape"):
        prepare_4d_causal_attention_mask(torch.ones(1, 3), (1, 3), embeds, 2)


@pytest.mark.skipif(importlib.util.find_spec("transformers") is None, reason="needs transformers")
@pytest.mark.parametrize("case", CASES, ids=[str(c) for c in CASES])
def test_same_as_transformers_own_where_it_exists(case):
    torch = pytest.importorskip("torch")
    spec = importlib.util.find_spec("transformers.modeling_attn_mask_utils")
    if spec is None or spec.origin == "spec-compat stand-in":
        pytest.skip("this transformers has no modeling_attn_mask_utils of its own (>= 5.24)")
    from transformers.modeling_attn_mask_utils import _prepare_4d_causal_attention_mask

    batch, query_len, past, window, padding = case
    mask, embeds = inputs(torch, batch, query_len, past, padding, torch.float32)
    ours = prepare_4d_causal_attention_mask(mask, (batch, query_len), embeds, past, sliding_window=window)
    theirs = _prepare_4d_causal_attention_mask(mask, (batch, query_len), embeds, past, sliding_window=window)
    c = compare_identical(ours, theirs, allow_inf=True)
    assert c, c.detail
