"""``DevicePrefetch`` on a CUDA device: each batch arrives on the device with the host's values,
in order, while the consuming stream is busy (a long matmul queued before every read); with
``Bf16Features`` in pinned loader workers the features equal the device's own bf16 cast."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
if not torch.cuda.is_available():
    pytest.skip("no CUDA device", allow_module_level=True)

from spec_compat.patches.training.single_device_bf16 import Bf16Features, DevicePrefetch  # noqa: E402

N = 12


class Rows(torch.utils.data.Dataset):
    def __len__(self):
        return N

    def __getitem__(self, i):
        g = torch.Generator().manual_seed(i)
        return {"hidden_states": torch.randn(1, 4096, 3 * 1024, generator=g), "input_ids": torch.full((1, 4096), i),
                "verifier_last_hidden_states": torch.randn(1, 4096, 1024, generator=g)}


@pytest.mark.parametrize("workers", [0, 2])
def test_prefetched_batches_equal_the_host_batches(workers):
    loader = torch.utils.data.DataLoader(Rows(), batch_size=None, num_workers=workers, pin_memory=True)
    loader.collate_fn = Bf16Features(loader.collate_fn)
    busy = torch.randn(8192, 8192, device="cuda")
    seen = 0
    for i, batch in enumerate(DevicePrefetch(loader, torch.device("cuda", 0))):
        busy = (busy @ busy).clamp_(-1, 1)  # the consumer's stream is behind the side stream's copy
        ref = Rows()[i]
        assert all(v.is_cuda for v in batch.values())
        assert int(batch["input_ids"][0, 0]) == i and batch["input_ids"].shape == (1, 4096)
        want_dtype = torch.bfloat16 if workers else torch.float32
        assert batch["hidden_states"].dtype == want_dtype
        assert torch.equal(batch["hidden_states"], ref["hidden_states"].cuda().to(want_dtype))
        assert torch.equal(batch["verifier_last_hidden_states"], ref["verifier_last_hidden_states"].cuda())
        seen += 1
    torch.cuda.synchronize()
    assert seen == N and torch.isfinite(busy).all()
