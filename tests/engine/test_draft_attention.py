"""T3: the draft's attention without flex-attention backward (CPU) equals flex attention.

Masks are speculators' own (``create_combined_mask_mod`` over packed documents with
padding, then ``extend_mask_for_draft_tokens`` once per test-time-training step).
Forward: against ``flex_attention`` itself.  Backward: compiled flex attention has
none on CPU (what speculators 0.3.0's ``@torch.compile`` forward runs), so gradients
are checked against autograd through a plain softmax attention whose mask comes from
torch's own ``create_mask`` (independent of the shim's block-structure reading), and
with ``gradcheck`` in float64.
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("speculators")

from torch.nn.attention.flex_attention import create_block_mask, create_mask, flex_attention  # noqa: E402

import spec_compat  # noqa: E402,F401
from spec_compat.verify.compare import compare_identical, compare_states  # noqa: E402
from spec_compat.patches.training.draft_attention_without_flex_backward import dense_mask, sdpa_with_block_mask  # noqa: E402

T = 256  # two 128-token blocks
LENGTHS = [60, 100, 50]  # 210 tokens + 46 padding


def _masks():
    from speculators.models.eagle3.attention import create_combined_mask_mod, extend_mask_for_draft_tokens

    mod = create_combined_mask_mod(torch.tensor(LENGTHS), T)
    bm = create_block_mask(mod, B=None, H=None, Q_LEN=T, KV_LEN=T, device="cpu")
    out = [bm]
    for _ in range(2):
        bm = extend_mask_for_draft_tokens(bm)
        out.append(bm)
    return mod, out


def _qkv(kv_len, dtype, heads=4, kv_heads=2, dim=16, seed=0):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(1, heads, T, dim, generator=g, dtype=dtype)
    k = torch.randn(1, kv_heads, kv_len, dim, generator=g, dtype=dtype)
    v = torch.randn(1, kv_heads, kv_len, dim, generator=g, dtype=dtype)
    return q, k, v


@pytest.mark.parametrize("dtype,tol", [(torch.float64, 1e-12), (torch.float32, 2e-6)])
def test_forward_equals_flex_attention(dtype, tol):
    _mod, masks = _masks()
    for step, bm in enumerate(masks):
        q, k, v = _qkv(T * (step + 1), dtype, seed=step)
        ref = flex_attention(q, k, v, block_mask=bm, enable_gqa=True, scale=0.25)
        got = sdpa_with_block_mask(q, k, v, bm, scale=0.25, enable_gqa=True)
        c = compare_states(got, ref, tolerance=tol)
        assert c, f"ttt step {step}: {c.detail}"


def test_dense_mask_matches_torch_create_mask_and_the_draft_diagonals():
    mod, masks = _masks()
    assert compare_identical(dense_mask(masks[0], T, T)[0, 0], create_mask(mod, None, None, T, T, device="cpu")[0, 0])
    ext = dense_mask(masks[2], T, 3 * T)[0, 0]
    q = torch.arange(T)
    for step in (1, 2):
        block = ext[:, step * T:(step + 1) * T]
        # every query - padding included - sees exactly its own draft token of that step
        assert compare_identical(block, torch.diag(torch.ones(T, dtype=torch.bool))), step
    # causal within documents, nothing across them
    assert ext[100, 70] and ext[30, 0] and not ext[70, 30] and not ext[70, 100]
    assert ext[q, q].all()


def _reference_attention(q, k, v, mask, scale):
    rep = q.shape[1] // k.shape[1]
    k = k.repeat_interleave(rep, dim=1)
    v = v.repeat_interleave(rep, dim=1)
    scores = (q @ k.transpose(-1, -2)) * scale
    scores = scores.masked_fill(~mask, float("-inf"))
    return torch.softmax(scores, dim=-1) @ v


def test_backward_equals_autograd_of_plain_attention():
    mod, masks = _masks()
    bm = masks[0]
    mask = create_mask(mod, None, None, T, T, device="cpu")
    q, k, v = (t.requires_grad_() for t in _qkv(T, torch.float64, seed=3))
    out = sdpa_with_block_mask(q, k, v, bm, scale=0.25, enable_gqa=True)
    w = torch.randn_like(out)
    grads = torch.autograd.grad((out * w).sum(), (q, k, v))
    q2, k2, v2 = (t.detach().clone().requires_grad_() for t in (q, k, v))
    ref = _reference_attention(q2, k2, v2, mask, 0.25)
    ref_grads = torch.autograd.grad((ref * w).sum(), (q2, k2, v2))
    for a, b in zip(grads, ref_grads, strict=True):
        c = compare_states(a, b, tolerance=1e-10)
        assert c, c.detail


def test_gradcheck_extended_mask():
    _mod, masks = _masks()
    bm = masks[1]
    g = torch.Generator().manual_seed(5)
    q = torch.randn(1, 2, T, 4, generator=g, dtype=torch.float64, requires_grad=True)
    k = torch.randn(1, 1, 2 * T, 4, generator=g, dtype=torch.float64, requires_grad=True)
    v = torch.randn(1, 1, 2 * T, 4, generator=g, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda a, b, c: sdpa_with_block_mask(a, b, c, bm, scale=0.5, enable_gqa=True),
                                    (q, k, v), eps=1e-6, atol=1e-5, fast_mode=True)


def test_registered_attention_is_the_fallback_on_cpu():
    from speculators.models.eagle3 import attention

    rec = {r.id: r for r in spec_compat.records()}["draft-attention-without-flex-backward"]
    if rec.status.value != "applied":
        pytest.skip(f"patch is {rec.status.value}: {rec.reason}")
    fn = attention.ALL_ATTENTION_FUNCTIONS["simple_flex_attention"]
    _mod, masks = _masks()
    q, k, v = (t.requires_grad_() for t in _qkv(T, torch.float32))
    out, _ = fn(None, q, k, v, masks[0], scaling=0.25)
    out.sum().backward()  # flex attention itself has no CPU backward
    assert q.grad is not None and torch.isfinite(q.grad).all()
    ref = flex_attention(q.detach(), k.detach(), v.detach(), block_mask=masks[0], enable_gqa=True, scale=0.25)
    c = compare_states(out.detach(), ref.transpose(1, 2), tolerance=2e-6)
    assert c, c.detail


def test_compiled_flex_attention_has_no_cpu_backward_but_the_fallback_does():
    """Why the shim exists: speculators 0.3.0 compiles the draft's forward unconditionally."""
    _mod, masks = _masks()
    bm = masks[0]
    q, k, v = (t.requires_grad_() for t in _qkv(T, torch.float32, heads=2, kv_heads=2, seed=7))
    flex = torch.compile(lambda a, b, c: flex_attention(a, b, c, block_mask=bm, scale=0.25))
    from torch._inductor.exc import InductorError

    with pytest.raises(InductorError):  # torch 2.8 / 2.10: inductor cannot lower flex attention on CPU
        flex(q, k, v).sum().backward()
    q.grad = k.grad = v.grad = None
    fallback = torch.compile(lambda a, b, c: sdpa_with_block_mask(a, b, c, bm, scale=0.25))
    fallback(q, k, v).sum().backward()
    q2, k2, v2 = (t.detach().clone().requires_grad_() for t in (q, k, v))
    flex_attention(q2, k2, v2, block_mask=bm, scale=0.25).sum().backward()  # eager flex: CPU backward exists
    for a, b in ((q.grad, q2.grad), (k.grad, k2.grad), (v.grad, v2.grad)):
        c = compare_states(a, b, tolerance=1e-5)
        assert c, c.detail
