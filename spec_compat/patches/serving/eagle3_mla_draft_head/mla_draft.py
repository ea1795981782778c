"""An EAGLE-3 draft head with DeepSeek MLA attention, for vLLM 0.15/0.16 (which have none).

Written from the head's contract (TorchSpec's ``Eagle3DeepseekV2ForCausalLM`` checkpoints; vLLM
serves the same format natively from later releases): one or more decoder layers whose first
attention reads ``[input_layernorm(embeds), hidden_norm(fused aux states)]`` (2 x hidden wide)
through DeepSeek's low-rank query / latent key-value projections, a dense SiLU MLP, a final norm
and an LM head over the (possibly pruned, ``d2t``) draft vocabulary.  Weight names as saved:
``midlayer.*`` (or ``layers.N.*``), ``fc``, ``norm``, ``lm_head``, ``embed_tokens``, ``d2t``/``t2d``.

Attention is vLLM's expanded (non-latent) DeepSeek attention: the same function as the latent
form, computed with per-head keys and values, which every attention backend serves (the draft's
model config is not an MLA model config in these releases, so the latent backends are not chosen
for it).  vLLM imports this module by name (``ModelRegistry``), never ``import spec_compat``.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import torch
from torch import nn
from vllm.config import VllmConfig, get_current_vllm_config
from vllm.model_executor.layers.layernorm import RMSNorm
from vllm.model_executor.layers.linear import ColumnParallelLinear, ReplicatedLinear
from vllm.model_executor.layers.logits_processor import LogitsProcessor
from vllm.model_executor.layers.vocab_parallel_embedding import ParallelLMHead, VocabParallelEmbedding
from vllm.model_executor.model_loader.weight_utils import default_weight_loader
from vllm.model_executor.models.deepseek_v2 import DeepseekV2Attention, DeepseekV2MLP
from vllm.model_executor.models.llama_eagle3 import Eagle3LlamaForCausalLM
from vllm.model_executor.models.utils import get_draft_quant_config, maybe_prefix

from .._eagle3_norms import add_input_norms, fed_back, normed_aux_states
from ....shims.draft_heads import aux_count

#: checkpoint name -> (vLLM parameter, shard) for the MLP's fused gate/up projection
_STACKED = ((".gate_proj", ".gate_up_proj", 0), (".up_proj", ".gate_up_proj", 1))


class MlaEagle3Layer(nn.Module):
    """One draft decoder layer; layer 0 attends over the 2 x hidden concatenation."""

    def __init__(self, vllm_config: VllmConfig, config: Any, prefix: str, layer_idx: int) -> None:
        super().__init__()
        quant = get_draft_quant_config(vllm_config)
        hidden = config.hidden_size
        self.layer_idx = layer_idx
        q_lora = getattr(config, "q_lora_rank", None)
        self.self_attn = DeepseekV2Attention(
            vllm_config=vllm_config, config=config, hidden_size=hidden,
            num_heads=config.num_attention_heads, qk_nope_head_dim=config.qk_nope_head_dim,
            qk_rope_head_dim=config.qk_rope_head_dim, v_head_dim=config.v_head_dim,
            q_lora_rank=q_lora, kv_lora_rank=config.kv_lora_rank,
            max_position_embeddings=getattr(config, "max_position_embeddings", 8192),
            cache_config=vllm_config.cache_config, quant_config=quant, prefix=f"{prefix}.self_attn")
        if layer_idx == 0:  # the first layer's projections read [embeds, hidden]: twice as wide
            attn, wide = self.self_attn, 2 * hidden
            if q_lora is not None:
                attn.q_a_proj = ReplicatedLinear(wide, q_lora, bias=False, quant_config=quant,
                                                 prefix=f"{prefix}.self_attn.q_a_proj")
            else:
                attn.q_proj = ColumnParallelLinear(wide, attn.num_heads * attn.qk_head_dim, bias=False,
                                                   quant_config=quant, prefix=f"{prefix}.self_attn.q_proj")
            attn.kv_a_proj_with_mqa = ReplicatedLinear(wide, attn.kv_lora_rank + attn.qk_rope_head_dim, bias=False,
                                                       quant_config=quant,
                                                       prefix=f"{prefix}.self_attn.kv_a_proj_with_mqa")
        self.mlp = DeepseekV2MLP(hidden_size=hidden, intermediate_size=config.intermediate_size,
                                 hidden_act=config.hidden_act, quant_config=quant, prefix=f"{prefix}.mlp")
        eps = config.rms_norm_eps
        self.input_layernorm = RMSNorm(hidden, eps=eps)
        self.hidden_norm = RMSNorm(hidden, eps=eps)
        self.post_attention_layernorm = RMSNorm(hidden, eps=eps)
        self.norm_before_residual = bool(getattr(config, "norm_before_residual", False))

    def forward(self, positions: torch.Tensor, embeds: torch.Tensor, hidden_states: torch.Tensor,
                residual: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
        if self.layer_idx == 0:
            embeds = self.input_layernorm(embeds)
            if self.norm_before_residual:
                hidden_states = self.hidden_norm(hidden_states)
                residual = hidden_states
            else:
                residual = hidden_states
                hidden_states = self.hidden_norm(hidden_states)
            hidden_states = torch.cat([embeds, hidden_states], dim=-1)
        else:
            hidden_states, residual = self.input_layernorm(hidden_states, residual)
        hidden_states = self.self_attn(positions=positions, hidden_states=hidden_states, llama_4_scaling=None)
        hidden_states, residual = self.post_attention_layernorm(hidden_states, residual)
        return self.mlp(hidden_states), residual


class MlaEagle3Model(nn.Module):
    """Embedding, the draft layers, the aux-state fusion ``fc`` (with the input norms the config
    names: speculators' / TorchSpec's ``fc_norm``, ``norm_before_fc``) and the final norm."""

    def __init__(self, *, vllm_config: VllmConfig, start_layer_id: int = 0, prefix: str = "") -> None:
        super().__init__()
        self.config = cfg = vllm_config.speculative_config.draft_model_config.hf_config
        self.use_aux_hidden_state = True
        current = get_current_vllm_config()
        self.embed_tokens = VocabParallelEmbedding(cfg.vocab_size, cfg.hidden_size,
                                                   prefix=maybe_prefix(prefix, "embed_tokens"))
        self.layers = nn.ModuleList([
            MlaEagle3Layer(current, cfg, maybe_prefix(prefix, f"layers.{i + start_layer_id}"), i)
            for i in range(cfg.num_hidden_layers)])
        self.start_layer_id = start_layer_id
        target_hidden = int(getattr(cfg, "target_hidden_size", None) or cfg.hidden_size)
        self.fc = ReplicatedLinear(input_size=target_hidden * aux_count(cfg), output_size=cfg.hidden_size,
                                   bias=False, params_dtype=vllm_config.model_config.dtype,
                                   quant_config=get_draft_quant_config(vllm_config),
                                   prefix=maybe_prefix(prefix, "fc"), return_bias=False)
        self.norm = RMSNorm(cfg.hidden_size, eps=cfg.rms_norm_eps)
        add_input_norms(self, RMSNorm, nn.ModuleList)

    def embed_input_ids(self, input_ids: torch.Tensor) -> torch.Tensor:
        return self.embed_tokens(input_ids)

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor, hidden_states: torch.Tensor,
                input_embeds: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        if input_embeds is None:
            input_embeds = self.embed_input_ids(input_ids)
        residual = None
        for layer in self.layers:
            hidden_states, residual = layer(positions, input_embeds, hidden_states, residual)
        return fed_back(self, self.norm(hidden_states, residual))

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> set[str]:
        params = dict(self.named_parameters())
        loaded: set[str] = set()
        for name, tensor in weights:
            name = name.replace("midlayer.", "layers.0.")
            for src, dst, shard in _STACKED:
                if src in name:
                    name = name.replace(src, dst)
                    params[name].weight_loader(params[name], tensor, shard)
                    break
            else:
                if name not in params:
                    raise KeyError(f"spec_compat[eagle3-mla-draft-head]: the MLA draft checkpoint holds {name!r}, which this "
                                   f"head does not have (its parameters: {', '.join(sorted(params))})")
                param = params[name]
                getattr(param, "weight_loader", default_weight_loader)(param, tensor)
            loaded.add(name)
        return loaded


class Eagle3DeepseekMlaForCausalLM(Eagle3LlamaForCausalLM):
    """The draft as vLLM's EAGLE-3 proposer drives it: vLLM's own EAGLE-3 head (its vocabulary
    mapping, logits, weight routing) around :class:`MlaEagle3Model`."""

    def __init__(self, *, vllm_config: VllmConfig, prefix: str = "") -> None:
        nn.Module.__init__(self)
        self.config = cfg = vllm_config.speculative_config.draft_model_config.hf_config
        if getattr(cfg, "draft_vocab_size", None) is None:
            cfg.draft_vocab_size = cfg.vocab_size
        target_layers = vllm_config.model_config.get_num_layers(vllm_config.parallel_config)
        cfg.target_layer_count = target_layers
        self.model = MlaEagle3Model(vllm_config=vllm_config, prefix="model", start_layer_id=target_layers)
        self.lm_head = ParallelLMHead(cfg.draft_vocab_size, cfg.hidden_size, prefix=maybe_prefix(prefix, "lm_head"))
        self.logits_processor = LogitsProcessor(cfg.draft_vocab_size, scale=getattr(cfg, "logit_scale", 1.0))
        self.draft_id_to_target_id = nn.Parameter(torch.zeros(cfg.draft_vocab_size, dtype=torch.long),
                                                  requires_grad=False)
        self.use_parallel_drafting = False

    def combine_hidden_states(self, hidden_states: torch.Tensor) -> torch.Tensor:
        return self.model.fc(normed_aux_states(self.model, hidden_states))
