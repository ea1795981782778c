"""T4 in a training-only cell: a saved draft reloads with speculators' own loader
(``Eagle3DraftModel.from_pretrained``) - on transformers 5 too, where the loader builds on
the meta device and expects ``post_init`` - with every saved tensor, and runs forward."""

from __future__ import annotations



def test_saved_draft_reloads_with_speculators_loader(llama_dir, tmp_path):
    import t1_steps
    from safetensors.torch import load_file
    from speculators.models.eagle3 import Eagle3DraftModel

    from spec_compat.verify.compare import compare_identical

    draft = t1_steps.build_draft(t1_steps.build_config(llama_dir))
    draft.save_pretrained(tmp_path)
    saved = load_file(str(tmp_path / "model.safetensors"))
    loaded = Eagle3DraftModel.from_pretrained(str(tmp_path))
    state = loaded.state_dict()
    assert saved and all(compare_identical(state[k].to(v.dtype), v) for k, v in saved.items())
    assert int(loaded.t2d.sum()) == int(draft.t2d.sum()) and compare_identical(loaded.d2t, draft.d2t)
    t1_steps.forward(loaded)  # the attention implementation survives the reload
