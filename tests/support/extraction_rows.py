"""One check for the in-process generator's extraction: every result of ``gen.generate(batch)``
equals the transformers reference (selftest's ``compare``, NaN-safe) and has one row per token
in every captured layer.  Used by tests/engine/test_extraction.py and test_block_size_64.py."""

from __future__ import annotations


def assert_rows_match(gen, ref, layer_ids: list[int], batches: list[list[list[int]]], name: str) -> None:
    from spec_compat.cli.selftest import TOLERANCE, compare
    from spec_compat.verify.reference import reference_states

    for batch in batches:
        results = gen.generate(batch)
        ok, worst, detail = compare(results, batch, layer_ids, lambda ids: reference_states(ref, ids, layer_ids))
        print(f"{name}: {detail}")
        assert ok, detail
        assert worst <= TOLERANCE
        for res, ids in zip(results, batch):
            assert [h.shape[0] for h in res["hidden_states"]] == [len(ids)] * len(layer_ids)
