"""The real registry on the real target modules: apply -> revert -> apply restores
upstream's objects exactly, and concurrent apply() from threads installs each patch once.
(tests/unit covers the same with fake patches.)"""

from __future__ import annotations

import threading

from faults_support import PATCHES, records_of, state_diff, target_state

from spec_compat import REGISTRY
from spec_compat.core import bindings
from spec_compat.core.registry import Registry

THREADS = 8


def full_registry() -> Registry:
    reg = Registry()
    for p in PATCHES:
        reg.register(type(p))
    return reg


def test_apply_revert_apply_restores_upstream_exactly(real_targets):
    stock = real_targets.stock
    reg = full_registry()
    first = reg.apply(environ={})
    patched = target_state(real_targets.modules)
    changed = state_diff(stock, patched)
    applied = [r.id for r in first if r.status.value == "applied"]
    assert (not applied) or changed, "applied patches changed nothing on their targets"
    for _ in range(3):
        reg.revert()
        assert state_diff(stock, target_state(real_targets.modules)) == []
        assert reg.records() == [] and not any(k[0] in real_targets.modules for k in bindings._ADAPTERS)
        again = reg.apply(environ={})
        assert [(r.id, r.status, r.reason) for r in again] == [(r.id, r.status, r.reason) for r in first]
        # the same attributes changed as after the first apply
        assert state_diff(stock, target_state(real_targets.modules)) == changed
    reg.revert()
    assert state_diff(stock, target_state(real_targets.modules)) == []


def test_global_registry_revert_and_reapply_decides_the_same(real_targets):
    """The fixture reverted the global registry; applying it again decides as before."""
    REGISTRY.apply()
    try:
        now = records_of(REGISTRY)
        assert {k: v[0] for k, v in now.items()} == {k: v[0] for k, v in real_targets.global_before.items()}
    finally:
        REGISTRY.revert()
    assert state_diff(real_targets.stock, target_state(real_targets.modules)) == []


def test_concurrent_apply_of_the_real_registry(real_targets):
    single = full_registry()
    expected = [(r.id, r.status, r.reason) for r in single.apply(environ={})]
    expected_state = state_diff(real_targets.stock, target_state(real_targets.modules))
    single.revert()

    reg = full_registry()
    barrier = threading.Barrier(THREADS)
    results, errors = [], []

    def worker():
        try:
            barrier.wait(timeout=30)
            results.append([(r.id, r.status, r.reason) for r in reg.apply(environ={})])
        except BaseException as exc:  # reported below
            errors.append(exc)

    threads = [threading.Thread(target=worker) for _ in range(THREADS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    try:
        assert not any(t.is_alive() for t in threads) and errors == []
        assert results == [expected] * THREADS
        assert state_diff(real_targets.stock, target_state(real_targets.modules)) == expected_state
    finally:
        reg.revert()
    # a patch installed twice would have lost its first undo log: the revert would leave traces
    assert state_diff(real_targets.stock, target_state(real_targets.modules)) == []
