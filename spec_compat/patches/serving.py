"""Serving patches: an EAGLE-3 draft in vLLM's engine (BRIEF S1 and CPU speculative decoding).

Two groups, both acting inside vLLM (engine core and workers, through the plugin):

* S1 - EAGLE-3 for DeepSeek-V2/V3 and Kimi-K2.5 targets before vLLM 0.18: the
  speculative config's model-type allow-list, and the ``SupportsEagle3``
  capability (aux hidden states out of the decoder loop) on the DeepSeek model
  and the Kimi-K2.5 wrapper.
* CPU speculative decoding on vLLM 0.15/0.16 (platform ``cpu`` only): the CPU
  runner's refusal, its drafter loading, the CUDA-stream copies of draft tokens
  and the Triton kernels of the rejection sampler and of EAGLE's padded batch.
"""

from __future__ import annotations

import ast
import textwrap
from types import ModuleType
from typing import Any

from ..core.proof import Proof, SERVING
from ..core.registry import Changes, NotNeeded, Patch, TargetChanged, register
from . import _guards as g

CPU_RUNNER = "vllm.v1.worker.cpu_model_runner"
VLLM_CPU_SPEC = ">=0.15,<0.17"
VLLM_S1 = ">=0.15,<0.18"
DEEPSEEK_FAMILY = ("deepseek_v2", "deepseek_v3", "kimi_k2", "kimi_k25")


def _require_cpu_platform() -> None:
    from vllm.platforms import current_platform

    if not current_platform.is_cpu():
        raise NotNeeded(f"platform is {current_platform.device_name!r}, not cpu: vLLM's own path is used")


def _body(fn: Any, where: str) -> list[str]:
    """The statements of a function, normalised through ``ast.unparse``."""
    tree = ast.parse(textwrap.dedent(g.source(fn, where)))
    node = tree.body[0]
    if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
        raise TargetChanged(f"{where} is not a plain function")
    return [ast.unparse(stmt) for stmt in node.body]


# ---------------------------------------------------------------------------
# CPU speculative decoding (vLLM 0.15/0.16)


@register
class CpuRunnerSpeculativeConfig(Patch):
    """vLLM 0.15/0.16 ``v1/worker/cpu_model_runner.py:25`` asserts
    ``speculative_config is None``: every speculative method fails on CPU at
    engine start ("spec decode is not supported")."""

    id = "cpu-runner-speculative-config"
    proof = Proof("fails", SERVING, r"AssertionError: spec decode is not supported\.", using="llama")
    summary = "the CPU model runner is built with a speculative config (its other setup unchanged)"
    upstream = "vLLM 0.15/0.16 v1/worker/cpu_model_runner.py:25 assert self.speculative_config is None"
    target = f"{CPU_RUNNER}:CPUModelRunner"
    requires = {"vllm": VLLM_CPU_SPEC}
    side = "worker"

    EXPECTED = [
        "with _torch_cuda_wrapper():\n    super().__init__(vllm_config, device)",
        "assert device == torch.device('cpu')",
        "assert self.speculative_config is None, 'spec decode is not supported.'",
        "self.use_cuda_graph = False",
        "self.cascade_attn_enabled = False",
        "self._postprocess_tensors()",
    ]

    def check(self, module: ModuleType) -> None:
        cls = g.attr(module, "CPUModelRunner")
        body = _body(cls.__init__, "CPUModelRunner.__init__")
        if body != self.EXPECTED:
            raise TargetChanged("CPUModelRunner.__init__ is not the known 0.15/0.16 body: "
                                + " | ".join(s.replace("\n", " ") for s in body))
        g.has_attrs(module, CPU_RUNNER, "_torch_cuda_wrapper")

    def install(self, module: ModuleType, changes: Changes) -> None:
        import torch

        cls = module.CPUModelRunner
        base = cls.__mro__[1]

        def __init__(self: Any, vllm_config: Any, device: Any) -> None:
            with module._torch_cuda_wrapper():
                base.__init__(self, vllm_config, device)
            if device != torch.device("cpu"):
                raise ValueError(f"spec_compat[{CpuRunnerSpeculativeConfig.id}]: CPUModelRunner needs device cpu, "
                                 f"got {device}")
            self.use_cuda_graph = False
            self.cascade_attn_enabled = False
            self._postprocess_tensors()

        changes.setattr(cls, "__init__", __init__)


@register
class CpuRunnerLoadsDrafter(Patch):
    """vLLM 0.15/0.16 ``CPUModelRunner.load_model`` loads only the target: the
    GPU runner's drafter loading and EAGLE-3 aux-layer setup (gpu_model_runner
    ``load_model``) never run on CPU -> the drafter has no weights."""

    id = "cpu-runner-loads-drafter"
    proof = Proof("fails", SERVING, r"AssertionError: All drafting layers should belong to the same kv cache group", using="llama")
    summary = "CPUModelRunner.load_model also loads the drafter and sets the target's EAGLE-3 aux layers"
    upstream = "vLLM 0.15/0.16 v1/worker/cpu_model_runner.py load_model: no drafter.load_model / set_aux_hidden_state_layers"
    target = f"{CPU_RUNNER}:CPUModelRunner"
    requires = {"vllm": VLLM_CPU_SPEC}
    side = "worker"

    def check(self, module: ModuleType) -> None:
        cls = g.attr(module, "CPUModelRunner")
        src = g.source(cls.load_model, "CPUModelRunner.load_model")
        if "drafter" in src:
            raise TargetChanged("CPUModelRunner.load_model already handles a drafter")
        g.has_attrs(cls, "CPUModelRunner", "_get_eagle3_aux_layers_from_config", "get_model")

    def install(self, module: ModuleType, changes: Changes) -> None:
        import logging

        from vllm.model_executor.models.interfaces import supports_eagle3

        log = logging.getLogger("spec_compat")
        cls = module.CPUModelRunner
        orig = cls.load_model

        def load_model(self: Any, *args: Any, **kwargs: Any) -> Any:
            out = orig(self, *args, **kwargs)
            drafter = getattr(self, "drafter", None)
            if drafter is not None:
                drafter.load_model(self.model)
            if getattr(self, "use_aux_hidden_state_outputs", False):
                model = self.get_model()
                if not supports_eagle3(model):
                    raise RuntimeError(
                        f"spec_compat[{CpuRunnerLoadsDrafter.id}]: {type(model).__name__} does not collect "
                        "EAGLE-3 aux hidden states (no SupportsEagle3)")
                layers = self._get_eagle3_aux_layers_from_config() or model.get_eagle3_aux_hidden_state_layers()
                model.set_aux_hidden_state_layers(tuple(layers))
                log.info("spec_compat: EAGLE-3 aux hidden state layers %s on %s", list(layers), type(model).__name__)
            return out

        changes.setattr(cls, "load_model", load_model)


@register
class CpuDraftTokenCopy(Patch):
    """vLLM 0.15/0.16 ``gpu_model_runner.py`` ~3879/3910 copy draft tokens and
    valid-token counts to the host on a side CUDA stream; the CPU runner's
    stream placeholders have no ``wait_stream`` and there is no current stream."""

    id = "cpu-draft-token-copy"
    proof = Proof("fails", SERVING, r"in _copy_draft_token_ids_to_cpu\n(?:.*\n)*?.*RuntimeError: Found no NVIDIA driver on your system", using="llama")
    summary = "draft token ids and valid sampled counts are copied synchronously on the CPU runner"
    upstream = "vLLM 0.15/0.16 v1/worker/gpu_model_runner.py _copy_draft_token_ids_to_cpu / _copy_valid_sampled_token_count use torch.cuda.stream"
    target = f"{CPU_RUNNER}:CPUModelRunner"
    requires = {"vllm": VLLM_CPU_SPEC}
    side = "worker"

    def check(self, module: ModuleType) -> None:
        cls = g.attr(module, "CPUModelRunner")
        for name, params, marker in (
            ("_copy_draft_token_ids_to_cpu", ("self", "scheduler_output", "zeros_only"), "draft_token_ids_copy_stream"),
            ("_copy_valid_sampled_token_count", ("self", "next_token_ids", "valid_sampled_tokens_count"),
             "valid_sampled_token_count_copy_stream"),
        ):
            fn = getattr(cls, name, None)
            if fn is None:
                raise TargetChanged(f"CPUModelRunner has no {name}")
            if "cpu_model_runner" in getattr(fn, "__module__", ""):
                raise TargetChanged(f"CPUModelRunner defines its own {name}")
            g.has_params(fn, name, *params)
            if marker not in g.source(fn, name) or "torch.cuda.stream" not in g.source(fn, name):
                raise TargetChanged(f"{name} no longer copies on {marker}")

    def install(self, module: ModuleType, changes: Changes) -> None:
        import torch

        cls = module.CPUModelRunner

        def _copy_draft_token_ids_to_cpu(self: Any, scheduler_output: Any, zeros_only: bool = False) -> None:
            # same decisions as the GPU runner; the copy itself is synchronous
            if self.use_async_scheduling and not (
                scheduler_output.has_structured_output_requests
                or self.input_batch.sampling_metadata.output_token_ids
            ):
                return
            self._draft_token_req_ids = self.input_batch.req_ids.copy()
            ids = self._draft_token_ids
            if not torch.is_tensor(ids):
                return
            n = ids.shape[0]
            if zeros_only:
                self.draft_token_ids_cpu[:n] = 0
            else:
                self.draft_token_ids_cpu[:n].copy_(ids)

        def _copy_valid_sampled_token_count(self: Any, next_token_ids: Any, valid_sampled_tokens_count: Any) -> None:
            if self.valid_sampled_token_count_event is None:
                return
            counts = valid_sampled_tokens_count
            self.valid_sampled_token_count_cpu[: counts.shape[0]].copy_(counts)
            self.input_batch.prev_sampled_token_ids = next_token_ids.unsqueeze(1)

        changes.setattr(cls, "_copy_draft_token_ids_to_cpu", _copy_draft_token_ids_to_cpu)
        changes.setattr(cls, "_copy_valid_sampled_token_count", _copy_valid_sampled_token_count)


class _TorchKernels(Patch):
    """Shared: swap module-level Triton kernels for torch stand-ins on CPU."""

    kernels: dict[str, Any]

    def _kernels(self) -> dict[str, Any]:  # pragma: no cover - overridden
        raise NotImplementedError

    def check(self, module: ModuleType) -> None:
        from ..shims.spec_decode import kernel_arg_names

        _require_cpu_platform()
        for name, stand_in in self._kernels().items():
            names = kernel_arg_names(g.attr(module, name))
            if names != stand_in.arg_names:
                raise TargetChanged(f"{module.__name__}.{name} takes {names}, the stand-in {stand_in.arg_names}")

    def install(self, module: ModuleType, changes: Changes) -> None:
        from ..shims.spec_decode import TritonHelpers

        for name, stand_in in self._kernels().items():
            changes.setattr(module, name, stand_in)
        triton = getattr(module, "triton", None)
        if triton is not None and not hasattr(triton, "next_power_of_2"):
            changes.setattr(module, "triton", TritonHelpers(triton))


@register
class CpuRejectionSampler(_TorchKernels):
    """vLLM 0.15/0.16 ``v1/sample/rejection_sampler.py`` launches Triton kernels
    (greedy/random rejection, expand, recovered tokens); on CPU Triton is
    disabled and the first verification step raises."""

    id = "cpu-rejection-sampler"
    proof = Proof("fails", SERVING, r"rejection_greedy_sample_kernel\[\(batch_size,\)\]\((?:.*\n)*?.*TypeError: .function. object is not subscriptable", using="llama")
    summary = "rejection sampling kernels run as torch code on the CPU platform"
    upstream = "vLLM 0.15/0.16 v1/sample/rejection_sampler.py: rejection_*_kernel[grid] are Triton-only"
    target = "vllm.v1.sample.rejection_sampler:rejection_greedy_sample_kernel"
    requires = {"vllm": VLLM_CPU_SPEC}
    side = "worker"

    def _kernels(self) -> dict[str, Any]:
        from ..shims.spec_decode import REJECTION_KERNELS

        return REJECTION_KERNELS


@register
class CpuEaglePaddedBatch(_TorchKernels):
    """vLLM 0.15/0.16 ``v1/spec_decode/eagle.py`` ~922/962 prepare the padded
    drafter batch with Triton kernels (next token ids, token indices to
    sample); on CPU they raise after the first verification step."""

    id = "cpu-eagle-padded-batch"
    proof = Proof("fails", SERVING, r"in prepare_next_token_ids_padded\n(?:.*\n)*?.*AttributeError: module .triton. has no attribute .next_power_of_2.", using="llama")
    summary = "EAGLE's padded-batch preparation kernels run as torch code on the CPU platform"
    upstream = "vLLM 0.15/0.16 v1/spec_decode/eagle.py:922,962 eagle_prepare_*_padded_kernel[grid] are Triton-only"
    target = "vllm.v1.spec_decode.eagle:eagle_prepare_inputs_padded_kernel"
    requires = {"vllm": VLLM_CPU_SPEC}
    side = "worker"

    def _kernels(self) -> dict[str, Any]:
        from ..shims.spec_decode import EAGLE_KERNELS

        return EAGLE_KERNELS


# ---------------------------------------------------------------------------
# S1: EAGLE-3 for DeepSeek-V2/V3 and Kimi-K2.5 targets


def _text_model_type(spec_config: Any) -> str:
    target = getattr(spec_config, "target_model_config", None)
    text = getattr(target, "hf_text_config", None)
    return str(getattr(text, "model_type", ""))


@register
class Eagle3DeepseekAllowList(Patch):
    """vLLM <=0.16 ``config/speculative.py:689`` allows EAGLE-3 only for a list of
    target model types (llama, qwen, ...): a DeepSeek-V3 / Kimi-K2.5 target is
    refused ("Eagle3 is only supported for ...") before anything loads."""

    id = "eagle3-deepseek-allow-list"
    proof = Proof("fails", SERVING, r"Eagle3 is only supported for \[.*\] models\. Got self\.target_model_config\.hf_text_config\.model_type='deepseek_v3'", using="deepseek-v3")
    summary = "the speculative config accepts EAGLE-3 for deepseek_v2/v3 and kimi_k2/k25 targets"
    upstream = "vLLM <=0.16 config/speculative.py:689 eagle3_target_supported excludes deepseek_v3 (S1)"
    fixes = ("S1",)
    target = "vllm.config.speculative:SpeculativeConfig"
    requires = {"vllm": ">=0.15,<0.17"}
    side = "worker"

    def check(self, module: ModuleType) -> None:
        cls = g.attr(module, "SpeculativeConfig")
        decorators = getattr(cls, "__pydantic_decorators__", None)
        dec = getattr(decorators, "model_validators", {}).get("_verify_args") if decorators else None
        if dec is None:
            raise TargetChanged("SpeculativeConfig has no pydantic model validator _verify_args")
        body = _body(dec.func, "SpeculativeConfig._verify_args")
        if "eagle3_target_supported" not in "\n".join(body):
            raise TargetChanged("SpeculativeConfig._verify_args has no eagle3 allow-list")
        if body[-2:] != ["self.verify_equal_vocab_size_if_draft_model()", "return self"]:
            raise TargetChanged("SpeculativeConfig._verify_args no longer ends with the vocab check")
        if "Eagle3 is only supported" not in body[-3]:
            raise TargetChanged("the eagle3 allow-list is not the last check of SpeculativeConfig._verify_args")

    def install(self, module: ModuleType, changes: Changes) -> None:
        import dataclasses

        from pydantic.dataclasses import rebuild_dataclass

        cls = module.SpeculativeConfig
        validators = cls.__pydantic_decorators__.model_validators
        dec = validators["_verify_args"]
        orig = dec.func

        def _verify_args(self: Any) -> Any:
            try:
                return orig(self)
            except ValueError as exc:
                if not (str(exc).startswith("Eagle3 is only supported")
                        and _text_model_type(self).startswith(DEEPSEEK_FAMILY)):
                    raise
                # the allow-list was the last check but one: run the one after it
                self.verify_equal_vocab_size_if_draft_model()
                return self

        def restore() -> None:
            validators["_verify_args"] = dec
            rebuild_dataclass(cls, force=True)

        validators["_verify_args"] = dataclasses.replace(dec, func=_verify_args)
        changes.on_undo(restore)
        rebuild_dataclass(cls, force=True)


def _eagle3_methods(patch_id: str, find_stack: Any) -> dict[str, Any]:
    """``SupportsEagle3`` members for a model class whose decoder loop has no aux states."""
    from ..shims.aux_states import AuxStateCollector, default_aux_layers

    def set_aux_hidden_state_layers(self: Any, layers: tuple[int, ...]) -> None:
        old = self.__dict__.pop("_spec_compat_aux", None)
        if old is not None:
            old.remove()
        self.__dict__["_spec_compat_aux"] = AuxStateCollector(find_stack(self, patch_id), layers, patch_id)

    def get_eagle3_aux_hidden_state_layers(self: Any) -> tuple[int, ...]:
        return default_aux_layers(len(find_stack(self, patch_id).layers), patch_id)

    # every member of vLLM's runtime-checkable SupportsEagle3 protocol (SupportsEagleBase's flags too:
    # isinstance() looks for each of them)
    return {"supports_eagle3": True,
            "has_own_lm_head": False,
            "has_own_embed_tokens": False,
            "set_aux_hidden_state_layers": set_aux_hidden_state_layers,
            "get_eagle3_aux_hidden_state_layers": get_eagle3_aux_hidden_state_layers}


def _install_eagle3(cls: Any, patch_id: str, changes: Changes) -> None:
    from ..shims.decoder import find_decoder_stack

    for name, value in _eagle3_methods(patch_id, find_decoder_stack).items():
        if name.startswith("has_own_") and hasattr(cls, name):
            continue  # the model's own answer stands
        changes.setattr(cls, name, value)
    changes.setattr(cls, "forward", _forward_with_aux(cls.forward))


def _forward_with_aux(orig: Any) -> Any:
    def forward(self: Any, *args: Any, **kwargs: Any) -> Any:
        collector = self.__dict__.get("_spec_compat_aux")
        if collector is None:
            return orig(self, *args, **kwargs)
        collector.start()
        out = orig(self, *args, **kwargs)
        if not hasattr(out, "shape"):  # IntermediateTensors of a non-last pipeline rank, or already a tuple
            return out
        return out, collector.collect()

    forward.__wrapped__ = orig  # type: ignore[attr-defined]
    return forward


def _check_not_eagle3(cls: Any, where: str) -> None:
    if getattr(cls, "supports_eagle3", False) or hasattr(cls, "set_aux_hidden_state_layers"):
        raise TargetChanged(f"{where} already declares SupportsEagle3")
    g.has_params(cls.forward, f"{where}.forward", "input_ids", "positions")


@register
class Eagle3DeepseekAuxStates(Patch):
    """vLLM <0.18 ``model_executor/models/deepseek_v2.py``: DeepseekV2/V3ForCausalLM
    is not ``SupportsEagle3`` (no aux hidden states out of the decoder loop) ->
    "Model does not support EAGLE3 interface" at load (added upstream in 0.18)."""

    id = "eagle3-deepseek-aux-states"
    proof = Proof("fails", SERVING, r"RuntimeError: spec_compat\[cpu-runner-loads-drafter\]: DeepseekV3ForCausalLM does not collect EAGLE-3 aux hidden states \(no SupportsEagle3\)", using="deepseek-v3")
    summary = "DeepseekV2ForCausalLM (and V3) returns EAGLE-3 aux hidden states: inputs of the chosen layers"
    upstream = "vLLM <0.18 model_executor/models/deepseek_v2.py: no SupportsEagle3 (S1)"
    fixes = ("S1",)
    target = "vllm.model_executor.models.deepseek_v2:DeepseekV2ForCausalLM"
    requires = {"vllm": VLLM_S1}
    side = "worker"

    def check(self, module: ModuleType) -> None:
        cls = g.attr(module, "DeepseekV2ForCausalLM")
        _check_not_eagle3(cls, "DeepseekV2ForCausalLM")

    def install(self, module: ModuleType, changes: Changes) -> None:
        _install_eagle3(module.DeepseekV2ForCausalLM, self.id, changes)


@register
class Eagle3KimiK25Delegation(Patch):
    """vLLM <0.18 ``model_executor/models/kimi_k25.py``: the Kimi-K2.5 wrapper is not
    ``SupportsEagle3``; its text model (DeepSeek-V3) holds the decoder loop, and
    the drafter reads ``config.image_token_index``, which Kimi's config lacks
    (and, on 0.15, ``get_language_model().model``, which the bare text model lacks)."""

    id = "eagle3-kimi-k25-aux-states"
    proof = Proof("fails", SERVING, r"AttributeError: 'KimiK25Config' object has no attribute 'image_token_index'", using="kimi-k25")
    summary = ("KimiK25ForConditionalGeneration returns EAGLE-3 aux hidden states of its text model's layers; "
               "its config names image_token_index for the drafter")
    upstream = "vLLM <0.18 model_executor/models/kimi_k25.py: no SupportsEagle3 on the wrapper (S1)"
    fixes = ("S1",)
    target = "vllm.model_executor.models.kimi_k25:KimiK25ForConditionalGeneration"
    requires = {"vllm": VLLM_S1}
    side = "worker"

    def check(self, module: ModuleType) -> None:
        cls = g.attr(module, "KimiK25ForConditionalGeneration")
        _check_not_eagle3(cls, "KimiK25ForConditionalGeneration")
        g.has_attrs(cls, "KimiK25ForConditionalGeneration", "get_language_model")
        g.has_params(cls.__init__, "KimiK25ForConditionalGeneration.__init__", "vllm_config")

    def install(self, module: ModuleType, changes: Changes) -> None:
        import functools

        cls = module.KimiK25ForConditionalGeneration
        _install_eagle3(cls, self.id, changes)
        orig_init = cls.__init__

        @functools.wraps(orig_init)  # vLLM reads the signature (keyword vllm_config)
        def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
            orig_init(self, *args, **kwargs)
            # EagleProposer.load_model (v1/spec_decode/eagle.py ~1362) reads the wrapper's
            # config.image_token_index; Kimi-K2.5 calls its image token media_placeholder_token_id
            cfg = getattr(self, "config", None)
            if cfg is not None and not hasattr(cfg, "image_token_index") \
                    and hasattr(cfg, "media_placeholder_token_id"):
                cfg.image_token_index = cfg.media_placeholder_token_id
            _expose_text_model_as_causal_lm(self)

        changes.setattr(cls, "__init__", __init__)


def _expose_text_model_as_causal_lm(wrapper: Any) -> None:
    """vLLM 0.15's Kimi-K2.5 wrapper holds a bare ``DeepseekV2Model`` as ``language_model``
    (0.16 holds a ``DeepseekV3ForCausalLM``), while 0.15's ``EagleProposer.load_model``
    (v1/spec_decode/eagle.py:1145) reads ``get_language_model().model.embed_tokens`` and
    ``.lm_head``.  Give the bare text model those two names as plain attributes (not
    registered submodules: parameters, state dicts and module walks are unchanged)."""
    lm = getattr(wrapper, "language_model", None)
    if lm is None or not hasattr(lm, "embed_tokens") or "model" in vars(lm) or "model" in getattr(lm, "_modules", {}):
        return  # 0.16 layout (a causal LM with .model), or not a text model: nothing to expose
    object.__setattr__(lm, "model", lm)
    head = getattr(wrapper, "lm_head", None)
    if head is not None and not hasattr(lm, "lm_head"):
        object.__setattr__(lm, "lm_head", head)
