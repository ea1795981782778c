"""The Kimi-K2.5 fixture's text model as transformers 5 builds it, for a reference forward.

``spec_compat.verify.reference`` loads the ``language_model.*`` weights into a transformers
``DeepseekV3ForCausalLM`` with ``load_state_dict``; transformers 5 keeps a MoE layer's experts as
fused tensors (``experts.gate_up_proj`` / ``experts.down_proj``), which only its ``from_pretrained``
converts from per-expert checkpoints.  Here the text weights and ``text_config`` are written to a
scratch checkpoint and loaded through ``from_pretrained``; every tensor must be used.
(To move into spec_compat.verify.reference when its recorded proofs are next re-recorded.)
"""

from __future__ import annotations

import json
import tempfile
from pathlib import Path
from typing import Any

PREFIX = "language_model."


def kimi_text_model_tf5(model_dir: str | Path, dtype: str = "float32") -> Any:
    import torch
    from safetensors.torch import load_file, save_file
    from transformers import DeepseekV3Config, DeepseekV3ForCausalLM

    src = Path(model_dir)
    config = json.loads((src / "config.json").read_text())
    state = {}
    for f in sorted(src.glob("*.safetensors")):
        for name, tensor in load_file(str(f)).items():
            if name.startswith(PREFIX):
                state[name[len(PREFIX):]] = tensor.contiguous()
    with tempfile.TemporaryDirectory(prefix="kimi-text-") as tmp:
        DeepseekV3Config(**config["text_config"]).save_pretrained(tmp)
        save_file(state, str(Path(tmp) / "model.safetensors"))
        model, info = DeepseekV3ForCausalLM.from_pretrained(tmp, dtype=getattr(torch, dtype),
                                                            attn_implementation="eager", output_loading_info=True)
    unused = {k: v for k, v in info.items() if v and k in ("missing_keys", "unexpected_keys", "mismatched_keys")}
    if unused:
        raise ValueError(f"{model_dir}: text weights do not load into transformers 5's DeepseekV3: {unused}")
    model.eval()
    return model


def reference_model(model_dir: str | Path, dtype: str = "float32") -> Any:
    """``load_reference_model``, except a Kimi-K2.5 checkpoint under transformers 5."""
    from spec_compat.core.versions import installed_version, release_of
    from spec_compat.verify.reference import load_reference_model

    config = json.loads((Path(model_dir) / "config.json").read_text())
    if config.get("model_type") == "kimi_k25" and release_of(installed_version("transformers") or "0").major >= 5:
        return kimi_text_model_tf5(model_dir, dtype)
    return load_reference_model(str(model_dir), dtype)
