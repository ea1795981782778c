"""On a CUDA device, ``quantize_rows`` gives the bytes hs-connectors 0.9.0's fp8 connector writes from
the same rows on the host (tensors and the safetensors file), at Kimi-K2.5 width; skipped elsewhere."""

from __future__ import annotations

import hashlib
import importlib.util

import pytest

torch = pytest.importorskip("torch")
if not torch.cuda.is_available():
    pytest.skip("no CUDA device", allow_module_level=True)
if importlib.util.find_spec("hs_connectors") is None:
    pytest.skip("hs-connectors is not installed here", allow_module_level=True)

from spec_compat.shims.hidden_states.fp8_rows import SCALES_KEY, quantize_rows  # noqa: E402


@pytest.mark.parametrize("seed", [0, 1])
def test_device_quantization_writes_hs_connectors_bytes(tmp_path, seed):
    from hs_connectors.fp8_utils import quantize_tensor_to_fp8
    from safetensors.torch import save_file

    g = torch.Generator(device="cuda").manual_seed(seed)
    dev = torch.randn(4096, 4, 7168, generator=g, device="cuda", dtype=torch.bfloat16) * 3
    dev[7] = 0
    ids = torch.arange(4096)
    host = dev.cpu()
    ref_q, ref_s = quantize_tensor_to_fp8(host)  # hs-connectors' writer: on the host
    q, s = quantize_rows(dev)
    assert q.device.type == "cuda" and q.dtype == torch.float8_e4m3fn and s.dtype == torch.float32
    q, s = q.cpu(), s.cpu()
    assert (q.view(torch.uint8) != ref_q.view(torch.uint8)).sum().item() == 0
    assert torch.equal(s.view(torch.int32), ref_s.view(torch.int32))
    files = {}
    for name, (fq, fs) in {"host": (ref_q, ref_s), "device": (q, s)}.items():
        path = tmp_path / f"{name}.safetensors"
        save_file({"hidden_states": fq, "token_ids": ids, SCALES_KEY: fs}, str(path))
        files[name] = hashlib.sha256(path.read_bytes()).hexdigest()
    assert files["host"] == files["device"]
