"""What the Kimi-K2.5 units share: vLLM 0.15.x's own Kimi-K2.5 model class
(``vllm/model_executor/models/kimi_k25.py``) where it cannot be built without CUDA
(:mod:`.kimi_k25_device_without_cuda`) or without MLA (:mod:`.kimi_k25_load_unfused_qkv_a`).
vLLM 0.16 rewrote both places (``current_platform`` device, loading delegated to
``DeepseekV2ForCausalLM``): there they are not needed.

Both are no-ops where the stock code works: with CUDA, the device shim passes
straight through; with MLA (the fused projection exists) the loader passes every
weight to vLLM's own ``load_weights`` unchanged.
"""

from __future__ import annotations

KIMI = "vllm.model_executor.models.kimi_k25"
CLS = "KimiK25ForConditionalGeneration"
VLLM_015 = ">=0.15,<0.16"
