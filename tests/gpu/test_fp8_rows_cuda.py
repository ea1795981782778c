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

from spec_compat.patches.hidden_states.ehs_config.fp8_rows import SCALES_KEY, quantize_rows  # noqa: E402


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


def _host_path_file(tmp_path, host_rows, ids, name="host"):
    """The file hs-connectors' fp8 writer saves for rows on the host: quantized there, ``{**tensors,
    "hidden_states": fp8, SCALES_KEY: scales}``, no metadata (its ``_write_tensors``)."""
    from hs_connectors.fp8_utils import quantize_tensor_to_fp8
    from safetensors.torch import save_file

    q, s = quantize_tensor_to_fp8(host_rows)
    path = tmp_path / f"{name}.safetensors"
    save_file({"hidden_states": q, "token_ids": ids, SCALES_KEY: s}, str(path))
    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.mark.parametrize("seed", [0, 1])
def test_connector_device_branch_writes_the_host_paths_file(tmp_path, seed):
    """The connector's device branch as it runs (``fp8_rows.device_fp8`` -> ``BackgroundWriter.submit``):
    quantized on the GPU, fp8 rows and scales copied to pinned memory behind a CUDA event that the writer
    thread waits on, saved without metadata: the file hs-connectors' writer saves from the same rows on
    the host, byte for byte."""
    from spec_compat.patches.hidden_states.ehs_config.fp8_rows import device_fp8
    from spec_compat.shims.hidden_states.writer import BackgroundWriter

    g = torch.Generator(device="cuda").manual_seed(seed)
    dev = torch.randn(4096, 4, 7168, generator=g, device="cuda", dtype=torch.bfloat16) * 3
    dev[7] = 0
    ids = list(range(4096))
    tensors, metadata, ready, write = device_fp8(dev, ids)
    assert isinstance(ready, torch.cuda.Event) and metadata is None
    assert all(t.device.type == "cpu" for t in tensors.values()) and tensors["hidden_states"].is_pinned()
    assert tensors["hidden_states"].dtype == torch.float8_e4m3fn  # fp8 crossed PCIe, not bf16
    w = BackgroundWriter()
    path = tmp_path / "device.safetensors"
    w.submit(str(path), tensors, metadata, ready, write)
    assert w.drain(timeout=120) and w.written == 1
    assert hashlib.sha256(path.read_bytes()).hexdigest() == _host_path_file(tmp_path, dev.cpu(), torch.tensor(ids))


def test_connector_takes_the_device_branch_on_cuda(tmp_path, monkeypatch):
    """The connector (vLLM 0.15/0.16 backport; needs vLLM) with hs-connectors' fp8 writer and a store on
    the GPU: ``wait_for_save`` quantizes on the device (``device_fp8`` called once, with the CUDA rows) and
    the file equals the host path's for the same rows."""
    import importlib
    import sys
    import types
    from types import SimpleNamespace

    pytest.importorskip("vllm")
    from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorRole

    from spec_compat.patches.hidden_states.ehs_config import connector as mod
    from spec_compat.shims.hidden_states.contract import SETTINGS_KEY
    from spec_compat.shims.hidden_states.files import final_path
    from spec_compat.patches.hidden_states.ehs_capture import HiddenStatesStore

    base = "vllm.distributed.kv_transfer.kv_connector.v1.example_hidden_states_connector"
    if importlib.util.find_spec(base) is None:  # vLLM 0.15/0.16: patch ehs-connector-module's module
        stand_in = types.ModuleType(base)
        stand_in.ExampleHiddenStatesConnector = mod.HiddenStatesConnector
        monkeypatch.setitem(sys.modules, base, stand_in)
    fp8_write = vars(importlib.import_module("hs_connectors.fp8_hidden_states_connector")
                     .FP8HiddenStatesConnector)["_write_tensors"].__func__
    cls = type("FP8HiddenStatesConnector", (mod.HiddenStatesConnector,), {"_write_tensors": staticmethod(fp8_write)})
    settings = {"layer_ids": [1, 3], "num_hidden_layers": 4, "hidden_size": 7168, "storage": str(tmp_path)}
    config = SimpleNamespace(kv_transfer_config=SimpleNamespace(kv_connector_extra_config={SETTINGS_KEY: settings}))
    sched, worker = mod.HiddenStatesConnector(config, KVConnectorRole.SCHEDULER), cls(config, KVConnectorRole.WORKER)
    store = HiddenStatesStore((1, 3), 7168, 64, 16, torch.bfloat16, "cuda")
    store.cache.copy_(torch.randn(store.cache.shape, device="cuda", generator=torch.Generator(device="cuda")
                                  .manual_seed(2)) * 5)
    worker.attach_store(store)
    calls = []
    real = mod.device_fp8
    monkeypatch.setattr(mod, "device_fp8", lambda rows, ids: calls.append(rows.device.type) or real(rows, ids))
    prompt = list(range(100, 100 + 600))
    blocks = list(range(40))[::-1][:38]
    new = SimpleNamespace(req_id="r", prompt_token_ids=prompt, block_ids=(blocks,), num_computed_tokens=0)
    cached = SimpleNamespace(req_ids=[], resumed_req_ids=set(), new_block_ids=[], num_computed_tokens=[])
    meta = sched.build_connector_meta(SimpleNamespace(scheduled_new_reqs=[new], scheduled_cached_reqs=cached,
                                                      num_scheduled_tokens={"r": len(prompt)}))
    worker.bind_connector_metadata(meta)
    worker.wait_for_save()
    assert worker.drain(timeout=120) and worker.writes == 1 and calls == ["cuda"]
    path = final_path(tmp_path, "r")
    host = store.rows(blocks, len(prompt)).cpu()
    with open(path, "rb") as f:
        written = hashlib.sha256(f.read()).hexdigest()
    assert written == _host_path_file(tmp_path, host, torch.tensor(prompt, dtype=torch.int64))
