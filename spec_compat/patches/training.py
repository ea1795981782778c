"""Training-side patches: speculators' EAGLE-3 trainer (``speculators.train``,
``speculators.models.eagle3``) and its stock scripts (``scripts/train.py``,
``scripts/build_vocab_mapping.py``) on Kimi-K2.5 verifiers, without CUDA, and
with the layer/target conventions vLLM serves with.

Every shim here acts only where the stock code cannot work or silently trains
on the wrong thing; on a CUDA machine with a Llama verifier the device patches
pass straight through.
"""

from __future__ import annotations

import functools
import logging
import sys
from types import ModuleType
from typing import Any

from ..core.naming import through
from ..core.proof import Proof, MEASURED, TRAINING
from ..core.registry import Changes, Patch, TargetChanged, register
from ..shims.device import accelerator_available
from ..shims.hf_config import declares_remote_config
from . import _guards as g

log = logging.getLogger("spec_compat")

CORE = "speculators.models.eagle3.core"
ATTENTION = "speculators.models.eagle3.attention"
TRAINER = "speculators.train.trainer"
UTILS = "speculators.train.utils"
CHECKPOINTER = "speculators.train.checkpointer"
AUTO_CONFIG = "transformers.models.auto.configuration_auto"
DRAFT = "Eagle3DraftModel"

from .ranges import SPEC_03
SPEC_TRAIN = ">=0.3,<0.5"


def _cuda_available() -> bool:
    import torch

    return bool(torch.cuda.is_available())


def _on_cuda(tensor: Any) -> bool:
    return bool(getattr(tensor, "is_cuda", False))


# ---------------------------------------------------------------------------
# T2: Kimi-K2.5 (and other wrapper / MLA) verifiers
# ---------------------------------------------------------------------------

_TRAINING_MODULES = ("speculators.models.", "speculators.train.")


def _caller_is_speculators(depth: int = 2) -> bool:
    """Whether the code calling AutoConfig is speculators' training side: a module of
    ``speculators.models`` / ``speculators.train``, or a script built on speculators
    (its stock ``scripts/train.py``, ``scripts/build_vocab_mapping.py``)."""
    frame = sys._getframe(depth)
    while frame is not None:
        name = str(frame.f_globals.get("__name__", ""))
        if not (name.startswith(("transformers", "wrapt", "spec_compat", "functools"))):
            break
        frame = frame.f_back
    if frame is None:
        return False
    name = str(frame.f_globals.get("__name__", ""))
    if name.startswith(_TRAINING_MODULES):
        return True
    if name.startswith("speculators"):
        return False  # e.g. data generation: it passes trust_remote_code itself
    for value in list(frame.f_globals.values()):
        mod = value.__name__ if isinstance(value, ModuleType) else getattr(value, "__module__", None)
        if isinstance(mod, str) and (mod == "speculators" or mod.startswith("speculators.")):
            return True
    return False



@register
class VerifierConfigTextModel(Patch):
    """speculators (train.py:90, core.py:226, build_vocab_mapping.py:88) loads the verifier
    config without ``trust_remote_code`` and reads top-level ``hidden_size``/``vocab_size``/
    ``head_dim``: Kimi-K2.5's remote-code config fails to load, nests them in ``text_config``,
    and DeepseekV3Config's ``head_dim`` is the rope size (64 heads x 64 instead of x 112)."""

    id = "verifier-config-text-model"
    proof = Proof("fails", TRAINING, r"in _setup_embeddings_and_lm_heads\n(?:.*\n)*?ValueError: The repository \S+ contains custom code which must be executed to correctly load the model", using="kimi-k25")
    fixes = ("T2",)
    summary = ("speculators' training code and stock scripts get the verifier's text-model config: remote "
               "code trusted for a path whose config.json declares it (speculators' own generator already "
               "loads that path with trust_remote_code=True), text_config of wrapper configs, and an MLA "
               "config's head_dim set to hidden/heads; other callers unchanged")
    upstream = ("speculators 0.3.0 scripts/train.py:90, models/eagle3/core.py:226; 0.4.0.1 train.py:117 - "
                "AutoConfig without trust_remote_code, top-level sizes, DeepseekV3Config.head_dim = rope dim")
    target = f"{AUTO_CONFIG}:AutoConfig"
    requires = {"speculators": SPEC_TRAIN}

    def check(self, module: ModuleType) -> None:
        cls = g.attr(module, "AutoConfig")
        raw = cls.__dict__.get("from_pretrained")
        if not isinstance(raw, classmethod):
            raise TargetChanged("AutoConfig.from_pretrained is no longer a classmethod")
        g.has_params(raw.__func__, "AutoConfig.from_pretrained", "pretrained_model_name_or_path")

    def install(self, module: ModuleType, changes: Changes) -> None:
        from ..shims.verifier import text_config

        cls = module.AutoConfig
        inner = cls.__dict__["from_pretrained"].__func__

        @functools.wraps(inner)
        def from_pretrained(klass: Any, pretrained_model_name_or_path: Any, *args: Any, **kwargs: Any) -> Any:
            if not _caller_is_speculators():
                return inner(klass, pretrained_model_name_or_path, *args, **kwargs)
            if "trust_remote_code" not in kwargs and declares_remote_config(pretrained_model_name_or_path):
                log.info("spec_compat: %s: loading %s with trust_remote_code=True for speculators (its generator "
                         "trusts the same path)", VerifierConfigTextModel.id, pretrained_model_name_or_path)
                kwargs["trust_remote_code"] = True
            return text_config(inner(klass, pretrained_model_name_or_path, *args, **kwargs))

        changes.setattr(cls, "from_pretrained", classmethod(from_pretrained))


@register
class VerifierWeightsWrapperPrefix(Patch):
    """speculators 0.3.0 core.py:239 loads ``model.embed_tokens.weight`` / ``lm_head.weight``
    by exact name; Kimi-K2.5 stores them as ``language_model.model.embed_tokens.weight`` /
    ``language_model.lm_head.weight`` -> KeyError.  Missing names are looked up under the
    wrapper prefix and returned under the requested name."""

    id = "verifier-weights-wrapper-prefix"
    proof = Proof("fails", TRAINING, r"ValueError: None of the requested tensor names were found in the index\.", using="kimi-k25")
    fixes = ("T2",)
    summary = ("verifier tensors that speculators asks for by their text-model name are found under a "
               "multimodal wrapper's 'language_model.' prefix when the plain name is absent")
    upstream = "speculators 0.3.0 models/eagle3/core.py:239 exact weight names (suffix matching since 0.4.0)"
    target = f"{CORE}:load_model_layers"
    requires = {"speculators": SPEC_03}

    def check(self, module: ModuleType) -> None:
        g.has_params(g.attr(module, "load_model_layers"), f"{CORE}.load_model_layers", "layer_names", "model_path")

    def install(self, module: ModuleType, changes: Changes) -> None:
        from ..shims.verifier import checkpoint_names, find_prefixed

        inner = module.load_model_layers

        @functools.wraps(inner)
        def load_model_layers(layer_names: list[str], model_path: str) -> dict[str, Any]:
            pid = VerifierWeightsWrapperPrefix.id
            renamed = find_prefixed(layer_names, checkpoint_names(model_path, pid))
            if not renamed:
                with through(pid, f"{CORE}.load_model_layers"):
                    return inner(layer_names, model_path)
            log.info("spec_compat: %s: %s", pid, ", ".join(f"{k} <- {v}" for k, v in renamed.items()))
            with through(pid, f"{CORE}.load_model_layers with wrapper-prefixed names"):
                got = inner([renamed.get(n, n) for n in layer_names], model_path)
            back = {v: k for k, v in renamed.items()}
            return {back.get(k, k): v for k, v in got.items()}

        changes.setattr(module, "load_model_layers", load_model_layers)


# ---------------------------------------------------------------------------
# T3: a machine without CUDA
# ---------------------------------------------------------------------------

class CpuRank(str):
    """The local rank as the stock script and Trainer use it on a machine without CUDA:
    a device name (``torch.device(r)``, ``.to(r)`` -> "cpu") that still compares equal
    to its rank number (the batch sampler's ``rank == bin.rank``, ``local_rank == 0``)."""

    rank: int

    def __new__(cls, rank: int) -> "CpuRank":
        obj = super().__new__(cls, "cpu")
        obj.rank = int(rank)
        return obj

    def __eq__(self, other: object) -> bool:
        if isinstance(other, int) and not isinstance(other, bool):
            return other == self.rank
        return str.__eq__(self, other)

    def __ne__(self, other: object) -> bool:
        return not self.__eq__(other)

    __hash__ = str.__hash__

    def __repr__(self) -> str:
        return f"CpuRank({self.rank})"


@register
class TrainDeviceWithoutCuda(Patch):
    """speculators' train.py does ``device = torch.device(local_rank)`` and the Trainer moves
    model and batches with ``.to(local_rank)``: an int means CUDA, so without CUDA the first
    ``.to`` raises 'Found no NVIDIA driver'; under torchrun ``maybe_setup_distributed`` needs an
    accelerator.  Without one, the process trains on "cpu" (gloo process group under torchrun)."""

    id = "train-device-without-cuda"
    proof = Proof("fails", TRAINING, r"d2t = torch\.from_numpy\(np\.load\(d2t_path\)\)\.to\(device\)\n(?:.*\n)*?RuntimeError: Found no NVIDIA driver on your system", using="llama")
    fixes = ("T3",)
    summary = ("without an accelerator, maybe_setup_distributed returns as local rank the device name 'cpu' "
               "that compares equal to the rank number, and under torchrun starts a gloo process group; "
               "with an accelerator, unchanged")
    upstream = "speculators 0.3.0-0.4.x train/utils.py maybe_setup_distributed + scripts/train.py torch.device(local_rank)"
    target = f"{UTILS}:maybe_setup_distributed"
    requires = {"speculators": SPEC_TRAIN}

    def check(self, module: ModuleType) -> None:
        # the replacement takes no arguments, as upstream's does: any other signature is drift
        g.exact_params(g.attr(module, "maybe_setup_distributed"), f"{UTILS}.maybe_setup_distributed")
        for name in ("is_distributed", "local_rank", "world_size"):
            if name not in module.__dict__:
                raise TargetChanged(f"{UTILS} has no module-level {name}")

    def install(self, module: ModuleType, changes: Changes) -> None:
        inner = module.maybe_setup_distributed

        @functools.wraps(inner)
        def maybe_setup_distributed() -> tuple[Any, int, int, bool]:
            if accelerator_available():
                return inner()
            if not module.is_distributed:
                log.info("spec_compat: %s: no accelerator, training on cpu", TrainDeviceWithoutCuda.id)
                return CpuRank(0), 1, 0, False
            import torch.distributed as dist

            if not dist.is_initialized():
                dist.init_process_group("gloo")
            rank = dist.get_rank()
            log.info("spec_compat: %s: no accelerator, gloo process group rank %d of %d on cpu",
                     TrainDeviceWithoutCuda.id, rank, module.world_size)
            return CpuRank(int(module.local_rank)), module.world_size, rank, True

        changes.setattr(module, "maybe_setup_distributed", maybe_setup_distributed)


class _TorchLoadView:
    """``torch`` as checkpointer.py sees it: ``load(map_location="cuda:0")`` without CUDA loads to cpu."""

    def __init__(self, torch: ModuleType) -> None:
        self._torch = torch

    def load(self, *args: Any, **kwargs: Any) -> Any:
        loc = kwargs.get("map_location")
        if isinstance(loc, str) and loc.startswith("cuda") and not self._torch.cuda.is_available():
            kwargs["map_location"] = "cpu"
        return self._torch.load(*args, **kwargs)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._torch, name)


@register
class CheckpointLoadWithoutCuda(Patch):
    """speculators' SingleGPUCheckpointer resumes onto CUDA: 0.3.x hard-codes
    ``safe_open(device="cuda:0")`` / ``torch.load(map_location="cuda:0")`` ('todo: generalize'),
    0.4.x asks ``get_current_device()``, which answers from ``torch.accelerator`` and initialises
    CUDA on a CUDA build without a GPU.  Without CUDA both load to cpu (the Trainer then moves it)."""

    id = "checkpoint-load-without-cuda"
    proof = Proof("fails", "tests/engine/test_training.py::test_resume_without_cuda_needs_shim", r"in load_model_state_dict\n(?:.*\n)*?RuntimeError: Found no NVIDIA driver on your system")
    fixes = ("T3",)
    summary = "without CUDA, resuming from a checkpoint loads tensors to cpu instead of cuda:0"
    upstream = ("speculators 0.3.x train/checkpointer.py SingleGPUCheckpointer 'cuda:0' (todo: generalize); "
                "0.4.x get_current_device() -> CUDA init without a GPU")
    target = f"{CHECKPOINTER}:SingleGPUCheckpointer"
    requires = {"speculators": SPEC_TRAIN}

    def check(self, module: ModuleType) -> None:
        src = g.source(module.SingleGPUCheckpointer, "SingleGPUCheckpointer")
        if "get_current_device()" in src:
            if not callable(module.__dict__.get("get_current_device")):
                raise TargetChanged(f"{CHECKPOINTER}.get_current_device is not a function")
            return
        g.has_params(g.attr(module, "load_safetensors_state_dict"), "load_safetensors_state_dict", "path", "device")
        if not isinstance(module.__dict__.get("torch"), ModuleType):
            raise TargetChanged(f"{CHECKPOINTER}.torch is not the torch module")
        if '"cuda:0"' not in src:
            raise TargetChanged("SingleGPUCheckpointer neither hard-codes cuda:0 nor asks get_current_device()")

    def install(self, module: ModuleType, changes: Changes) -> None:
        torch = module.torch
        if "get_current_device()" in g.source(module.SingleGPUCheckpointer, "SingleGPUCheckpointer"):
            current = module.get_current_device

            @functools.wraps(current)
            def get_current_device() -> str:
                return current() if accelerator_available() else "cpu"

            changes.setattr(module, "get_current_device", get_current_device)
            return
        inner = module.load_safetensors_state_dict

        @functools.wraps(inner)
        def load_safetensors_state_dict(path: Any, device: str) -> Any:
            if str(device).startswith("cuda") and not torch.cuda.is_available():
                device = "cpu"
            with through(CheckpointLoadWithoutCuda.id, f"{CHECKPOINTER}.load_safetensors_state_dict"):
                return inner(path, device)

        changes.setattr(module, "load_safetensors_state_dict", load_safetensors_state_dict)
        changes.setattr(module, "torch", _TorchLoadView(torch))


class _DistView:
    """``torch.distributed`` as trainer.py sees it: ``reduce(op=AVG)``, which gloo lacks, is a SUM
    followed by a division on the destination rank when the backend is gloo."""

    def __init__(self, dist: ModuleType) -> None:
        self._dist = dist

    def reduce(self, tensor: Any, dst: int = 0, op: Any = None, *args: Any, **kwargs: Any) -> Any:
        d = self._dist
        if op is not None and op == d.ReduceOp.AVG and d.get_backend() == "gloo":
            out = d.reduce(tensor, dst, d.ReduceOp.SUM, *args, **kwargs)
            if d.get_rank() == dst:
                tensor.div_(d.get_world_size())
            return out
        if op is None:
            return d.reduce(tensor, dst, *args, **kwargs)
        return d.reduce(tensor, dst, op, *args, **kwargs)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._dist, name)


@register
class FsdpWithoutCuda(Patch):
    """speculators' FSDP path (trainer.py ``setup_model``) materialises sharded layers with
    ``to_empty(device="cuda")`` and reduces metrics with ``ReduceOp.AVG``: under torchrun on a
    machine without CUDA (gloo) the first raises 'no NVIDIA driver', the second is not a gloo
    op.  Without CUDA the layers materialise on cpu and AVG is SUM / world size."""

    id = "fsdp-without-cuda"
    proof = Proof("fails", "tests/engine/test_training.py::test_torchrun_two_cpu_ranks_fsdp", r'm\.to_empty\(device=(?:"cuda"|acc_type)\)(?:.*\n)*?.*RuntimeError: Found no NVIDIA driver on your system')
    fixes = ("T3",)
    summary = ("torchrun without CUDA: FSDP layers materialise on cpu instead of the hard-coded 'cuda', and "
               "metric reduction with ReduceOp.AVG runs as SUM / world size on gloo; with CUDA unchanged")
    upstream = 'speculators 0.3.0-0.4.x train/trainer.py setup_model to_empty(device="cuda"), dist.reduce(op=AVG)'
    target = f"{TRAINER}:Trainer"
    requires = {"speculators": SPEC_TRAIN}

    def check(self, module: ModuleType) -> None:
        cls = g.attr(module, "Trainer")
        if 'to_empty(device="cuda")' not in g.source(cls.setup_model, "Trainer.setup_model"):
            raise TargetChanged('Trainer.setup_model no longer calls to_empty(device="cuda")')
        if not isinstance(module.__dict__.get("dist"), ModuleType):
            raise TargetChanged(f"{TRAINER}.dist is not torch.distributed")

    def install(self, module: ModuleType, changes: Changes) -> None:
        cls = module.Trainer
        setup = cls.setup_model

        @functools.wraps(setup)
        def setup_model(self: Any, *args: Any, **kwargs: Any) -> Any:
            if not getattr(self, "is_distributed", False) or _cuda_available():
                return setup(self, *args, **kwargs)
            layers = list(getattr(self.model, "layers", []) or [])

            def on_cpu(m: Any) -> Any:
                inner = type(m).to_empty

                def to_empty(*a: Any, device: Any = None, **kw: Any) -> Any:
                    if device is not None and str(device).startswith("cuda"):
                        device = "cpu"
                    return inner(m, *a, device=device, **kw)

                return to_empty

            for m in layers:
                m.__dict__["to_empty"] = on_cpu(m)  # this instance, for this call only
            try:
                return setup(self, *args, **kwargs)
            finally:
                for m in layers:
                    m.__dict__.pop("to_empty", None)

        changes.setattr(cls, "setup_model", setup_model)
        changes.setattr(module, "dist", _DistView(module.dist))


@register
class DraftEagerWithoutCuda(Patch):
    """speculators 0.3.0 core.py decorates ``Eagle3DraftModel.forward`` with ``@torch.compile``
    unconditionally (0.4.0 compiles only with CUDA): on CPU inductor compiles every new packed
    shape (demo Llama data, one 17-step epoch: 84.4 s compiled vs 40.8 s eager, median of 2
    interleaved rounds, benchmarks/results/draft_eager_cpu.json).  Calls whose tensors are not on
    CUDA run the uncompiled forward."""

    id = "draft-eager-without-cuda"
    proof = Proof("measured", MEASURED, benchmark="benchmarks/results/draft_eager_cpu.json")
    fixes = ("T3",)
    summary = ("Eagle3DraftModel.forward runs uncompiled when its inputs are not on CUDA (as speculators "
               "0.4.0 does); CUDA calls keep the torch.compile'd forward")
    upstream = "speculators 0.3.0 models/eagle3/core.py @torch.compile forward (conditional since 0.4.0)"
    target = f"{CORE}:{DRAFT}"
    requires = {"speculators": SPEC_03}

    def check(self, module: ModuleType) -> None:
        fwd = g.attr(module, DRAFT).__dict__.get("forward")
        if getattr(fwd, "_torchdynamo_orig_callable", None) is None:
            raise TargetChanged(f"{DRAFT}.forward is not a torch.compile'd function "
                                "(with TORCHDYNAMO_DISABLE=1 torch.compile returns it unchanged)")

    def install(self, module: ModuleType, changes: Changes) -> None:
        cls = getattr(module, DRAFT)
        compiled = cls.__dict__["forward"]
        eager = compiled._torchdynamo_orig_callable

        @functools.wraps(eager)
        def forward(self: Any, *args: Any, **kwargs: Any) -> Any:
            first = kwargs.get("hidden_states", args[0] if args else None)
            return (compiled if _on_cuda(first) else eager)(self, *args, **kwargs)

        changes.setattr(cls, "forward", forward)


@register
class DraftAttentionWithoutFlexBackward(Patch):
    """speculators 0.3.x compiles the draft's forward everywhere; off CUDA, inductor fails on its
    flex attention (eagle3/attention.py, torch 2.10: ``InductorError: IndexError``).  Non-CUDA
    calls get the same masked attention via SDPA and a dense mask built from the BlockMask.
    Needed only with ``draft-eager-without-cuda`` off; 0.4.x compiles only with CUDA."""

    id = "draft-attention-without-flex-backward"
    proof = Proof("fails", TRAINING, r"torch\._inductor\.exc\.InductorError: IndexError: tuple index out of range", also_off=("draft-eager-without-cuda",), using="llama")
    fixes = ("T3",)
    summary = ("the draft's 'simple_flex_attention' computes non-CUDA calls with scaled_dot_product_attention "
               "and the BlockMask materialised densely (block structure + mask_mod); CUDA calls keep flex attention")
    upstream = "torch.compile'd flex_attention on CPU: InductorError (speculators 0.3.x eagle3/attention.py, compiled core.py)"
    target = f"{ATTENTION}:flex_attention_forward"
    requires = {"speculators": SPEC_03}

    def check(self, module: ModuleType) -> None:
        fn = g.attr(module, "flex_attention_forward")
        g.has_params(fn, "flex_attention_forward", "module", "query", "key", "value", "attention_mask", "scaling")
        registry = getattr(module, "ALL_ATTENTION_FUNCTIONS", None)
        try:
            registered = registry["simple_flex_attention"] if registry is not None else None
        except KeyError:
            registered = None
        if registered is not fn:
            raise TargetChanged("'simple_flex_attention' is not registered as flex_attention_forward")

    def install(self, module: ModuleType, changes: Changes) -> None:
        from ..shims.attention import sdpa_with_block_mask

        inner = module.flex_attention_forward
        registry = module.ALL_ATTENTION_FUNCTIONS

        @functools.wraps(inner)
        def flex_attention_forward(module_: Any, query: Any, key: Any, value: Any, attention_mask: Any,
                                   scaling: float | None = None, **kwargs: Any) -> Any:
            if _on_cuda(query):
                return inner(module_, query, key, value, attention_mask, scaling=scaling, **kwargs)
            out = sdpa_with_block_mask(query.contiguous(), key.contiguous(), value.contiguous(), attention_mask,
                                       scale=scaling, enable_gqa=query.shape[1] != key.shape[1])
            return out.transpose(1, 2).contiguous(), None

        changes.setattr(module, "flex_attention_forward", flex_attention_forward)
        registry.register("simple_flex_attention", flex_attention_forward)
        changes.on_undo(lambda: registry.register("simple_flex_attention", inner))


# ---------------------------------------------------------------------------
# O7 / O6: train on what vLLM serves with
# ---------------------------------------------------------------------------

@register
class TargetsAfterFinalNorm(Patch):
    """speculators 0.3.0 core.py:328 computes training targets as ``verifier_lm_head(h)`` from the
    last captured layer *before* the verifier's final norm (fixed in 0.4.0, #313): the draft
    learns from logits the verifier never produces.  The verifier's final RMSNorm is loaded
    (frozen, not saved) and applied to ``verifier_last_hidden_states`` first."""

    id = "targets-after-final-norm"
    proof = Proof("wrong-values", "tests/engine/test_training.py::test_targets_use_the_final_norm", r"targets equal verifier_lm_head\(last layer\) without the final norm")
    fixes = ("O7",)
    summary = ("training targets come from the verifier's final-norm output: its norm weight is loaded with the "
               "embeddings (frozen, not part of the saved draft) and applied before verifier_lm_head")
    upstream = "speculators <0.4.0 models/eagle3/core.py:328 targets from pre-norm states (fixed by #313 in 0.4.0)"
    target = f"{CORE}:{DRAFT}"
    requires = {"speculators": SPEC_03}

    def check(self, module: ModuleType) -> None:
        cls = g.attr(module, DRAFT)
        g.has_params(cls._setup_embeddings_and_lm_heads, "_setup_embeddings_and_lm_heads", "self", "config")
        g.has_params(cls.forward, f"{DRAFT}.forward", "verifier_last_hidden_states")
        g.attr(module, "load_model_layers")
        if "verifier_norm" in g.source(cls, DRAFT):
            raise TargetChanged(f"{DRAFT} already applies a verifier norm")

    def install(self, module: ModuleType, changes: Changes) -> None:
        from ..shims.verifier import rms_norm

        cls = getattr(module, DRAFT)
        setup = cls._setup_embeddings_and_lm_heads
        forward = cls.forward

        @functools.wraps(setup)
        def _setup_embeddings_and_lm_heads(self: Any, config: Any, *args: Any, **kwargs: Any) -> Any:
            out = setup(self, config, *args, **kwargs)
            import torch

            # module.load_model_layers: the binding verifier-weights-wrapper-prefix may adapt
            weights = module.load_model_layers(["model.norm.weight"], config.name_or_path)
            weight = weights.get("model.norm.weight")
            if weight is None:
                log.warning("spec_compat: %s: no model.norm.weight in %s; targets use a unit-weight RMSNorm",
                            TargetsAfterFinalNorm.id, config.name_or_path)
                weight = torch.ones(self.hidden_size)
            eps = float(getattr(self.config.transformer_layer_config, "rms_norm_eps", 1e-6))
            # a plain attribute: not a parameter, not a buffer, never saved
            object.__setattr__(self, "_spec_compat_verifier_norm", (weight.detach().float(), eps))
            return out

        @functools.wraps(forward)
        def forward_(self: Any, *args: Any, **kwargs: Any) -> Any:
            norm = self.__dict__.get("_spec_compat_verifier_norm")
            target = kwargs.get("verifier_last_hidden_states")
            if norm is not None and target is not None:
                kwargs["verifier_last_hidden_states"] = rms_norm(target, norm[0].to(target.dtype), norm[1])
            return forward(self, *args, **kwargs)

        changes.setattr(cls, "_setup_embeddings_and_lm_heads", _setup_embeddings_and_lm_heads)
        changes.setattr(cls, "forward", forward_)


@register
class DraftNamesItsAuxLayers(Patch):
    """speculators (0.3.0-0.4.x) extracts the OUTPUT of each listed layer; vLLM's EAGLE-3 path
    feeds the draft the INPUT of each ``eagle_aux_hidden_state_layer_ids`` entry, or of its
    default (2, n//2, n-3) when the draft config has none: served features are off by one
    layer.  Before saving, the draft config gets ``[l + 1 for l in feature layers]``, read
    from speculators' own ``data_config.json`` next to the training files."""

    id = "draft-names-its-aux-layers"
    proof = Proof("wrong-values", "tests/engine/test_training.py::test_draft_names_no_aux_layers_without_shim", r"eagle_aux_hidden_state_layer_ids: None")
    fixes = ("O6",)
    summary = ("the saved draft config names the layers it was trained on in vLLM's convention: "
               "eagle_aux_hidden_state_layer_ids = captured feature layers + 1 (from the training data's "
               "data_config.json); an explicit value is kept")
    upstream = ("speculators 0.3.0-0.4.x custom_worker captures layer outputs; vLLM gpu_model_runner reads "
                "eagle_aux_hidden_state_layer_ids as layer inputs (default 2, n//2, n-3)")
    target = f"{TRAINER}:Trainer"
    requires = {"speculators": SPEC_TRAIN}

    def check(self, module: ModuleType) -> None:
        cls = g.attr(module, "Trainer")
        g.has_params(cls.save_checkpoint, "Trainer.save_checkpoint", "self", "epoch")
        g.has_params(cls.__init__, "Trainer.__init__", "model", "config", "train_loader")

    def install(self, module: ModuleType, changes: Changes) -> None:
        from ..shims.verifier import aux_layer_ids_for_vllm, captured_layer_ids, data_config_for

        cls = module.Trainer
        save = cls.save_checkpoint

        @functools.wraps(save)
        def save_checkpoint(self: Any, epoch: int, *args: Any, **kwargs: Any) -> Any:
            config = getattr(getattr(self, "model", None), "config", None)
            if config is not None and getattr(config, "eagle_aux_hidden_state_layer_ids", None) is None:
                files = getattr(getattr(self.train_loader, "dataset", None), "data", None) or []
                data_config = data_config_for(files[:8])
                captured = captured_layer_ids(data_config) if data_config else None
                if captured is None:
                    log.warning("spec_compat: %s: no data_config.json with layer_ids next to the training data: "
                                "the draft config names no aux layers and vLLM will use its defaults",
                                DraftNamesItsAuxLayers.id)
                else:
                    ids = aux_layer_ids_for_vllm(captured, DraftNamesItsAuxLayers.id)
                    config.eagle_aux_hidden_state_layer_ids = ids
                    log.info("spec_compat: %s: captured layer outputs %s -> eagle_aux_hidden_state_layer_ids %s",
                             DraftNamesItsAuxLayers.id, captured[:-1], ids)
            return save(self, epoch, *args, **kwargs)

        changes.setattr(cls, "save_checkpoint", save_checkpoint)


# ---------------------------------------------------------------------------
# P-single: mixed precision on one device
# ---------------------------------------------------------------------------

class _OptimView:
    def __init__(self, optim: Any) -> None:
        self._optim = optim

    def AdamW(self, *args: Any, **kwargs: Any) -> Any:  # noqa: N802 - torch's name
        kwargs.setdefault("fused", True)
        return self._optim.AdamW(*args, **kwargs)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._optim, name)


class _TorchFusedAdamWView:
    """``torch`` as trainer.py's setup_optimizer sees it on one CUDA device: AdamW is fused."""

    def __init__(self, torch: ModuleType) -> None:
        self._torch = torch
        self.optim = _OptimView(torch.optim)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._torch, name)


@register
class SingleDeviceBf16(Patch):
    """speculators' single-device path (train.py without torchrun) never casts model or data:
    it trains in fp32 (measured on an H200 at Kimi-K2.5 draft dims: 1258 ms/step vs 87.5 ms in
    bf16).  The FSDP path computes in bf16 with fp32 master weights; single CUDA-device runs
    get the same policy through bf16 autocast around the draft's forward."""

    id = "single-device-bf16"
    proof = Proof("measured", MEASURED, benchmark="benchmarks/results/h200-train-step-run4-fused-adamw.json")
    fixes = ("P-single",)
    summary = ("single-device CUDA training computes in bf16 (autocast) with fp32 master weights and fp32 "
               "optimizer state (AdamW as one fused kernel), like the FSDP path's MixedPrecisionPolicy; CPU and "
               "FSDP runs unchanged; SPEC_COMPAT_DISABLE=single-device-bf16 keeps fp32")
    upstream = "speculators 0.3.0-0.4.x train/trainer.py setup_model: no dtype policy without FSDP (fp32 training)"
    target = f"{TRAINER}:Trainer"
    requires = {"speculators": SPEC_TRAIN}

    def check(self, module: ModuleType) -> None:
        cls = g.attr(module, "Trainer")
        g.has_params(cls.setup_model, "Trainer.setup_model", "self")
        if "MixedPrecisionPolicy" in g.source(cls, "Trainer") or "autocast" in g.source(cls, "Trainer"):
            raise TargetChanged("Trainer already sets a precision policy itself")
        if not isinstance(module.__dict__.get("torch"), ModuleType) or \
                "torch.optim.AdamW(" not in g.source(cls.setup_optimizer, "Trainer.setup_optimizer"):
            raise TargetChanged("Trainer.setup_optimizer no longer builds torch.optim.AdamW")

    def install(self, module: ModuleType, changes: Changes) -> None:
        cls = module.Trainer
        setup = cls.setup_model

        @functools.wraps(setup)
        def setup_model(self: Any, *args: Any, **kwargs: Any) -> Any:
            out = setup(self, *args, **kwargs)
            model = self.model
            if getattr(self, "is_distributed", False):
                return out
            first = next(model.parameters(), None)
            if first is None or not first.is_cuda:
                log.debug("spec_compat: %s: model not on CUDA; precision unchanged", SingleDeviceBf16.id)
                return out
            forward = model.forward

            @functools.wraps(forward)
            def bf16_forward(*a: Any, **kw: Any) -> Any:
                import torch

                with torch.autocast("cuda", dtype=torch.bfloat16):
                    return forward(*a, **kw)

            model.forward = bf16_forward
            self.__dict__["_spec_compat_fused_adamw"] = True
            log.info("spec_compat: %s: single-device training on %s in bf16 autocast with fp32 master weights",
                     SingleDeviceBf16.id, first.device)
            return out

        changes.setattr(cls, "setup_model", setup_model)

        setup_optimizer = cls.setup_optimizer

        @functools.wraps(setup_optimizer)
        def setup_optimizer_(self: Any, *args: Any, **kwargs: Any) -> Any:
            real = module.__dict__.get("torch")
            if not self.__dict__.get("_spec_compat_fused_adamw") or not isinstance(real, ModuleType):
                return setup_optimizer(self, *args, **kwargs)
            # the same AdamW, as one fused CUDA kernel over the fp32 master weights and states
            module.torch = _TorchFusedAdamWView(real)  # trainer.py's own global, for this call only
            try:
                return setup_optimizer(self, *args, **kwargs)
            finally:
                if isinstance(module.__dict__.get("torch"), _TorchFusedAdamWView):
                    module.torch = real

        changes.setattr(cls, "setup_optimizer", setup_optimizer_)


# ---------------------------------------------------------------------------
# T4: reloading a saved draft
# ---------------------------------------------------------------------------

def _post_init_keeping_weights(model: Any) -> None:
    try:
        from transformers import initialization as init  # transformers >= 5

        ctx = init.no_init_weights()
    except (ImportError, AttributeError):
        from transformers.modeling_utils import no_init_weights

        ctx = no_init_weights()
    with ctx:
        model.post_init()


@register
class DraftReloadsWithSpeculatorsLoader(Patch):
    """``Eagle3DraftModel.from_pretrained(saved_dir)`` (speculators' SpeculatorModel loader)
    passes ``verifier=``/``verifier_attachment_mode=`` and no vocab maps to
    ``Eagle3DraftModel.__init__(config, t2d, d2t)``: TypeError 'unexpected keyword verifier'.
    The constructor accepts them and builds placeholder maps that the saved d2t/t2d replace."""

    id = "draft-reloads-with-speculators-loader"
    proof = Proof("fails", "tests/engine/test_training.py::test_reload_needs_shim", r"TypeError: Eagle3DraftModel.__init__\(\) got an unexpected keyword argument 'verifier'")
    fixes = ("T4",)
    summary = ("Eagle3DraftModel accepts the loader's verifier/verifier_attachment_mode arguments and, "
               "without t2d/d2t, placeholder maps of the config's sizes that the checkpoint's own overwrite")
    upstream = "speculators 0.3.0-0.4.x models/eagle3/core.py Eagle3DraftModel.__init__(config, t2d, d2t) vs model.py from_pretrained"
    target = f"{CORE}:{DRAFT}"
    requires = {"speculators": SPEC_TRAIN}

    def check(self, module: ModuleType) -> None:
        params = g.params(g.attr(module, DRAFT).__init__, f"{DRAFT}.__init__")
        if list(params)[:4] != ["self", "config", "t2d", "d2t"]:
            raise TargetChanged(f"{DRAFT}.__init__ is no longer (self, config, t2d, d2t)")
        if "verifier" in params or any(p.kind is p.VAR_KEYWORD for p in params.values()):
            raise TargetChanged(f"{DRAFT}.__init__ accepts the loader's keywords itself")

    def install(self, module: ModuleType, changes: Changes) -> None:
        cls = getattr(module, DRAFT)
        init = cls.__init__

        @functools.wraps(init)
        def __init__(self: Any, config: Any, t2d: Any = None, d2t: Any = None, *args: Any,
                     verifier: Any = None, verifier_attachment_mode: Any = None, **kwargs: Any) -> None:
            if t2d is None and d2t is None:
                import torch

                draft = int(config.draft_vocab_size)
                target = int(config.transformer_layer_config.vocab_size)
                t2d = torch.zeros(target, dtype=torch.bool)
                t2d[:draft] = True
                d2t = torch.zeros(draft, dtype=torch.long)
                log.info("spec_compat: %s: placeholder vocab maps (%d of %d); the checkpoint's d2t/t2d replace them",
                         DraftReloadsWithSpeculatorsLoader.id, draft, target)
                if verifier is not None:
                    log.warning("spec_compat: %s: Eagle3DraftModel does not attach a verifier; %r ignored",
                                DraftReloadsWithSpeculatorsLoader.id, verifier)
                layer_config = config.transformer_layer_config
                if getattr(layer_config, "_attn_implementation", None) is None:
                    # set by scripts/train.py after construction, so never saved with the config
                    layer_config._attn_implementation = "simple_flex_attention"
                init(self, config, t2d, d2t, *args, **kwargs)
                if not hasattr(self, "all_tied_weights_keys") and hasattr(self, "post_init"):
                    # transformers >= 5 loads only models that ran post_init() (speculators' does not);
                    # without (re-)initialising the weights copied from the verifier
                    _post_init_keeping_weights(self)
                # the draft's lm_head (draft vocab) is its own weight, not the embedding
                # (verifier vocab): transformers' loader would tie them and fail on the shapes
                if getattr(self.config, "tie_word_embeddings", False):
                    self.config.tie_word_embeddings = False
                return
            init(self, config, t2d, d2t, *args, **kwargs)

        changes.setattr(cls, "__init__", __init__)

        raw = cls.__dict__.get("get_init_context") or getattr(cls, "get_init_context", None)
        get_init_context = getattr(raw, "__func__", None)
        if get_init_context is not None:
            @functools.wraps(get_init_context)
            def get_init_context_(klass: Any, *args: Any, **kwargs: Any) -> Any:
                # transformers builds models on the meta device (init_empty_weights); this
                # constructor copies the verifier's embeddings and lm_head into its parameters,
                # which needs real tensors
                import torch

                def on_meta(c: Any) -> bool:
                    if isinstance(c, torch.device):  # transformers >= 5: torch.device("meta")
                        return c.type == "meta"
                    return getattr(getattr(c, "func", None), "__name__", "") == "init_empty_weights"  # 4.x

                return [c for c in get_init_context(klass, *args, **kwargs) if not on_meta(c)]

            changes.setattr(cls, "get_init_context", classmethod(get_init_context_))
