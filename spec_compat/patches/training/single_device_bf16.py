"""P-single: speculators' single-device training in mixed precision (bf16 compute, fp32
master weights, fused AdamW), as its FSDP path does.

Batches for single-device bf16 training: features cast where they are built, and the next
batch copied to the device while the current step computes.

* :class:`Bf16Features` wraps a DataLoader's ``collate_fn``: in a loader worker (speculators'
  train.py runs 12, with ``pin_memory``) the collated ``hidden_states`` (consumed only by the
  draft's ``fc``, which bf16 autocast runs in bf16 anyway) leave the host in bf16: half the bytes
  to pin and copy, no cast kernel on the device, the same values (host and device both round
  fp32 to bf16 to nearest even).  Everything else keeps its dtype.
* :class:`DevicePrefetch` wraps a loader: iterating it yields batches whose tensors are on the
  device already, the copy of batch *n + 1* issued on a side stream before batch *n* is handed
  out.  ``len()`` and every other attribute (``batch_sampler``, ``dataset``) are the loader's.

Module-level classes (not closures): a DataLoader with workers pickles its ``collate_fn``.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Iterator
from types import ModuleType
from typing import Any

from ...core.proof import Claim, Proof, MEASURED
from ...core.registry import Changes, Patch, TargetChanged, register
from ...shims.swap import swapped
from ...shims.training_views import TorchFusedAdamWView
from .. import _guards as guard
from ._targets import SPEC_TRAIN, TRAINER

log = logging.getLogger("spec_compat")

#: batch keys cast to bf16 on the host (fed to autocast matmuls only)
BF16_KEYS = ("hidden_states",)


class Bf16Features:
    """``collate_fn`` wrapper: the keys in ``keys`` of the collated dict, when floating point, in bf16."""

    def __init__(self, collate: Any, keys: tuple[str, ...] = BF16_KEYS) -> None:
        self.collate = collate
        self.keys = keys

    def __call__(self, samples: Any) -> Any:
        import torch

        batch = self.collate(samples)
        # only in a DataLoader worker (in parallel with the step, before pin_memory): in the main
        # process the cast would be host time in the step's path, where autocast's costs less
        if isinstance(batch, dict) and torch.utils.data.get_worker_info() is not None:
            for key in self.keys:
                value = batch.get(key)
                if isinstance(value, torch.Tensor) and value.is_floating_point() and value.dtype != torch.bfloat16:
                    batch[key] = value.to(torch.bfloat16)
        return batch


def _to(batch: Any, device: Any) -> Any:
    import torch

    if isinstance(batch, dict):
        return {k: v.to(device, non_blocking=True) if isinstance(v, torch.Tensor) else v for k, v in batch.items()}
    return batch


class DevicePrefetch:
    """A loader whose batches arrive on ``device`` (a CUDA device), each copied on a side stream
    one step ahead; the consuming stream waits for the copy and owns the memory after it."""

    def __init__(self, loader: Any, device: Any) -> None:
        self.loader = loader
        self.device = device

    def __len__(self) -> int:
        return len(self.loader)

    def __getattr__(self, name: str) -> Any:
        if name in ("loader", "device"):  # not set yet (unpickling): no recursion
            raise AttributeError(name)
        return getattr(self.loader, name)

    def __iter__(self) -> Iterator[Any]:
        import torch

        side = torch.cuda.Stream(device=self.device)
        host = iter(self.loader)

        def issue(batch: Any) -> Any:
            with torch.cuda.stream(side):
                return _to(batch, self.device)

        try:
            ahead = issue(next(host))
        except StopIteration:
            return
        while True:
            ready = ahead
            consumer = torch.cuda.current_stream(self.device)
            consumer.wait_stream(side)
            if isinstance(ready, dict):
                for value in ready.values():
                    if isinstance(value, torch.Tensor) and value.is_cuda:
                        value.record_stream(consumer)
            try:
                ahead = issue(next(host))
            except StopIteration:
                yield ready
                return
            yield ready


def _bf16_inputs(trainer: Any, model: Any, device: Any) -> None:
    """What autocast would cast on every step, cast once or on the host (same values): the frozen
    ``verifier_lm_head`` weight (no gradient, not saved, used by an autocast matmul only) in bf16;
    the loaders' ``hidden_states`` collated in bf16 and every batch copied to the device on a side
    stream one step ahead (measured on an H200 at T=4096, pure-bf16 / patched step time: 0.93 before,
    benchmarks/results/h200-train-step-profile.json; 0.99 with them, h200-train-step-run5-prefetch.json)."""
    import torch

    weight = getattr(getattr(model, "verifier_lm_head", None), "weight", None)
    if isinstance(weight, torch.nn.Parameter) and not weight.requires_grad and weight.dtype == torch.float32:
        weight.data = weight.data.to(torch.bfloat16)
    for name in ("train_loader", "val_loader"):
        loader = trainer.__dict__.get(name)
        if loader is None or isinstance(loader, DevicePrefetch):
            continue
        if isinstance(loader, torch.utils.data.DataLoader) and not isinstance(loader.collate_fn, Bf16Features):
            loader.collate_fn = Bf16Features(loader.collate_fn)
        trainer.__dict__[name] = DevicePrefetch(loader, device)


@register
class SingleDeviceBf16(Patch):
    """speculators' single-device path (train.py without torchrun) never casts model or data: it
    trains in fp32 (H200, Kimi-K2.5 draft dims, T=2048: 1267.9 ms/step vs 116.3 ms with this patch's
    first, autocast-only form, 10.9x; 17.6x at 4096; benchmarks/results/h200-train-step-run1.json).
    The FSDP path computes in bf16 with fp32 master weights; single CUDA-device runs get the same
    policy through bf16 autocast around the draft's forward, with the features collated in bf16 and
    each batch copied to the GPU one step ahead."""

    id = "single-device-bf16"
    after = ("fsdp-without-cuda",)
    proof = Proof("measured", MEASURED, benchmark="benchmarks/results/h200-train-step-run1.json", claims=(
        Claim("stock fp32 / patched ms per step, T=2048 (the patch's autocast-only form)",
              "results[mode=a,seq_len=2048].step_ms", "results[mode=b,seq_len=2048].step_ms", value="10.9"),
        Claim("stock fp32 / patched ms per step, T=4096 (the patch's autocast-only form)",
              "results[mode=a,seq_len=4096].step_ms", "results[mode=b,seq_len=4096].step_ms", value="17.6"),
        Claim("pure bf16 / patched ms per step, T=4096, fused AdamW, before bf16 features and prefetch",
              "segments.c.step_ms", "segments.b.step_ms", value="0.93",
              benchmark="benchmarks/results/h200-train-step-profile.json"),
        Claim("pure bf16 / patched ms per step, T=4096, with bf16 features and the one-step-ahead copy",
              "results[mode=c,seq_len=4096].step_ms", "results[mode=b,seq_len=4096].step_ms", value="0.99",
              benchmark="benchmarks/results/h200-train-step-run5-prefetch.json")))
    fixes = ("P-single",)
    summary = ("single-device CUDA training computes in bf16 (autocast) with fp32 master weights and fp32 "
               "optimizer state (AdamW as one fused kernel), like the FSDP path's MixedPrecisionPolicy, its "
               "features collated in bf16 and copied one step ahead; CPU and FSDP runs unchanged; "
               "SPEC_COMPAT_DISABLE=single-device-bf16 keeps fp32")
    upstream = "speculators 0.3.0-0.4.x train/trainer.py setup_model: no dtype policy without FSDP (fp32 training)"
    target = f"{TRAINER}:Trainer"
    requires = {"speculators": SPEC_TRAIN}

    def check(self, module: ModuleType) -> None:
        cls = guard.attr(module, "Trainer")
        guard.has_params(cls.setup_model, "Trainer.setup_model", "self")
        if "MixedPrecisionPolicy" in guard.source(cls, "Trainer") or "autocast" in guard.source(cls, "Trainer"):
            raise TargetChanged("Trainer already sets a precision policy itself")
        if not isinstance(module.__dict__.get("torch"), ModuleType) or \
                "torch.optim.AdamW(" not in guard.source(cls.setup_optimizer, "Trainer.setup_optimizer"):
            raise TargetChanged("Trainer.setup_optimizer no longer builds torch.optim.AdamW")

    def install(self, module: ModuleType, changes: Changes) -> None:
        def setup_model(wrapped: Any, trainer: Any, args: tuple, kwargs: dict) -> Any:
            out = wrapped(*args, **kwargs)
            model = trainer.model
            if getattr(trainer, "is_distributed", False):
                return out
            first = next(model.parameters(), None)
            if first is None or not first.is_cuda:
                log.debug("spec_compat: %s: model not on CUDA; precision unchanged", SingleDeviceBf16.id)
                return out
            forward = model.forward

            # plain function, not changes.wrap: a new attribute of the model, whose forward dynamo may trace
            @functools.wraps(forward)
            def bf16_forward(*a: Any, **kw: Any) -> Any:
                import torch

                with torch.autocast("cuda", dtype=torch.bfloat16):
                    return forward(*a, **kw)

            model.forward = bf16_forward
            trainer.__dict__["_spec_compat_fused_adamw"] = True
            _bf16_inputs(trainer, model, first.device)
            log.info("spec_compat: %s: single-device training on %s in bf16 autocast with fp32 master weights",
                     SingleDeviceBf16.id, first.device)
            return out

        def setup_optimizer(wrapped: Any, trainer: Any, args: tuple, kwargs: dict) -> Any:
            real = module.__dict__.get("torch")
            if not trainer.__dict__.get("_spec_compat_fused_adamw") or not isinstance(real, ModuleType):
                return wrapped(*args, **kwargs)
            # the same AdamW, as one fused CUDA kernel over the fp32 master weights and states
            with swapped(module, "torch", TorchFusedAdamWView(real)):  # trainer.py's own global, for this call only
                return wrapped(*args, **kwargs)

        changes.wrap(module.Trainer, "setup_model", setup_model)
        changes.wrap(module.Trainer, "setup_optimizer", setup_optimizer)
