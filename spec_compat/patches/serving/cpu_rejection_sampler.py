"""CPU speculative decoding on vLLM 0.15/0.16 (platform ``cpu`` only), inside vLLM's workers: the
Triton kernels of the rejection sampler, as torch stand-ins (their machinery: ``_cpu_spec_decode.py``).

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
"""

from __future__ import annotations

from typing import Any

from ...core.proof import Proof, SERVING
from ...core.registry import register
from ._cpu_spec_decode import VLLM_CPU_SPEC, TorchKernel, _spans, _TorchKernels


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


REJECTION_KERNELS = {
    name: TorchKernel(fn, name)
    for name, fn in (("rejection_greedy_sample_kernel", rejection_greedy_sample_kernel),
                     ("rejection_random_sample_kernel", rejection_random_sample_kernel),
                     ("expand_kernel", expand_kernel),
                     ("sample_recovered_tokens_kernel", sample_recovered_tokens_kernel))
}


@register
class CpuRejectionSampler(_TorchKernels):
    """Serving on CPU: vLLM 0.15/0.16 ``v1/sample/rejection_sampler.py`` launches Triton-only kernels
    (greedy/random rejection, expand, recovered tokens); on CPU Triton is disabled and the first
    verification step raises - loud: ``TypeError: 'function' object is not subscriptable``."""

    id = "cpu-rejection-sampler"
    proof = Proof("fails", SERVING, r"rejection_greedy_sample_kernel\[\(batch_size,\)\]\(.*\n(?:  .*\n)*TypeError: .function. object is not subscriptable", using="llama")
    summary = "rejection sampling kernels run as torch code on the CPU platform"
    upstream = "vLLM 0.15/0.16 v1/sample/rejection_sampler.py: rejection_*_kernel[grid] are Triton-only"
    target = "vllm.v1.sample.rejection_sampler:rejection_greedy_sample_kernel"
    requires = {"vllm": VLLM_CPU_SPEC}
    side = "worker"

    def _kernels(self) -> dict[str, Any]:
        return REJECTION_KERNELS
