"""speculators 0.9's fused Triton loss inside ``torch.compile``, on a CUDA device (skipped
elsewhere: the trainer compiles only when CUDA is present, and the kernels are Triton's).

The trainer compiles ``Eagle3DraftModel.forward``, which computes the loss; here a compiled
function calls the fused KL loss the same way, forward and backward.  Without
``fused-loss-own-autotune-lists`` Dynamo fails as the stock trainer does at its first step; with
it, loss and gradient equal speculators' eager implementation of the same loss."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys

import pytest

from proof_runs import proof_cases  # tests/support (on sys.path: tests/conftest.py)


def _cuda_and_fused() -> str | None:
    if importlib.util.find_spec("torch") is None:
        return "torch is not installed"
    import torch

    if not torch.cuda.is_available():
        return "no CUDA device: the trainer compiles its draft (and the fused loss runs) only on CUDA"
    if importlib.util.find_spec("speculators") is None or importlib.util.find_spec("speculators.losses.fused") is None:
        return "no speculators with fused losses (speculators.losses.fused) here"
    return None


SCRIPT = r"""
import json, sys
import spec_compat  # noqa: F401  (the registry, before speculators)
import torch
from speculators.losses.eager import kl_div_loss
from speculators.losses.fused import fused_kl_div_loss

torch.manual_seed(0)
V, T = 32000, 512
logits = torch.randn(1, T, V, device="cuda")
targets = torch.randn(1, T, V, device="cuda")


def run(fn, compiled):
    x = logits.clone().requires_grad_(True)
    body = lambda a, b: fn(a, b).sum()  # noqa: E731
    f = torch.compile(body) if compiled else body
    loss = f(x, targets)
    loss.backward()
    torch.cuda.synchronize()
    return loss.detach().double().cpu(), x.grad.double().cpu()


ref_loss, ref_grad = run(kl_div_loss, False)
loss, grad = run(fused_kl_div_loss, True)
out = {"loss": float(loss), "ref_loss": float(ref_loss), "grad_shape": list(grad.shape),
       "ref_grad_shape": list(ref_grad.shape), "finite": bool(torch.isfinite(grad).all() and torch.isfinite(loss)),
       "loss_rel": float((loss - ref_loss).abs() / ref_loss.abs()),
       "grad_rel": float((grad - ref_grad).abs().max() / ref_grad.abs().max()),
       "torch": torch.__version__, "device": torch.cuda.get_device_name()}
print("SPEC_COMPAT_RESULT " + json.dumps(out), flush=True)
"""


def _run(disable: str) -> subprocess.CompletedProcess:
    env = dict(os.environ)
    env.pop("SPEC_COMPAT_DISABLE", None)
    if disable:
        env["SPEC_COMPAT_DISABLE"] = disable
    return subprocess.run([sys.executable, "-c", SCRIPT], env=env, capture_output=True, text=True, timeout=900)


@pytest.mark.parametrize("pid", proof_cases("test_compiled_fused_loss_fails_without_the_patch"))
def test_compiled_fused_loss_fails_without_the_patch(prove, pid):
    proof = prove(pid)
    reason = _cuda_and_fused()
    if reason:
        pytest.skip(reason)
    stock = _run(proof.disable)
    assert stock.returncode != 0, stock.stdout[-2000:]
    proof.assert_symptom(stock.stderr)

    patched = _run(proof.baseline)
    assert patched.returncode == 0, patched.stderr[-4000:]
    proof.assert_absent(patched.stderr)
    line = next(ln for ln in patched.stdout.splitlines() if ln.startswith("SPEC_COMPAT_RESULT "))
    res = json.loads(line[len("SPEC_COMPAT_RESULT "):])
    print(res)
    assert res["finite"] and res["grad_shape"] == res["ref_grad_shape"] == [1, 512, 32000], res
    assert res["loss_rel"] <= 1e-4 and res["grad_rel"] <= 1e-4, res
