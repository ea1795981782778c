"""``spec_compat.patches.hidden_states.ehs_config.fp8_rows.quantize_rows`` on the CPU: hs-connectors 0.9.0's bytes
(where hs-connectors is installed), within the e4m3 per-token bound, and clear errors on bad rows.
The same bytes on a CUDA device: tests/gpu/test_fp8_rows_cuda.py."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
if not hasattr(torch, "float8_e4m3fn"):
    pytest.skip("this torch has no float8_e4m3fn", allow_module_level=True)

from spec_compat.patches.hidden_states.ehs_config.fp8_rows import quantize_rows  # noqa: E402
from spec_compat.verify.fp8 import check_fp8_rows  # noqa: E402


def rows(dtype=torch.bfloat16, seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(96, 4, 160, generator=g) * torch.logspace(-4, 3, 96)[:, None, None]
    x[5] = 0.0  # a token of zeros: the scale's clamp
    x[9, :, :3] = 1e-7  # values deep in e4m3's subnormals after scaling
    x[11, 0, 0] = 3e4  # an outlier that sets its token's scale
    return x.to(dtype)


# in a child process: importing hs_connectors applies this process's registry to it (post-import hooks)
SAME_BYTES = r"""
import sys, torch
sys.path.insert(0, sys.argv[1])
from test_fp8_rows import rows
from spec_compat.patches.hidden_states.ehs_config.fp8_rows import quantize_rows
from hs_connectors.fp8_utils import quantize_tensor_to_fp8
for dtype in (torch.bfloat16, torch.float32, torch.float16):
    x = rows(dtype)
    (q, s), (rq, rs) = quantize_rows(x), quantize_tensor_to_fp8(x)
    assert q.dtype == rq.dtype == torch.float8_e4m3fn and q.shape == rq.shape == x.shape, (q.dtype, q.shape)
    assert s.dtype == rs.dtype == torch.float32 and s.shape == rs.shape == (x.shape[0], 1, 1), (s.dtype, s.shape)
    print(dtype, int((q.view(torch.uint8) != rq.view(torch.uint8)).sum()), int((s.view(torch.int32) != rs.view(torch.int32)).sum()))
"""


@pytest.mark.skipif(importlib.util.find_spec("hs_connectors") is None, reason="hs-connectors is not installed here")
def test_bytes_equal_hs_connectors_quantization():
    proc = subprocess.run([sys.executable, "-c", SAME_BYTES, str(Path(__file__).parent)], capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    lines = proc.stdout.split("\n")[:3]
    assert [line.split()[1:] for line in lines] == [["0", "0"]] * 3, proc.stdout  # differing fp8 bytes, scales


def test_rows_come_back_within_the_e4m3_bound():
    x = rows(torch.float32)
    q, s = quantize_rows(x)
    back = q.to(torch.bfloat16) * s.to(torch.bfloat16)
    assert torch.isfinite(back).all()
    keep = [i for i in range(x.shape[0]) if i != 5]  # token 5 (zeros) is checked below: the bound needs max|x| > 0
    check = check_fp8_rows(back[keep], x[keep], s[keep], slack=0.0)
    assert check, check.detail
    assert float(s[5]) == pytest.approx(1e-12)  # zeros: the clamped scale, zeros back
    assert not back[5].any()


@pytest.mark.parametrize("bad, words", [
    (torch.zeros(8, 4, dtype=torch.int64), "floating tensor"),
    (torch.zeros(8), "2 or more dims"),
    ([1.0, 2.0], "list"),
])
def test_bad_rows_are_refused_by_name(bad, words):
    with pytest.raises(ValueError, match=words):
        quantize_rows(bad)
