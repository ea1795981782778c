"""``eagle3-speculators-norm-flags`` on stand-ins for vLLM's ``speculators/algos.py``: the patch's
own class in a fresh registry.  vLLM 0.15.1 names the second parameter ``vllm_config`` and its
caller passes both by keyword; 0.16.0 names it ``pre_trained_config``.  The real draft served by
both releases is tests/server/test_speculators_pipeline.py's."""

from __future__ import annotations

import pytest

from spec_compat.core.registry import Registry, Status
from spec_compat.patches.serving import eagle3_speculators_norm_flags

SPEC = {"draft_vocab_size": 64, "norm_before_fc": True, "fc_norm": False, "norm_output": True}


def update_eagle3_v15(config_dict: dict, vllm_config: dict) -> None:
    vllm_config["draft_vocab_size"] = config_dict.get("draft_vocab_size")


def update_eagle3_v16(config_dict: dict, pre_trained_config: dict) -> None:
    pre_trained_config["draft_vocab_size"] = config_dict.get("draft_vocab_size")


def update_eagle3_drifted(config_dict: dict, config: dict, extra: dict) -> None:
    config["draft_vocab_size"] = config_dict.get("draft_vocab_size")


def _apply(fake_module, fn):
    mod = fake_module(update_eagle3=fn, SUPPORTED_SPECULATORS_TYPES={"eagle3": fn})
    cls = type("Flags", (eagle3_speculators_norm_flags.Eagle3SpeculatorsNormFlags,),
               {"target": f"{mod.__name__}:update_eagle3", "requires": {}})
    reg = Registry()
    reg.register(cls)
    reg.apply(environ={})
    (rec,) = reg.records()
    return reg, mod, rec


@pytest.mark.parametrize("fn, second", [(update_eagle3_v15, "vllm_config"),
                                        (update_eagle3_v16, "pre_trained_config")])
def test_flags_reach_the_draft_config_by_keyword_and_by_position(fake_module, fn, second):
    reg, mod, rec = _apply(fake_module, fn)
    try:
        assert rec.status is Status.APPLIED, rec.reason
        updater = mod.SUPPORTED_SPECULATORS_TYPES["eagle3"]
        by_keyword: dict = {}
        updater(config_dict=dict(SPEC), **{second: by_keyword})  # how vLLM 0.15.1 calls it
        by_position: dict = {}
        updater(dict(SPEC), by_position)
        want = {"draft_vocab_size": 64, "norm_before_fc": True, "fc_norm": False, "norm_output": True}
        assert by_keyword == want and by_position == want
        with pytest.raises(TypeError):
            updater(config_dict=dict(SPEC), wrong_name={})  # the stock signature is kept
    finally:
        reg.revert()
    assert mod.SUPPORTED_SPECULATORS_TYPES["eagle3"] is fn and mod.update_eagle3 is fn


def test_a_third_parameter_is_target_changed(fake_module):
    reg, mod, rec = _apply(fake_module, update_eagle3_drifted)
    assert rec.status is Status.TARGET_CHANGED
    assert "takes (config_dict, config, extra)" in rec.reason
    assert mod.SUPPORTED_SPECULATORS_TYPES["eagle3"] is update_eagle3_drifted
