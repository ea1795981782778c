"""A trained speculators-format EAGLE-3 draft written again as an SGLang / TorchSpec head
(``LlamaForCausalLMEagle3``, ``midlayer.*`` weights, its layers named in ``eagle_config`` as layer
*outputs*): the same weights in the other framework's format, for the aux-id convention tests and
``benchmarks/head_conventions.py``.  Works on the drafts speculators 0.3 and 0.9 save."""

from __future__ import annotations

import json
from pathlib import Path

#: LlamaConfig keys an SGLang / TorchSpec head config carries (TorchSpec's kimi_k25_eagle3.json)
LLAMA_KEYS = ("hidden_size", "intermediate_size", "num_attention_heads", "num_key_value_heads", "head_dim",
              "hidden_act", "rms_norm_eps", "rope_theta", "rope_scaling", "max_position_embeddings", "vocab_size",
              "attention_bias", "bos_token_id", "eos_token_id")
#: the norm flags speculators trains with (TorchSpec heads carry the same keys)
NORM_KEYS = ("norm_before_fc", "fc_norm", "norm_output", "norm_before_residual")


def as_sglang_head(draft: Path, out: Path) -> list[int]:
    """Write ``draft`` (speculators format, ids in vLLM's input convention) to ``out`` as an SGLang /
    TorchSpec head; returns its ``eagle_config`` ids (each one less: input of layer i = output of i - 1)."""
    from safetensors.torch import load_file, save_file

    cfg = json.loads((draft / "config.json").read_text())
    layer = cfg["transformer_layer_config"]
    named = cfg.get("eagle_aux_hidden_state_layer_ids")
    if not named:
        raise ValueError(f"{draft} names no eagle_aux_hidden_state_layer_ids: its layers are vLLM's defaults")
    ids = [i - 1 for i in named]
    if min(ids) < 0:
        raise ValueError(f"{draft} reads the embeddings (id 0), which no layer's output names: {named}")
    head = {k: layer[k] for k in LLAMA_KEYS if k in layer}
    head.update(architectures=["LlamaForCausalLMEagle3"], model_type="llama", num_hidden_layers=1,
                tie_word_embeddings=False, draft_vocab_size=cfg["draft_vocab_size"],
                eagle_config={"eagle_aux_hidden_state_layer_ids": ids, "use_aux_hidden_state": True})
    head.update({k: cfg[k] for k in NORM_KEYS if k in cfg})
    out.mkdir(parents=True)
    tensors = {}
    for f in sorted(draft.glob("*.safetensors")):
        for name, t in load_file(str(f)).items():
            if not name.startswith("verifier_"):
                tensors[name.replace("layers.0.", "midlayer.")] = t
    save_file(tensors, str(out / "model.safetensors"))
    (out / "config.json").write_text(json.dumps(head, indent=2))
    return ids
