"""The first step of an EAGLE-3 draft, computed from its weight file with plain torch, as vLLM serves it:
the aux states of position t and the embedding of token t + 1 give the draft's guess for token t + 2.

Used by the doctor's ``targets`` check (what the draft learned to predict).  Written here, not imported
from speculators or vLLM, so that the check runs in any environment the doctor runs in (the draft's
trainer need not be installed).  On drafts stock speculators 0.9.0 trained on the real SmolLM2, its first
guesses agree with the target at 0.634 on held-out prompts, between the trainer's validation (0.710) and
vLLM's served first position (0.520): ``benchmarks/RESULTS.md``, #44 › The defect table, trained.  Covers the speculators layout (``fc``, ``layers.0.*``,
``norm``, ``lm_head``, ``d2t``) with speculators 0.9's ``norm_before_fc`` / ``fc_norm`` /
``norm_before_residual`` flags; another layout raises :class:`KeyError` naming the tensor.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any


def _rms(x: Any, weight: Any, eps: float) -> Any:
    return x * (x.pow(2).mean(-1, keepdim=True) + eps).rsqrt() * weight


def _rotate(x: Any, positions: Any, theta: float) -> Any:
    import torch

    half = x.shape[-1] // 2
    inv = 1.0 / theta ** (torch.arange(0, half, dtype=torch.float32) / half)
    ang = positions.float()[:, None] * inv[None, :]
    cos, sin = torch.cat([ang.cos(), ang.cos()], -1)[:, None], torch.cat([ang.sin(), ang.sin()], -1)[:, None]
    turned = torch.cat([-x[..., half:], x[..., :half]], -1)
    return x * cos + turned * sin


#: tensors the first step does not read (the draft shares the target's embedding): not loaded
UNUSED = ("embed_tokens.weight", "t2d")


def load_draft(draft: str | Path) -> dict[str, Any]:
    """The draft's tensors the first step reads (float32, ``d2t`` as int64) from every ``*.safetensors``
    file in ``draft``; the embedding (as large as the target's) and ``t2d`` are left on disk."""
    from safetensors import safe_open

    out: dict[str, Any] = {}
    for f in sorted(Path(draft).glob("*.safetensors")):
        with safe_open(str(f), framework="pt") as h:
            for k in h.keys():
                if not k.endswith(UNUSED):
                    v = h.get_tensor(k)
                    out[k] = v.long() if not v.is_floating_point() else v.float()
    return out


def first_guesses(w: dict[str, Any], cfg: dict[str, Any], aux: Any, ids: Any, embed: Any) -> Any:
    """Token ids the draft guesses at its first step: ``aux`` [T, k*H] (the served aux states, in
    order), ``ids`` [T] the token ids, ``embed`` the target's input embedding [V, H] (the draft shares
    it).  Row t of the result is the guess for token t + 2 from the states of t and the token t + 1;
    the last row has no next token and is dropped ([T - 1])."""
    import torch

    with torch.no_grad():
        best = first_logits(w, cfg, aux, ids, embed).argmax(-1)
    return best + w["d2t"][best] if "d2t" in w else best


def first_logits(w: dict[str, Any], cfg: dict[str, Any], aux: Any, ids: Any, embed: Any) -> Any:
    """The draft's first-step logits over its own vocabulary [T - 1, V_draft] (see :func:`first_guesses`);
    differentiable in ``w`` (the doctor's tests train small drafts with it)."""
    import torch

    layer = cfg.get("transformer_layer_config") or cfg
    eps = float(layer.get("rms_norm_eps", 1e-6))
    nh, nkv = int(layer["num_attention_heads"]), int(layer["num_key_value_heads"])
    hd = int(layer.get("head_dim") or int(layer["hidden_size"]) // nh)
    theta = float((layer.get("rope_parameters") or {}).get("rope_theta") or layer.get("rope_theta") or 10000.0)
    p = "layers.0."
    x = aux[:-1].float()
    if cfg.get("norm_before_fc") and "input_norm.weight" in w:
        x = _rms(x, w["input_norm.weight"], eps)
    elif cfg.get("fc_norm"):
        parts = x.chunk(sum(1 for k in w if k.startswith("fc_norm.")), -1)
        x = torch.cat([_rms(c, w[f"fc_norm.{i}.weight"], eps) for i, c in enumerate(parts)], -1)
    h = x @ w["fc.weight"].T
    e = _rms(embed[ids[1:]].float(), w[p + "input_layernorm.weight"], eps)
    hn = _rms(h, w[p + "hidden_norm.weight"], eps)
    residual = hn if cfg.get("norm_before_residual") else h
    z = torch.cat([e, hn], -1)
    t = z.shape[0]
    pos = torch.arange(t)
    q = _rotate((z @ w[p + "self_attn.q_proj.weight"].T).view(t, nh, hd), pos, theta)
    k = _rotate((z @ w[p + "self_attn.k_proj.weight"].T).view(t, nkv, hd), pos, theta)
    v = (z @ w[p + "self_attn.v_proj.weight"].T).view(t, nkv, hd)
    k, v = k.repeat_interleave(nh // nkv, 1), v.repeat_interleave(nh // nkv, 1)
    att = torch.nn.functional.scaled_dot_product_attention(q.transpose(0, 1), k.transpose(0, 1), v.transpose(0, 1),
                                                           is_causal=True)
    h = att.transpose(0, 1).reshape(t, nh * hd) @ w[p + "self_attn.o_proj.weight"].T + residual
    m = _rms(h, w[p + "post_attention_layernorm.weight"], eps)
    act = torch.nn.functional.silu(m @ w[p + "mlp.gate_proj.weight"].T) * (m @ w[p + "mlp.up_proj.weight"].T)
    h = act @ w[p + "mlp.down_proj.weight"].T + h
    return _rms(h, w["norm.weight"], eps) @ w["lm_head.weight"].T
