"""T3: speculators' EAGLE-3 trainer on a machine without CUDA: device and local rank,
checkpoint resume, the FSDP path under torchrun (gloo), and the draft's compiled forward
and flex attention.  With CUDA every patch here passes straight through."""

from __future__ import annotations

import contextlib
import functools
import logging
from types import ModuleType
from typing import Any

from ...core.naming import through
from ...core.proof import Claim, Proof, MEASURED, TRAINING
from ...core.registry import Changes, Patch, TargetChanged, register
from ...shims.device import accelerator_available
from ...shims.swap import swapped
from ...shims.training_views import CpuRank, DistView, TorchLoadView
from .. import _guards as guard
from ..ranges import SPEC_03
from .targets import ATTENTION, CHECKPOINTER, CORE, DRAFT, SPEC_TRAIN, TRAINER, UTILS

log = logging.getLogger("spec_compat")


def _cuda_available() -> bool:
    import torch

    return bool(torch.cuda.is_available())


def _on_cuda(tensor: Any) -> bool:
    return bool(getattr(tensor, "is_cuda", False))


@register
class TrainDeviceWithoutCuda(Patch):
    """speculators' train.py does ``device = torch.device(local_rank)`` and the Trainer moves
    model and batches with ``.to(local_rank)``: an int means CUDA, so without CUDA the first
    ``.to`` raises 'Found no NVIDIA driver'; under torchrun ``maybe_setup_distributed`` needs an
    accelerator.  Without one, the process trains on "cpu" (gloo process group under torchrun)."""

    id = "train-device-without-cuda"
    proof = Proof("fails", TRAINING, r"d2t = torch\.from_numpy\(np\.load\(d2t_path\)\)\.to\(device\).*\n(?:  .*\n)*RuntimeError: Found no NVIDIA driver on your system", using="llama")
    fixes = ("T3",)
    summary = ("without an accelerator, maybe_setup_distributed returns as local rank the device name 'cpu' "
               "that compares equal to the rank number, and under torchrun starts a gloo process group; "
               "with an accelerator, unchanged")
    upstream = "speculators 0.3.0-0.4.x train/utils.py maybe_setup_distributed + scripts/train.py torch.device(local_rank)"
    target = f"{UTILS}:maybe_setup_distributed"
    requires = {"speculators": SPEC_TRAIN}

    def check(self, module: ModuleType) -> None:
        # the replacement takes no arguments, as upstream's does: any other signature is drift
        guard.exact_params(guard.attr(module, "maybe_setup_distributed"), f"{UTILS}.maybe_setup_distributed")
        for name in ("is_distributed", "local_rank", "world_size"):
            if name not in module.__dict__:
                raise TargetChanged(f"{UTILS} has no module-level {name}")

    def install(self, module: ModuleType, changes: Changes) -> None:
        def maybe_setup_distributed(wrapped: Any, instance: Any, args: tuple, kwargs: dict) -> tuple:
            if args or kwargs or accelerator_available():  # arguments: upstream's own TypeError
                return wrapped(*args, **kwargs)
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

        changes.wrap(module, "maybe_setup_distributed", maybe_setup_distributed)


@register
class CheckpointLoadWithoutCuda(Patch):
    """speculators' SingleGPUCheckpointer resumes onto CUDA: 0.3.x hard-codes
    ``safe_open(device="cuda:0")`` / ``torch.load(map_location="cuda:0")`` ('todo: generalize'),
    0.4.x asks ``get_current_device()``, which answers from ``torch.accelerator`` and initialises
    CUDA on a CUDA build without a GPU.  Without CUDA both load to cpu (the Trainer then moves it)."""

    id = "checkpoint-load-without-cuda"
    proof = Proof("fails", "tests/engine/test_training.py::test_resume_without_cuda_needs_shim", r"in load_model_state_dict\n(?:  .*\n)*RuntimeError: Found no NVIDIA driver on your system")
    fixes = ("T3",)
    summary = "without CUDA, resuming from a checkpoint loads tensors to cpu instead of cuda:0"
    upstream = ("speculators 0.3.x train/checkpointer.py SingleGPUCheckpointer 'cuda:0' (todo: generalize); "
                "0.4.x get_current_device() -> CUDA init without a GPU")
    target = f"{CHECKPOINTER}:SingleGPUCheckpointer"
    requires = {"speculators": SPEC_TRAIN}

    def check(self, module: ModuleType) -> None:
        src = guard.source(module.SingleGPUCheckpointer, "SingleGPUCheckpointer")
        if "get_current_device()" in src:
            if not callable(module.__dict__.get("get_current_device")):
                raise TargetChanged(f"{CHECKPOINTER}.get_current_device is not a function")
            return
        guard.has_params(guard.attr(module, "load_safetensors_state_dict"), "load_safetensors_state_dict", "path", "device")
        if not isinstance(module.__dict__.get("torch"), ModuleType):
            raise TargetChanged(f"{CHECKPOINTER}.torch is not the torch module")
        if '"cuda:0"' not in src:
            raise TargetChanged("SingleGPUCheckpointer neither hard-codes cuda:0 nor asks get_current_device()")

    def install(self, module: ModuleType, changes: Changes) -> None:
        torch = module.torch
        if "get_current_device()" in guard.source(module.SingleGPUCheckpointer, "SingleGPUCheckpointer"):
            def get_current_device(wrapped: Any, instance: Any, args: tuple, kwargs: dict) -> str:
                if args or kwargs or accelerator_available():  # arguments: upstream's own TypeError
                    return wrapped(*args, **kwargs)
                return "cpu"

            changes.wrap(module, "get_current_device", get_current_device)
            return

        def load_safetensors_state_dict(wrapped: Any, instance: Any, args: tuple, kwargs: dict) -> Any:
            return _load_safetensors_state_dict(wrapped, *args, **kwargs)

        def _load_safetensors_state_dict(inner: Any, /, path: Any, device: str) -> Any:
            if str(device).startswith("cuda") and not torch.cuda.is_available():
                device = "cpu"
            with through(CheckpointLoadWithoutCuda.id, f"{CHECKPOINTER}.load_safetensors_state_dict"):
                return inner(path, device)

        changes.wrap(module, "load_safetensors_state_dict", load_safetensors_state_dict)
        changes.setattr(module, "torch", TorchLoadView(torch))


@register
class FsdpWithoutCuda(Patch):
    """speculators' FSDP path (trainer.py ``setup_model``) materialises sharded layers with
    ``to_empty(device="cuda")`` and reduces metrics with ``ReduceOp.AVG``: under torchrun on a
    machine without CUDA (gloo) the first raises 'no NVIDIA driver', the second is not a gloo
    op.  Without CUDA the layers materialise on cpu and AVG is SUM / world size."""

    id = "fsdp-without-cuda"
    proof = Proof("fails", "tests/engine/test_training.py::test_torchrun_two_cpu_ranks_fsdp", r'm\.to_empty\(device=(?:"cuda"|acc_type)\).*\n(?:  .*\n)*RuntimeError: Found no NVIDIA driver on your system')
    fixes = ("T3",)
    summary = ("torchrun without CUDA: FSDP layers materialise on cpu instead of the hard-coded 'cuda', and "
               "metric reduction with ReduceOp.AVG runs as SUM / world size on gloo; with CUDA unchanged")
    upstream = 'speculators 0.3.0-0.4.x train/trainer.py setup_model to_empty(device="cuda"), dist.reduce(op=AVG)'
    target = f"{TRAINER}:Trainer"
    requires = {"speculators": SPEC_TRAIN}

    def check(self, module: ModuleType) -> None:
        cls = guard.attr(module, "Trainer")
        if 'to_empty(device="cuda")' not in guard.source(cls.setup_model, "Trainer.setup_model"):
            raise TargetChanged('Trainer.setup_model no longer calls to_empty(device="cuda")')
        if not isinstance(module.__dict__.get("dist"), ModuleType):
            raise TargetChanged(f"{TRAINER}.dist is not torch.distributed")

    def install(self, module: ModuleType, changes: Changes) -> None:
        def setup_model(wrapped: Any, trainer: Any, args: tuple, kwargs: dict) -> Any:
            if not getattr(trainer, "is_distributed", False) or _cuda_available():
                return wrapped(*args, **kwargs)
            layers = list(getattr(trainer.model, "layers", []) or [])

            def on_cpu(m: Any) -> Any:
                inner = type(m).to_empty

                def to_empty(*a: Any, device: Any = None, **kw: Any) -> Any:
                    if device is not None and str(device).startswith("cuda"):
                        device = "cpu"
                    return inner(m, *a, device=device, **kw)

                return to_empty

            with contextlib.ExitStack() as stack:
                for m in layers:
                    stack.enter_context(swapped(m, "to_empty", on_cpu(m)))  # this instance, for this call only
                return wrapped(*args, **kwargs)

        changes.wrap(module.Trainer, "setup_model", setup_model)
        changes.setattr(module, "dist", DistView(module.dist))


@register
class DraftEagerWithoutCuda(Patch):
    """speculators 0.3.0 core.py decorates ``Eagle3DraftModel.forward`` with ``@torch.compile``
    unconditionally (0.4.0 compiles only with CUDA): on CPU inductor compiles every new packed
    shape (demo Llama data, one 17-step epoch: 84.4 s compiled vs 40.8 s eager, 2.07x, median of 2
    interleaved rounds, benchmarks/results/draft_eager_cpu.json).  Calls whose tensors are not on
    CUDA run the uncompiled forward."""

    id = "draft-eager-without-cuda"
    proof = Proof("measured", MEASURED, benchmark="benchmarks/results/draft_eager_cpu.json", claims=(
        Claim("one epoch on CPU: compiled (patch off) / eager (patch on) seconds, median of 2 rounds",
              "seconds_per_epoch.compiled (patch off)", "seconds_per_epoch.eager (patch on)", value="2.07"),))
    fixes = ("T3",)
    summary = ("Eagle3DraftModel.forward runs uncompiled when its inputs are not on CUDA (as speculators "
               "0.4.0 does); CUDA calls keep the torch.compile'd forward")
    upstream = "speculators 0.3.0 models/eagle3/core.py @torch.compile forward (conditional since 0.4.0)"
    target = f"{CORE}:{DRAFT}"
    requires = {"speculators": SPEC_03}

    def check(self, module: ModuleType) -> None:
        fwd = guard.attr(module, DRAFT).__dict__.get("forward")
        if getattr(fwd, "_torchdynamo_orig_callable", None) is None:
            raise TargetChanged(f"{DRAFT}.forward is not a torch.compile'd function "
                                "(with TORCHDYNAMO_DISABLE=1 torch.compile returns it unchanged)")

    def install(self, module: ModuleType, changes: Changes) -> None:
        cls = getattr(module, DRAFT)
        compiled = cls.__dict__["forward"]
        eager = compiled._torchdynamo_orig_callable

        # plain function, not changes.wrap: the forward of a torch.compile'd model, which dynamo may trace
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
        fn = guard.attr(module, "flex_attention_forward")
        guard.has_params(fn, "flex_attention_forward", "module", "query", "key", "value", "attention_mask", "scaling")
        registry = getattr(module, "ALL_ATTENTION_FUNCTIONS", None)
        try:
            registered = registry["simple_flex_attention"] if registry is not None else None
        except KeyError:
            registered = None
        if registered is not fn:
            raise TargetChanged("'simple_flex_attention' is not registered as flex_attention_forward")

    def install(self, module: ModuleType, changes: Changes) -> None:
        from ...shims.attention import sdpa_with_block_mask

        inner = module.flex_attention_forward
        registry = module.ALL_ATTENTION_FUNCTIONS

        # plain function, not changes.wrap: dynamo traces it inside the torch.compile'd draft forward
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
