"""apply() from many threads at once installs every patch exactly once."""

from __future__ import annotations

import importlib
import threading
import time

from spec_compat.core.registry import Changes, Status

THREADS = 8


def run_concurrently(fn, n=THREADS):
    barrier = threading.Barrier(n)
    errors: list[BaseException] = []
    results: list = []

    def worker():
        try:
            barrier.wait(timeout=10)
            results.append(fn())
        except BaseException as exc:  # reported below
            errors.append(exc)

    threads = [threading.Thread(target=worker) for _ in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=20)
    assert not any(t.is_alive() for t in threads), "a thread hung"
    assert errors == []
    return results


def slow_counting_install(counter: dict, key: str):
    def install(module, changes: Changes):
        n = counter.get(key, 0)
        time.sleep(0.01)          # widen the window a racy registry would lose in
        counter[key] = n + 1
        changes.setattr(module, key, f"patched-{counter[key]}")

    return install


def test_concurrent_apply_installs_each_patch_once(registry, fake_module, make_patch):
    names = [f"a{i}" for i in range(4)]
    mod = fake_module(**{n: n for n in names})
    counter: dict[str, int] = {}
    patches = [make_patch(f"{mod.__name__}:{n}", install=slow_counting_install(counter, n)) for n in names]

    results = run_concurrently(lambda: registry.apply(environ={}))

    assert counter == {n: 1 for n in names}
    assert all(len(p.calls) == 1 for p in patches)
    assert all(getattr(mod, n) == "patched-1" for n in names)
    assert len(results) == THREADS
    assert all([r.status for r in res] == [Status.APPLIED] * len(names) for res in results)


def test_concurrent_apply_and_revert_rounds(registry, fake_module, make_patch):
    mod = fake_module(a="orig")
    counter: dict[str, int] = {}
    p = make_patch(f"{mod.__name__}:a", install=slow_counting_install(counter, "a"))
    for round_ in range(1, 4):
        run_concurrently(lambda: registry.apply(environ={}))
        assert len(p.calls) == round_
        assert mod.a == f"patched-{round_}"
        registry.revert()
        assert mod.a == "orig"


def test_concurrent_apply_of_pending_patch_then_import(registry, make_patch, module_file):
    name = module_file("a = 'orig'\n")
    counter: dict[str, int] = {}
    p = make_patch(f"{name}:a", install=slow_counting_install(counter, "a"))

    run_concurrently(lambda: registry.apply(environ={}))
    assert registry.status(p.id) is Status.PENDING

    mods = run_concurrently(lambda: importlib.import_module(name))

    assert all(m is mods[0] for m in mods)
    assert counter == {"a": 1} and len(p.calls) == 1
    assert mods[0].a == "patched-1"
    assert registry.status(p.id) is Status.APPLIED
