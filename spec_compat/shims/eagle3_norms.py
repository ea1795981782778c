"""The input norms and the output convention of an EAGLE-3 draft trained by speculators >= 0.9,
for a vLLM whose ``llama_eagle3`` draft has neither.

speculators 0.9 trains EAGLE-3 drafts (by default) with ``norm_before_fc``: one RMSNorm over
the concatenated aux hidden states before ``fc`` (weight ``input_norm.weight``), or with
``fc_norm``: one RMSNorm per aux state (``fc_norm.<i>.weight``), and with ``norm_output``: the
post-norm hidden states, not the pre-norm ones, are fed back to the next draft step.

:data:`FLAGS` are the config fields; :func:`add_input_norms` builds the modules on a draft
model, :func:`normed_aux_states` applies them before ``fc``, :func:`fed_back` picks what the
next step gets.
"""

from __future__ import annotations

from typing import Any

FLAGS = ("norm_before_fc", "fc_norm", "norm_output")


def carry_flags(config_dict: dict, pre_trained_config: dict) -> None:
    """Copy the flags a speculators config sets into the draft's transformers config dict."""
    for name in FLAGS:
        if name in config_dict and config_dict[name] is not None:
            pre_trained_config[name] = bool(config_dict[name])


def add_input_norms(model: Any, rms_norm: Any, module_list: Any) -> None:
    """Give ``model`` (the draft's decoder stack, with ``config`` and ``fc``) the norms its
    config asks for: ``input_norm`` over the fc input, or ``fc_norm`` (one per aux state)."""
    cfg = model.config
    before_fc = bool(getattr(cfg, "norm_before_fc", False))
    per_state = bool(getattr(cfg, "fc_norm", False))
    if before_fc and per_state:
        raise ValueError("spec_compat[eagle3-draft-input-norms]: norm_before_fc and fc_norm are mutually exclusive "
                         "(speculators' own rule)")
    model.norm_output = bool(getattr(cfg, "norm_output", False))
    model.input_norm = None
    model.fc_norm = None
    fc = getattr(model, "fc", None)
    if fc is None or not (before_fc or per_state):
        return
    fc_in = int(fc.input_size)
    target_hidden = int(getattr(cfg, "target_hidden_size", None) or cfg.hidden_size)
    if fc_in % target_hidden:
        raise ValueError(f"spec_compat[eagle3-draft-input-norms]: fc input size {fc_in} is not a multiple of the "
                         f"target hidden size {target_hidden}")
    if before_fc:
        model.input_norm = rms_norm(fc_in, eps=cfg.rms_norm_eps)
    else:
        model.fc_norm = module_list([rms_norm(target_hidden, eps=cfg.rms_norm_eps)
                                     for _ in range(fc_in // target_hidden)])


def normed_aux_states(model: Any, hidden_states: Any) -> Any:
    """The concatenated aux hidden states as the draft's ``fc`` was trained to see them."""
    import torch

    if getattr(model, "input_norm", None) is not None:
        hidden_states = model.input_norm(hidden_states)
    norms = getattr(model, "fc_norm", None)
    if norms is not None:
        chunks = hidden_states.chunk(len(norms), dim=-1)
        hidden_states = torch.cat([norm(c) for norm, c in zip(norms, chunks)], dim=-1)
    return hidden_states


def fed_back(model: Any, out: Any) -> Any:
    """The draft forward's ``(hidden_states, hidden_prenorm)``: with ``norm_output`` the next
    draft step gets the post-norm states (the second item), as speculators trained it."""
    if getattr(model, "norm_output", False) and isinstance(out, tuple) and len(out) == 2:
        return out[0], out[0]
    return out
