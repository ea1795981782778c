"""The autotuner helpers of spec_compat.patches.training.fused_loss_own_autotune_lists on stand-in tuners
(the real kernels: tests/gpu/test_fused_loss.py)."""

from __future__ import annotations

from spec_compat.patches.training.fused_loss_own_autotune_lists import own_copy, shared_containers


class Config:
    def __init__(self, block):
        self.kwargs = {"BLOCK_SIZE": block}


class Tuner:
    def __init__(self, configs, keys, flag=True):
        self.configs, self.keys, self.cache, self.flag, self.top_k = configs, keys, {}, flag, 1.0


def test_only_containers_held_by_both_are_shared():
    configs, keys = [Config(1024), Config(2048)], ["n_cols", "OP"]
    a, b = Tuner(configs, keys), Tuner(configs, keys)
    assert shared_containers(a, b) == ["configs", "keys"]  # not the per-tuner cache, not the bools / floats
    assert shared_containers(a, Tuner(list(configs), list(keys))) == []


def test_own_copy_is_new_down_to_the_config_objects_and_equal_in_value():
    configs = [Config(1024), Config(2048)]
    mine = own_copy(configs)
    assert mine is not configs and all(m is not c for m, c in zip(mine, configs))
    assert [m.kwargs for m in mine] == [c.kwargs for c in configs]
    keys = ["n_cols", "OP"]
    assert own_copy(keys) == keys and own_copy(keys) is not keys
    d = {"k": Config(8)}
    assert own_copy(d)["k"] is not d["k"] and own_copy(d)["k"].kwargs == {"BLOCK_SIZE": 8}


def test_unsharing_makes_the_tuners_independent():
    configs, keys = [Config(1024)], ["n_cols"]
    a, b = Tuner(configs, keys), Tuner(configs, keys)
    for name in shared_containers(a, b):
        setattr(b, name, own_copy(getattr(b, name)))
    assert shared_containers(a, b) == []
    b.configs.append(Config(4096))
    assert len(a.configs) == 1
