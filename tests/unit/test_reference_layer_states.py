"""spec_compat.verify.reference.layer_states: the one hook implementation behind
``reference_states`` (layer outputs) and ``hidden_states_reference.reference_rows`` (vLLM's ids)."""

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from spec_compat.verify.hidden_states_reference import reference_rows  # noqa: E402
from spec_compat.verify.reference import layer_states, reference_states  # noqa: E402


@pytest.fixture(scope="module")
def model():
    torch.manual_seed(0)
    cfg = transformers.LlamaConfig(vocab_size=64, hidden_size=16, intermediate_size=32, num_hidden_layers=3,
                                   num_attention_heads=2, num_key_value_heads=2, max_position_embeddings=32)
    return transformers.LlamaForCausalLM(cfg).eval()


IDS = [1, 5, 9, 3, 7]


def test_inputs_and_outputs_match_transformers_hidden_states(model):
    with torch.no_grad():
        hs = model(torch.tensor([IDS]), output_hidden_states=True).hidden_states  # [emb, out 0, .., norm(out N-1)]
    # transformers 5 records output_hidden_states through hooks of its own, which stay on the layers
    hooks = [(dict(layer._forward_hooks), dict(layer._forward_pre_hooks)) for layer in model.model.layers]
    got = layer_states(model, IDS, [(0, "input"), (1, "input"), (0, "output"), (1, "output"), (2, "input")])
    for g, want in zip(got, [hs[0], hs[1], hs[1], hs[2], hs[2]]):
        assert g.shape == (len(IDS), 16)
        torch.testing.assert_close(g, want[0])
    assert [(dict(layer._forward_hooks), dict(layer._forward_pre_hooks)) for layer in model.model.layers] == hooks
    with pytest.raises(ValueError):
        layer_states(model, IDS, [(0, "middle")])


def test_both_callers_read_the_same_taps(model):
    outs = reference_states(model, IDS, [0, 2])
    ins = layer_states(model, IDS, [(1, "input")])
    rows = reference_rows(model, IDS, [3, 1, 0])  # id N = 3: the last layer's output
    assert rows.shape == (len(IDS), 3, 16)
    torch.testing.assert_close(rows[:, 0], outs[1])
    torch.testing.assert_close(rows[:, 1], ins[0])
    with pytest.raises(ValueError):
        reference_rows(model, IDS, [4])
