"""The torch stand-ins for vLLM's speculative-decoding Triton kernels (CPU platform),
against the kernels' contracts worked by hand.  Launched as vLLM launches them:
``kernel[grid](...)``."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from spec_compat.patches.serving import _cpu_spec_decode as sd  # noqa: E402
from spec_compat.patches.serving import cpu_eagle_padded_batch as eagle  # noqa: E402
from spec_compat.patches.serving import cpu_rejection_sampler as rejection  # noqa: E402

PH = -1  # vLLM's PLACEHOLDER_TOKEN_ID


def out_buffer(batch: int, k: int):
    return torch.full((batch, k + 1), PH, dtype=torch.int32)


def test_greedy_accepts_until_first_mismatch_then_bonus():
    # requests with 3, 0 and 2 draft tokens
    cu = torch.tensor([3, 3, 5])
    draft = torch.tensor([7, 8, 9, 4, 5])
    argmax = torch.tensor([7, 1, 9, 4, 5])  # req 0 rejects at pos 1; req 2 accepts all
    bonus = torch.tensor([[11], [12], [13]])
    out = out_buffer(3, 3)
    rejection.REJECTION_KERNELS["rejection_greedy_sample_kernel"][(3,)](out, cu, draft, argmax, bonus, None, 3)
    assert out.tolist() == [[7, 1, PH, PH], [12, PH, PH, PH], [4, 5, 13, PH]]


def test_greedy_skips_non_greedy_requests():
    cu = torch.tensor([1, 2])
    out = out_buffer(2, 1)
    rejection.rejection_greedy_sample_kernel(out, cu, torch.tensor([3, 3]), torch.tensor([3, 3]), torch.tensor([5, 6]),
                                      torch.tensor([True, False]), 1)
    assert out.tolist() == [[3, 5], [PH, PH]]


def test_random_rejection_uses_ratio_and_recovered_token():
    cu = torch.tensor([2, 4])
    draft = torch.tensor([1, 2, 1, 2])
    target = torch.tensor([[0.1, 0.6, 0.3], [0.2, 0.2, 0.6], [0.1, 0.6, 0.3], [0.5, 0.4, 0.1]])
    draft_probs = torch.tensor([[0.2, 0.6, 0.2], [0.2, 0.2, 0.6], [0.2, 0.6, 0.2], [0.1, 0.1, 0.8]])
    uniform = torch.tensor([0.99, 0.5, 0.5, 0.9], dtype=torch.float64)  # req 1 pos 1: 0.1/0.8 < 0.9
    recovered = torch.tensor([0, 0, 0, 1])
    out = out_buffer(2, 2)
    rejection.REJECTION_KERNELS["rejection_random_sample_kernel"][(2,)](
        out, cu, draft, draft_probs, target, torch.tensor([9, 9]), recovered, uniform,
        torch.tensor([False, False]), 2, 3, NO_DRAFT_PROBS=False)
    assert out.tolist() == [[1, 2, 9], [1, 1, PH]]


def test_random_without_draft_probs_uses_target_prob_alone():
    out = out_buffer(1, 1)
    rejection.rejection_random_sample_kernel(out, torch.tensor([1]), torch.tensor([2]), None,
                                      torch.tensor([[0.5, 0.3, 0.2]]), torch.tensor([7]), torch.tensor([0]),
                                      torch.tensor([0.25], dtype=torch.float64), torch.tensor([False]), 1, 3, True)
    assert out.tolist() == [[0, PH]]  # 0.2 < 0.25: rejected, recovered token 0


def test_expand_repeats_per_request_and_replaces():
    out = torch.empty(6, dtype=torch.int64)
    rejection.REJECTION_KERNELS["expand_kernel"][(3,)](out, torch.tensor([5, 0, 9]), torch.tensor([2, 5, 6]), 0, 4,
                                               MAX_NUM_TOKENS=128)
    assert out.tolist() == [5, 5, 4, 4, 4, 9]


def test_recovered_token_is_argmax_of_residual_over_noise():
    target = torch.tensor([[0.5, 0.3, 0.2], [0.1, 0.1, 0.8]])
    draft_probs = torch.tensor([[0.6, 0.1, 0.3], [0.1, 0.1, 0.8]])
    q = torch.ones(1, 3)
    out = torch.empty(2, dtype=torch.int64)
    rejection.sample_recovered_tokens_kernel(out, torch.tensor([2]), torch.tensor([0, 2]), draft_probs, target, q, 3, 4,
                                      False)
    assert out[0].item() == 1  # residual (0, 0.2, 0)
    out2 = torch.empty(1, dtype=torch.int64)
    rejection.sample_recovered_tokens_kernel(out2, torch.tensor([1]), torch.tensor([0]), None, target[:1], q, 3, 4, True)
    assert out2.item() == 1  # draft token 0 masked out


def test_eagle_next_token_padded_counts_valid_and_takes_last():
    sampled = torch.tensor([[4, 5, -1, -1], [-1, -1, -1, -1], [1, 2, 3, 600], [8, 9, 10, 11]])
    discard = torch.tensor([False, False, False, True])
    backup = torch.tensor([40, 41, 42, 43], dtype=torch.int32)
    nxt = torch.empty(4, dtype=torch.int32)
    valid = torch.empty(4, dtype=torch.int32)
    eagle.EAGLE_KERNELS["eagle_prepare_next_token_padded_kernel"][(4,)](
        sampled, discard, backup, nxt, valid, 512, 4, 4, sampled.stride(0), BLOCK_SIZE_TOKENS=4)
    assert nxt.tolist() == [5, 41, 3, 43]
    assert valid.tolist() == [2, 0, 3, 0]


def test_eagle_inputs_padded_token_index_and_rejections():
    cu = torch.tensor([3, 3, 5])
    valid = torch.tensor([2, 1, 3])
    qsl = torch.tensor([0, 4, 5, 8])
    idx = torch.empty(3, dtype=torch.int32)
    rej = torch.empty(3, dtype=torch.int32)
    eagle.EAGLE_KERNELS["eagle_prepare_inputs_padded_kernel"][(3,)](cu, valid, qsl, idx, rej, 3)
    assert rej.tolist() == [2, 0, 0]
    assert idx.tolist() == [1, 4, 7]


def test_stand_ins_count_launches_and_expose_kernel_arg_names():
    k = sd.TorchKernel(lambda a, b, FLAG: None, "k")
    assert k.arg_names == ["a", "b", "FLAG"]
    k[(1,)](1, 2, FLAG=True)
    assert k.launches == 1
    assert sd.kernel_arg_names(k) == ["a", "b", "FLAG"]
    assert sd.kernel_arg_names(lambda x, y: None) == ["x", "y"]


def test_triton_helpers_next_power_of_2_and_delegation():
    class Placeholder:
        language = "tl"

    h = sd.TritonHelpers(Placeholder())
    assert [h.next_power_of_2(n) for n in (0, 1, 2, 3, 4, 5, 512, 513)] == [1, 1, 2, 4, 4, 8, 512, 1024]
    assert h.language == "tl"
