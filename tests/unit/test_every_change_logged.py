"""Every change to a target goes through the undo log (issue #43, item 3): a keyword adapter on a
consumer's binding (``bindings.adapt_call``), an item of a mapping the target reads (``Changes.setitem``:
a registry entry, a pydantic validator table) -- each is reverted by undo, named by
the patch's record (``Record.touched``), and seen by the stacking check: a second applied patch on the same target
without a declared ``after`` is refused and rolled back, exactly as for a wrapped attribute."""

from __future__ import annotations

import dataclasses
import logging

import pytest

from spec_compat import REGISTRY
from spec_compat import patches  # noqa: F401  (registers every patch)
from spec_compat.core import bindings
from spec_compat.core.registry import Changes, Registry, Status


@dataclasses.dataclass
class Config:
    size: int
    is_encoder_decoder: bool
    async_scheduling: bool = True


def touched(registry: Registry, pid: str) -> tuple[str, ...]:
    """What the record of ``pid`` says its installation changed."""
    return {r.id: r for r in registry.records()}[pid].touched


def _default(key, value, trace):
    def adapt(kw):
        trace.append(key)
        kw.setdefault(key, value)
        return kw

    return adapt


# -- adapt_call ----------------------------------------------------------------

def test_a_second_unordered_adapter_is_refused_and_rolled_back(registry: Registry, fake_module, make_patch):
    mod = fake_module(Config=Config)
    trace: list[str] = []
    first = make_patch(f"{mod.__name__}:Config", pid="first-adapter",
                       install=lambda m, ch: bindings.adapt_call(ch, m, "Config",
                                                                 _default("is_encoder_decoder", False, trace)))
    second = make_patch(f"{mod.__name__}:Config", pid="second-adapter",
                        install=lambda m, ch: bindings.adapt_call(ch, m, "Config",
                                                                  _default("async_scheduling", False, trace)))
    registry.apply(environ={})
    assert registry.status(first.id) is Status.APPLIED
    rec = {r.id: r for r in registry.records()}[second.id]
    assert rec.status is Status.FAILED
    assert f"it changes {mod.__name__}.Config (keyword arguments adapted), which patch first-adapter " \
           "replaced first, without a declared order" in rec.reason
    assert "add after = ('first-adapter',)" in rec.reason
    # the refused adapter left nothing behind: only the first one runs
    assert mod.Config(size=1) == Config(1, False, True) and trace == ["is_encoder_decoder"]
    registry.revert()
    assert mod.Config is Config and (mod.__name__, "Config") not in bindings._ADAPTERS


def test_declared_adapters_apply_in_their_order_and_revert_restores_the_original(registry: Registry, fake_module,
                                                                                  make_patch):
    mod = fake_module(Config=Config)
    trace: list[str] = []
    # registered first, declared second: the declaration decides the chain's order
    make_patch(f"{mod.__name__}:Config", pid="later-adapter", after=("earlier-adapter",),
               install=lambda m, ch: bindings.adapt_call(ch, m, "Config", _default("async_scheduling", False, trace)))
    make_patch(f"{mod.__name__}:Config", pid="earlier-adapter",
               install=lambda m, ch: bindings.adapt_call(ch, m, "Config",
                                                         _default("is_encoder_decoder", False, trace)))
    registry.apply(environ={})
    assert {r.status for r in registry.records()} == {Status.APPLIED}
    assert mod.Config(size=2) == Config(2, False, False)
    assert trace == ["is_encoder_decoder", "async_scheduling"]
    assert touched(registry, "later-adapter") == (f"{mod.__name__}.Config (keyword arguments adapted)",)
    assert touched(registry, "earlier-adapter") == (f"{mod.__name__}.Config (keyword arguments adapted)",)
    assert {r.id: r.as_dict() for r in registry.records()}["later-adapter"]["touched"] == \
        [f"{mod.__name__}.Config (keyword arguments adapted)"]  # what `spec-compat report --json` lists
    registry.revert()
    assert mod.Config is Config and (mod.__name__, "Config") not in bindings._ADAPTERS


def test_a_method_chain_is_named_in_what_the_patch_touched(registry: Registry, fake_module, make_patch):
    class Scheduler:
        def step(self):
            return "step"

    mod = fake_module(Scheduler=Scheduler)
    p = make_patch(f"{mod.__name__}:Scheduler",
                   install=lambda m, ch: bindings.wrap_method(ch, m, "Scheduler", "step",
                                                              lambda w, i, a, k: w(*a, **k) + "!"))
    registry.apply(environ={})
    assert touched(registry, p.id) == (f"{mod.__name__}.Scheduler.step (wrapper chain)",)
    registry.revert()
    assert mod.Scheduler is Scheduler


# -- setitem ---------------------------------------------------------------------

def test_setitem_is_undone_and_runs_then_after_the_set_and_after_the_restore():
    table = {"check": "stock"}
    seen: list[dict] = []
    c = Changes("a-patch")
    c.setitem(table, "check", "patched", label="Thing validator check", then=lambda: seen.append(dict(table)))
    c.setitem(table, "extra", 1, label="Thing extra")
    assert table == {"check": "patched", "extra": 1} and seen == [{"check": "patched"}]
    assert c.described() == ["Thing validator check", "Thing extra"]
    c.undo()
    assert table == {"check": "stock"}  # the old item back, the new key gone
    assert seen[-1] == {"check": "stock"}  # `then` ran after the restore (a rebuild sees the original)


def test_setitem_leaves_a_later_replacement_alone(caplog):
    table = {"check": "stock"}
    c = Changes("a-patch")
    c.setitem(table, "check", "patched", label="Thing validator check")
    table["check"] = "someone else's"
    with caplog.at_level(logging.WARNING, logger="spec_compat"):
        c.undo()
    assert table["check"] == "someone else's"
    assert "Thing validator check was replaced by someone else" in caplog.text


def test_two_unordered_patches_on_one_item_are_refused_and_ordered_ones_apply(fake_module, make_patch):
    table = {"check": lambda: []}
    mod = fake_module(TABLE=table)

    def adding(pid):
        def install(m, ch):
            inner = m.TABLE["check"]
            ch.setitem(m.TABLE, "check", lambda: [*inner(), pid], label=f"{m.__name__}.TABLE['check']")
        return install

    stock = table["check"]
    unordered = Registry()
    make_patch(f"{mod.__name__}:TABLE", pid="item-a", install=adding("item-a"), reg=unordered)
    make_patch(f"{mod.__name__}:TABLE", pid="item-b", install=adding("item-b"), reg=unordered)
    unordered.apply(environ={})
    rec = {r.id: r for r in unordered.records()}["item-b"]
    assert rec.status is Status.FAILED
    assert f"it changes {mod.__name__}.TABLE['check'], which patch item-a replaced first" in rec.reason
    assert table["check"]() == ["item-a"]
    unordered.revert()
    assert table["check"] is stock

    ordered = Registry()
    make_patch(f"{mod.__name__}:TABLE", pid="item-d", after=("item-c",), install=adding("item-d"), reg=ordered)
    make_patch(f"{mod.__name__}:TABLE", pid="item-c", install=adding("item-c"), reg=ordered)
    ordered.apply(environ={})
    assert table["check"]() == ["item-c", "item-d"]
    ordered.revert()
    assert table["check"] is stock


def test_a_pydantic_validator_swap_is_reverted_with_its_class_rebuilt(registry: Registry, fake_module, make_patch):
    """The shape of eagle3-deepseek-allow-list: a model validator replaced in the class's decorator
    table, the pydantic dataclass rebuilt after the swap and again after the restore."""
    pydantic = pytest.importorskip("pydantic")
    from pydantic.dataclasses import dataclass as pydantic_dataclass, rebuild_dataclass

    @pydantic_dataclass
    class Spec:
        kind: str

        @pydantic.model_validator(mode="after")
        def _verify(self):
            if self.kind != "llama":
                raise ValueError(f"only llama, got {self.kind}")
            return self

    mod = fake_module(Spec=Spec)

    def install(m, ch):
        validators = m.Spec.__pydantic_decorators__.model_validators
        dec = validators["_verify"]
        ch.setitem(validators, "_verify", dataclasses.replace(dec, func=lambda self: self),
                   label="Spec model validator _verify", then=lambda: rebuild_dataclass(m.Spec, force=True))

    p = make_patch(f"{mod.__name__}:Spec", install=install)
    with pytest.raises(pydantic.ValidationError, match="only llama"):
        Spec(kind="deepseek_v3")
    registry.apply(environ={})
    assert registry.status(p.id) is Status.APPLIED
    assert Spec(kind="deepseek_v3").kind == "deepseek_v3"
    assert touched(registry, p.id) == ("Spec model validator _verify",)
    registry.revert()
    with pytest.raises(pydantic.ValidationError, match="only llama"):
        Spec(kind="deepseek_v3")


# -- the shipped patches ---------------------------------------------------------

def test_the_two_scheduler_config_adapters_declare_their_order():
    """Both adapt speculators 0.3's ``SchedulerConfig`` binding on vLLM >= 0.14: undeclared, the
    second would now be refused."""
    assert "scheduler-config-init-vars" in REGISTRY.get("async-scheduling-off").after


def test_a_refused_or_undecided_patch_touched_nothing(registry: Registry, fake_module, make_patch):
    mod = fake_module(Config=Config)
    make_patch(f"{mod.__name__}:Config", pid="first-adapter",
               install=lambda m, ch: bindings.adapt_call(ch, m, "Config", _default("size", 1, [])))
    make_patch(f"{mod.__name__}:Config", pid="second-adapter",
               install=lambda m, ch: bindings.adapt_call(ch, m, "Config", _default("size", 2, [])))
    make_patch("_sc_not_imported_module:Thing", pid="pending-one")
    registry.apply(environ={})
    assert touched(registry, "second-adapter") == () and touched(registry, "pending-one") == ()
    assert touched(registry, "first-adapter") == (f"{mod.__name__}.Config (keyword arguments adapted)",)
    registry.revert()
