"""Torch stand-ins for vLLM's speculative-decoding Triton kernels (CPU platform).

vLLM launches these kernels as ``kernel[grid](*args, **kwargs)``; on a machine
without a GPU Triton is disabled and the launch raises.  Each stand-in here has
the kernel's parameter names (the patch checks they still match) and writes the
same output buffers with plain tensor operations, one request at a time - the
batches a CPU engine runs are small, and clarity beats speed here.

Semantics (written from the kernels' documented contracts):

* greedy rejection: per request, copy the target's argmax for each draft
  position until the first mismatch (inclusive); if none mismatched, append the
  bonus token.
* random rejection: accept draft token ``t`` at a position while
  ``p_target(t) / p_draft(t) >= u`` (``p_draft = 1`` without draft probs);
  at the first rejection write the recovered token; if all accepted, append
  the bonus token.
* recovered token: ``argmax(max(p_target - p_draft, 0) / q)`` with ``q`` the
  request's exponential noise (without draft probs: ``p_target`` with the
  draft token masked out).
* expand: repeat each request's value over its token span, replacing
  ``replace_from`` with ``replace_to``.
* EAGLE padded batch: the number of valid sampled tokens (not -1, inside the
  vocabulary) and the last valid one per request (or the backup token for
  discarded requests / none valid); the token index to sample from and the
  rejected-token count per request.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any


class TorchKernel:
    """Launchable like a Triton kernel: ``k[grid](*args, **kwargs)`` calls ``fn``."""

    def __init__(self, fn: Callable[..., None], name: str) -> None:
        self.fn = fn
        self.__name__ = name
        self.__wrapped__ = fn
        self.arg_names = list(inspect.signature(fn).parameters)
        self.launches = 0

    def __getitem__(self, grid: Any) -> Callable[..., None]:
        def launch(*args: Any, **kwargs: Any) -> None:
            self.launches += 1
            self.fn(*args, **kwargs)

        return launch

    def __repr__(self) -> str:
        return f"<spec_compat TorchKernel {self.__name__}>"


def kernel_arg_names(kernel: Any) -> list[str] | None:
    """Parameter names of a Triton ``JITFunction`` or of the plain function vLLM
    leaves behind when Triton is disabled; None if neither can be read."""
    names = getattr(kernel, "arg_names", None)
    if names is not None:
        return list(names)
    fn = getattr(kernel, "fn", kernel)
    try:
        return list(inspect.signature(fn).parameters)
    except (TypeError, ValueError):
        return None


class TritonHelpers:
    """Stands in for a module's ``triton`` name where Triton is disabled: vLLM's
    placeholder module lacks the host-side helper ``next_power_of_2`` that the
    launch sites call before launching; everything else is delegated."""

    def __init__(self, placeholder: Any) -> None:
        self._placeholder = placeholder

    @staticmethod
    def next_power_of_2(n: int) -> int:
        n = int(n)
        return 1 if n <= 1 else 1 << (n - 1).bit_length()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._placeholder, name)


def _spans(cu_num_tokens: Any) -> list[tuple[int, int]]:
    ends = [int(x) for x in cu_num_tokens.tolist()]
    starts = [0, *ends[:-1]]
    return list(zip(starts, ends))


def rejection_greedy_sample_kernel(
    output_token_ids_ptr: Any, cu_num_draft_tokens_ptr: Any, draft_token_ids_ptr: Any,
    target_argmax_ptr: Any, bonus_token_ids_ptr: Any, is_greedy_ptr: Any, max_spec_len: int,
) -> None:
    out = output_token_ids_ptr
    draft = draft_token_ids_ptr.tolist()
    target = target_argmax_ptr.tolist()
    greedy = None if is_greedy_ptr is None else is_greedy_ptr.tolist()
    bonus = bonus_token_ids_ptr.reshape(-1).tolist()
    for req, (start, end) in enumerate(_spans(cu_num_draft_tokens_ptr)):
        if greedy is not None and not greedy[req]:
            continue
        rejected = False
        for pos in range(end - start):
            out[req, pos] = target[start + pos]
            if draft[start + pos] != target[start + pos]:
                rejected = True
                break
        if not rejected:
            out[req, end - start] = bonus[req]


def rejection_random_sample_kernel(
    output_token_ids_ptr: Any, cu_num_draft_tokens_ptr: Any, draft_token_ids_ptr: Any,
    draft_probs_ptr: Any, target_probs_ptr: Any, bonus_token_ids_ptr: Any, recovered_token_ids_ptr: Any,
    uniform_probs_ptr: Any, is_greedy_ptr: Any, max_spec_len: int, vocab_size: int, NO_DRAFT_PROBS: bool,
) -> None:
    out = output_token_ids_ptr
    draft = draft_token_ids_ptr.tolist()
    greedy = is_greedy_ptr.tolist()
    bonus = bonus_token_ids_ptr.reshape(-1).tolist()
    recovered = recovered_token_ids_ptr.tolist()
    uniform = uniform_probs_ptr.tolist()
    for req, (start, end) in enumerate(_spans(cu_num_draft_tokens_ptr)):
        if greedy[req]:
            continue
        rejected = False
        for pos in range(end - start):
            i = start + pos
            tok = draft[i]
            p_draft = 1.0 if NO_DRAFT_PROBS else float(draft_probs_ptr[i, tok])
            p_target = float(target_probs_ptr[i, tok])
            if p_draft > 0 and p_target / p_draft >= uniform[i]:
                out[req, pos] = tok
            else:
                out[req, pos] = recovered[i]
                rejected = True
                break
        if not rejected:
            out[req, end - start] = bonus[req]


def expand_kernel(
    output_ptr: Any, input_ptr: Any, cu_num_tokens_ptr: Any, replace_from: Any, replace_to: Any,
    MAX_NUM_TOKENS: int,
) -> None:
    for req, (start, end) in enumerate(_spans(cu_num_tokens_ptr)):
        value = input_ptr[req]
        if bool(value == replace_from):
            value = replace_to
        output_ptr[start:end] = value


def sample_recovered_tokens_kernel(
    output_token_ids_ptr: Any, cu_num_draft_tokens_ptr: Any, draft_token_ids_ptr: Any, draft_probs_ptr: Any,
    target_probs_ptr: Any, q_ptr: Any, vocab_size: int, PADDED_VOCAB_SIZE: int, NO_DRAFT_PROBS: bool,
) -> None:
    for req, (start, end) in enumerate(_spans(cu_num_draft_tokens_ptr)):
        for i in range(start, end):
            prob = target_probs_ptr[i, :vocab_size].clone()
            if NO_DRAFT_PROBS:
                prob[int(draft_token_ids_ptr[i])] = 0
            else:
                prob = (prob - draft_probs_ptr[i, :vocab_size]).clamp_min(0)
            output_token_ids_ptr[i] = (prob / q_ptr[req, :vocab_size]).argmax()


def eagle_prepare_next_token_padded_kernel(
    sampled_token_ids_ptr: Any, discard_request_mask_ptr: Any, backup_next_token_ids_ptr: Any,
    next_token_ids_ptr: Any, valid_sampled_tokens_count_ptr: Any, vocab_size: int,
    num_sampled_tokens_per_req: int, num_reqs: int, stride_sampled_token_ids: int, BLOCK_SIZE_TOKENS: int,
) -> None:
    rows = sampled_token_ids_ptr[:num_reqs, :num_sampled_tokens_per_req]
    valid = (rows != -1) & (rows < vocab_size)
    discarded = discard_request_mask_ptr[:num_reqs].tolist()
    for req in range(num_reqs):
        idx = valid[req].nonzero().flatten()
        if discarded[req] or idx.numel() == 0:
            next_token_ids_ptr[req] = backup_next_token_ids_ptr[req]
            valid_sampled_tokens_count_ptr[req] = 0 if discarded[req] else int(idx.numel())
        else:
            next_token_ids_ptr[req] = rows[req, int(idx[-1])]
            valid_sampled_tokens_count_ptr[req] = int(idx.numel())


def eagle_prepare_inputs_padded_kernel(
    cu_num_draft_tokens_ptr: Any, valid_sampled_tokens_count_ptr: Any, query_start_loc_gpu_ptr: Any,
    token_indices_to_sample_ptr: Any, num_rejected_tokens_gpu_ptr: Any, num_reqs: int,
) -> None:
    spans = _spans(cu_num_draft_tokens_ptr[:num_reqs])
    for req, (start, end) in enumerate(spans):
        n_draft = end - start
        rejected = n_draft + 1 - int(valid_sampled_tokens_count_ptr[req]) if n_draft > 0 else 0
        last = int(query_start_loc_gpu_ptr[req + 1]) - 1
        token_indices_to_sample_ptr[req] = last - rejected
        num_rejected_tokens_gpu_ptr[req] = rejected


REJECTION_KERNELS = {
    name: TorchKernel(fn, name)
    for name, fn in (("rejection_greedy_sample_kernel", rejection_greedy_sample_kernel),
                     ("rejection_random_sample_kernel", rejection_random_sample_kernel),
                     ("expand_kernel", expand_kernel),
                     ("sample_recovered_tokens_kernel", sample_recovered_tokens_kernel))
}
EAGLE_KERNELS = {
    name: TorchKernel(fn, name)
    for name, fn in (("eagle_prepare_next_token_padded_kernel", eagle_prepare_next_token_padded_kernel),
                     ("eagle_prepare_inputs_padded_kernel", eagle_prepare_inputs_padded_kernel))
}
