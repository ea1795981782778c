"""bindings.adapt_call / wrap_method: consumer bindings adapted, originals untouched."""

from __future__ import annotations

import dataclasses
import inspect

import pytest

from spec_compat.core import bindings
from spec_compat.core.registry import Changes, Status


@dataclasses.dataclass
class Config:
    size: int
    is_encoder_decoder: bool
    async_scheduling: bool = True


class Scheduler:
    def __init__(self, config, block_size):
        self.config = config
        self.block_size = block_size
        self.log = []

    def finish(self, ids):
        self.log.append(("finish", tuple(ids)))
        return f"finished {len(ids)}"

    def step(self):
        return "step"


def set_default(key, value, trace=None):
    def adapt(kw):
        if trace is not None:
            trace.append((key, dict(kw)))
        kw.setdefault(key, value)
        return kw

    return adapt


# -- adapt_call (factory) ----------------------------------------------------

def test_adapt_call_factory_returns_instance_of_original(fake_module):
    mod = fake_module(Config=Config)
    c = Changes("config-defaults")
    bindings.adapt_call(c, mod, "Config", set_default("is_encoder_decoder", False))

    assert mod.Config is not Config
    obj = mod.Config(size=3)
    assert type(obj) is Config
    assert obj == Config(size=3, is_encoder_decoder=False)
    # an explicit argument wins over the adapter's default; positionals pass through
    assert mod.Config(3, is_encoder_decoder=True).is_encoder_decoder is True
    assert bindings.original(mod, "Config") is Config
    assert mod.Config.__name__ == "Config" and mod.Config.__wrapped__ is Config
    assert "is_encoder_decoder" in inspect.signature(mod.Config).parameters
    # the class itself is untouched for every other caller
    with pytest.raises(TypeError):
        Config(size=3)

    c.undo()
    assert mod.Config is Config


def test_adapt_call_adapter_gets_a_copy_and_can_rewrite(fake_module):
    mod = fake_module(Config=Config)
    c = Changes("rename")

    def rename(kw):
        kw["size"] = kw.pop("old_size")
        kw["is_encoder_decoder"] = False
        return kw

    bindings.adapt_call(c, mod, "Config", rename)
    caller_kwargs = {"old_size": 7}
    assert mod.Config(**caller_kwargs) == Config(7, False)
    assert caller_kwargs == {"old_size": 7}
    c.undo()


def test_two_patches_chain_on_one_binding_and_undo_separately(fake_module):
    mod = fake_module(Config=Config)
    trace = []
    c1, c2 = Changes("first"), Changes("second")
    bindings.adapt_call(c1, mod, "Config", set_default("is_encoder_decoder", False, trace))
    replacement = mod.Config
    bindings.adapt_call(c2, mod, "Config", set_default("async_scheduling", False, trace))

    assert mod.Config is replacement          # one binding, two links
    obj = mod.Config(size=1)
    assert obj == Config(1, False, False)
    # registration order: the second adapter sees the first one's output
    assert trace == [("is_encoder_decoder", {"size": 1}),
                     ("async_scheduling", {"size": 1, "is_encoder_decoder": False})]

    c1.undo()                                  # the other link stays
    assert mod.Config is replacement
    assert mod.Config(size=1, is_encoder_decoder=True) == Config(1, True, False)
    with pytest.raises(TypeError):
        mod.Config(size=1)                     # first link's default is gone

    c2.undo()                                  # last link: the original returns
    assert mod.Config is Config
    assert (mod.__name__, "Config") not in bindings._ADAPTERS


def test_undo_all_in_registration_order_restores_identity(fake_module):
    mod = fake_module(Config=Config)
    cs = [Changes(f"p{i}") for i in range(3)]
    for i, c in enumerate(cs):
        bindings.adapt_call(c, mod, "Config", set_default("is_encoder_decoder", bool(i)))
    for c in cs:                               # FIFO, not LIFO
        c.undo()
    assert mod.Config is Config
    assert (mod.__name__, "Config") not in bindings._ADAPTERS


def test_adapt_call_through_registry_patches_and_revert(registry, fake_module, make_patch):
    mod = fake_module(Config=Config)
    p1 = make_patch(f"{mod.__name__}:Config",
                    install=lambda m, ch: bindings.adapt_call(ch, m, "Config",
                                                              set_default("is_encoder_decoder", False)))
    p2 = make_patch(f"{mod.__name__}:Config", after=(p1.id,),  # one adapter chain: the order is declared
                    install=lambda m, ch: bindings.adapt_call(ch, m, "Config",
                                                              set_default("async_scheduling", False)))
    registry.apply(environ={})
    assert registry.status(p1.id) is registry.status(p2.id) is Status.APPLIED
    assert mod.Config(size=2) == Config(2, False, False)
    registry.revert()
    assert mod.Config is Config


def test_rebound_name_gets_a_new_binding_and_stale_undo_keeps_it(fake_module):
    """A module re-binds the name (reload): the old link's undo must not drop the new binding."""
    mod = fake_module(Config=Config)
    old = Changes("old")
    bindings.adapt_call(old, mod, "Config", set_default("is_encoder_decoder", False))
    mod.Config = Config                        # e.g. importlib.reload re-ran the import
    new1, new2 = Changes("new1"), Changes("new2")
    bindings.adapt_call(new1, mod, "Config", set_default("is_encoder_decoder", True))
    old.undo()                                 # stale: leaves the current binding alone
    bindings.adapt_call(new2, mod, "Config", set_default("async_scheduling", False))
    assert mod.Config(size=1) == Config(1, True, False)
    new1.undo()
    new2.undo()
    assert mod.Config is Config
    assert (mod.__name__, "Config") not in bindings._ADAPTERS


def test_kind_mismatch_is_refused(fake_module):
    mod = fake_module(Scheduler=Scheduler)
    c1, c2 = Changes("a"), Changes("b")
    bindings.adapt_call(c1, mod, "Scheduler", set_default("block_size", 16))
    with pytest.raises(RuntimeError, match="already adapted as a factory"):
        bindings.wrap_method(c2, mod, "Scheduler", "finish", lambda w, i, a, k: w(*a, **k))
    c2.undo()
    c1.undo()
    assert mod.Scheduler is Scheduler


# -- wrap_method (subclass) --------------------------------------------------

def test_wrap_method_subclass_and_wrapper_chain_order(fake_module):
    mod = fake_module(Scheduler=Scheduler)
    sched_dict = dict(vars(Scheduler))
    calls = []

    def outer(wrapped, inst, args, kwargs):
        calls.append(("outer", args, kwargs))
        return "outer(" + wrapped(*args, **kwargs) + ")"

    def inner(wrapped, inst, args, kwargs):
        calls.append(("inner", args, kwargs))
        assert isinstance(inst, Scheduler)
        (ids,) = args
        return "inner(" + wrapped([i for i in ids if i != "skip"]) + ")"

    c1, c2 = Changes("outer"), Changes("inner")
    bindings.wrap_method(c1, mod, "Scheduler", "finish", outer)
    bindings.wrap_method(c2, mod, "Scheduler", "finish", inner)

    cls = mod.Scheduler
    assert cls is not Scheduler and issubclass(cls, Scheduler)
    assert cls.__name__ == "Scheduler" and cls.__qualname__ == Scheduler.__qualname__
    assert bindings.original(mod, "Scheduler") is Scheduler

    s = mod.Scheduler("cfg", block_size=16)
    assert isinstance(s, Scheduler) and s.block_size == 16
    assert s.finish(["a", "skip", "b"]) == "outer(inner(finished 2))"
    assert [c[0] for c in calls] == ["outer", "inner"]   # first registered runs outermost
    assert s.log == [("finish", ("a", "b"))]
    assert s.step() == "step"                            # unwrapped methods unchanged

    # the original class, for every other caller
    assert dict(vars(Scheduler)) == sched_dict
    plain = Scheduler("cfg", 8)
    assert plain.finish(["a", "skip"]) == "finished 2" and len(calls) == 2

    c1.undo()                                            # inner stays
    assert mod.Scheduler is cls
    assert s.finish(["x", "skip"]) == "inner(finished 1)"

    c2.undo()
    assert mod.Scheduler is Scheduler
    assert "finish" not in cls.__dict__                  # dispatch removed from the subclass
    assert dict(vars(Scheduler)) == sched_dict


def test_wrap_init_and_adapt_kwargs_on_subclass(fake_module):
    mod = fake_module(Scheduler=Scheduler)
    seen = []

    def init(wrapped, inst, args, kwargs):
        seen.append(dict(kwargs))
        wrapped(*args, **kwargs)
        inst.wrapped_init = True

    c1, c2, c3 = Changes("block"), Changes("init"), Changes("finish")
    bindings.adapt_call(c1, mod, "Scheduler", set_default("block_size", 32), kind="subclass")
    bindings.wrap_method(c2, mod, "Scheduler", "__init__", init)
    bindings.wrap_method(c3, mod, "Scheduler", "finish", lambda w, i, a, k: "x" + w(*a, **k))

    s = mod.Scheduler(config="cfg")
    assert type(s) is mod.Scheduler and isinstance(s, Scheduler)
    assert s.block_size == 32 and s.wrapped_init is True
    assert seen == [{"config": "cfg", "block_size": 32}]     # adapters run before __init__ wrappers
    assert s.finish([1]) == "xfinished 1"

    c2.undo()
    s2 = mod.Scheduler(config="cfg")
    assert s2.block_size == 32 and not hasattr(s2, "wrapped_init")
    c3.undo()
    c1.undo()
    assert mod.Scheduler is Scheduler


def test_wrap_method_missing_method_rolls_back_through_registry(registry, fake_module, make_patch):
    mod = fake_module(Scheduler=Scheduler)

    def install(module, changes):
        bindings.wrap_method(changes, module, "Scheduler", "no_such_method", lambda w, i, a, k: None)

    p = make_patch(f"{mod.__name__}:Scheduler", install=install)
    (rec,) = registry.apply(environ={})
    assert rec.status is Status.FAILED and "no_such_method" in rec.reason
    assert p.calls
    assert mod.Scheduler is Scheduler
    assert (mod.__name__, "Scheduler") not in bindings._ADAPTERS


def test_wrap_method_through_registry_revert(registry, fake_module, make_patch):
    mod = fake_module(Scheduler=Scheduler)
    first = make_patch(f"{mod.__name__}:Scheduler",
                       install=lambda m, ch: bindings.wrap_method(ch, m, "Scheduler", "step",
                                                                  lambda w, i, a, k: w(*a, **k) + "!"))
    make_patch(f"{mod.__name__}:Scheduler", after=(first.id,),  # one wrapper chain: the order is declared
               install=lambda m, ch: bindings.wrap_method(ch, m, "Scheduler", "step",
                                                          lambda w, i, a, k: w(*a, **k) + "?"))
    registry.apply(environ={})
    assert mod.Scheduler("c", 1).step() == "step?!"
    registry.revert()
    assert mod.Scheduler is Scheduler and Scheduler("c", 1).step() == "step"
