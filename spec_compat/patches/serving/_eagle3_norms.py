"""Shared by ``eagle3-speculators-norm-flags``, ``eagle3-draft-input-norms`` and
``eagle3-mla-draft-head``: EAGLE-3 drafts trained by speculators 0.9 (``norm_before_fc`` /
``fc_norm`` / ``norm_output``, on by default for ``norm_before_fc`` and ``norm_output``) served by
vLLM 0.15/0.16, whose speculators-config reader drops those fields and whose ``llama_eagle3`` draft
has no input norm: loading such a draft fails ("KeyError: 'input_norm.weight'").

The input norms and the output convention of such a draft, for a vLLM whose draft has neither:
speculators 0.9 trains EAGLE-3 drafts (by default) with ``norm_before_fc``: one RMSNorm over
the concatenated aux hidden states before ``fc`` (weight ``input_norm.weight``), or with
``fc_norm``: one RMSNorm per aux state (``fc_norm.<i>.weight``), and with ``norm_output``: the
post-norm hidden states, not the pre-norm ones, are fed back to the next draft step.

:func:`add_input_norms` builds the modules on a draft model, :func:`normed_aux_states` applies
them before ``fc``, :func:`fed_back` picks what the next step gets.  (The config fields reach the
draft through ``eagle3_speculators_norm_flags.py``.)
"""

from __future__ import annotations

from typing import Any

#: vLLM releases measured (0.16.0 and 0.15.1)
VLLM_NO_INPUT_NORM = ">=0.15,<0.17"
#: ``spec-compat evaluate`` of the draft stock ``speculators train`` 0.9.0 wrote, with the patch off
SPEC09_SERVING = "tests/server/test_speculators_pipeline.py::test_served_draft_fails_without_the_patch"
SYMPTOM = r"KeyError: 'input_norm\.weight'"


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
