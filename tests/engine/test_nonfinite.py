"""A checkpoint with one NaN weight: ``spec-compat selftest`` must fail naming the first layer
with non-finite values and the side (issue 19: the llama fixture with a NaN in layer 2's
``mlp.down_proj`` used to pass, "max|diff|=2.38e-07", because ``max(0.0, nan) == 0.0``).
One engine start (the ``short`` check only)."""

from __future__ import annotations

import subprocess
import sys

import pytest

from spec_compat import REGISTRY

pytestmark = pytest.mark.engine

WEIGHT = "model.layers.2.mlp.down_proj.weight"


def test_selftest_fails_on_a_nan_weight_naming_the_layer(tmp_path, selftest):
    import torch
    from safetensors.torch import load_file, save_file

    model = tmp_path / "llama-nan"
    subprocess.run([sys.executable, "-m", "spec_compat", "fixture", "llama", str(model)], check=True,
                   stdout=subprocess.DEVNULL)
    (path,) = sorted(model.glob("*.safetensors"))
    weights = load_file(str(path))
    assert weights[WEIGHT].dtype == torch.float32 and bool(torch.isfinite(weights[WEIGHT]).all())
    weights[WEIGHT][5, 7] = float("nan")
    save_file(weights, str(path), metadata={"format": "pt"})
    proc = selftest(model, "short")
    out = proc.stdout
    print(out[-3000:], proc.stderr[-3000:])
    assert proc.returncode != 0, out
    assert "selftest: FAILED (1 failed)" in out, out
    (line,) = [x for x in out.splitlines() if x.startswith(("PASS short", "FAIL short"))]
    # row 5 of layer 2's down_proj is NaN: hidden dimension 5 of layer 2's output, in all 7 tokens
    assert line == ("FAIL short: sequence 0 layer 2: non-finite values: engine has 7 non-finite (7 NaN), "
                    "first at [0, 5]; reference has 7 non-finite (7 NaN), first at [0, 5]"), line
    if REGISTRY.get("generator-input-checks").needed()[0]:  # speculators 0.3 / 0.4
        # selftest runs the guard with SPEC_COMPAT_NONFINITE=warn: the counts are logged, per layer
        assert ("spec_compat[generator-input-checks]: sequence 0 layer 2: 7 of 1792 captured values are "
                "non-finite (NaN/inf)") in proc.stderr, proc.stderr[-3000:]
        assert "per sequence/layer: 0/2: 7, 0/3: 1792" in proc.stderr, proc.stderr[-3000:]
