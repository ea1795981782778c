"""The batches of ``spec_compat.patches.training.single_device_bf16`` on CPU: the bf16 cast happens in
loader workers only (never in the main process), leaves other keys alone, and gives the device cast's
values; the prefetching loader keeps the loader's length and attributes.  The CUDA side stream is tests/gpu/test_batches_cuda.py's."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from spec_compat.patches.training.single_device_bf16 import Bf16Features, DevicePrefetch  # noqa: E402


class Rows(torch.utils.data.Dataset):
    def __len__(self):
        return 3

    def __getitem__(self, i):
        g = torch.Generator().manual_seed(i)
        return {"hidden_states": torch.randn(2, 8, 12, generator=g), "verifier_last_hidden_states": torch.randn(2, 8, 4),
                "input_ids": torch.arange(8), "lengths": [8]}


def _loader(workers):
    loader = torch.utils.data.DataLoader(Rows(), batch_size=None, num_workers=workers)
    loader.collate_fn = Bf16Features(loader.collate_fn)
    return loader


def test_cast_in_workers_only_and_equal_to_the_device_cast():
    in_main = list(_loader(0))
    assert all(b["hidden_states"].dtype == torch.float32 for b in in_main)
    in_workers = list(_loader(2))
    assert len(in_workers) == 3
    for i, (b, ref) in enumerate(zip(in_workers, in_main)):
        assert b["hidden_states"].dtype == torch.bfloat16, i
        assert b["verifier_last_hidden_states"].dtype == torch.float32  # the O7 norm runs on it in fp32
        assert b["input_ids"].dtype == torch.int64 and b["lengths"] == [8]
        assert torch.equal(b["hidden_states"], ref["hidden_states"].to(torch.bfloat16))
        assert torch.isfinite(b["hidden_states"].float()).all()


def test_prefetch_keeps_the_loaders_length_and_attributes():
    loader = _loader(0)
    wrapped = DevicePrefetch(loader, "cuda:0")
    assert len(wrapped) == 3
    assert wrapped.batch_sampler is loader.batch_sampler and wrapped.dataset is loader.dataset
    with pytest.raises(AttributeError):
        wrapped.no_such_attribute  # noqa: B018
