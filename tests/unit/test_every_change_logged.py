"""Every change to a target goes through the undo log (issue #43, item 3): a keyword adapter on a
consumer's binding (``bindings.adapt_call``), an item of a mapping the target reads (``Changes.setitem``:
a registry entry, a pydantic validator table, ``os.environ``), an attribute removed (``Changes.delattr``),
a call of the target's own API with the call that reverses it (``Changes.call``: a registry's
``register``, a finder on ``sys.meta_path``) -- each is reverted by undo, named by the patch's record
(``Record.touched``), and seen by the stacking check: a second applied patch on the same target without
a declared ``after`` is refused and rolled back, exactly as for a wrapped attribute.  The last tests read
the ``install`` of every registered patch and refuse a change made past the log."""

from __future__ import annotations

import ast
import dataclasses
import inspect
import logging
import os
import sys
import textwrap
import types
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from spec_compat import REGISTRY
from spec_compat import patches  # noqa: F401  (registers every patch)
from spec_compat.core import bindings
from spec_compat.core.changes import dotted_name
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


# -- delattr -------------------------------------------------------------------------

class _Base:
    def __init__(self) -> None:
        self.made_by = "base"


def test_delattr_is_undone_named_and_a_second_unordered_change_is_refused(registry: Registry, fake_module,
                                                                          make_patch):
    class Sub(_Base):
        def __init__(self) -> None:
            self.made_by = "sub"

    own_init = Sub.__dict__["__init__"]
    mod = fake_module(Sub=Sub)
    first = make_patch(f"{mod.__name__}:Sub", pid="drops-init",
                       install=lambda m, ch: ch.delattr(m.Sub, "__init__"))
    second = make_patch(f"{mod.__name__}:Sub", pid="sets-init",
                        install=lambda m, ch: ch.setattr(m.Sub, "__init__", lambda self: None))
    registry.apply(environ={})
    assert registry.status(first.id) is Status.APPLIED
    assert Sub().made_by == "base"  # the inherited one applies
    assert touched(registry, first.id) == (f"{dotted_name(Sub)}.__init__ (removed)",)
    rec = {r.id: r for r in registry.records()}[second.id]
    assert rec.status is Status.FAILED
    assert "add after = ('drops-init',)" in rec.reason  # (the reason names Sub.__init__, shortened here)
    assert "__init__" not in Sub.__dict__  # the refused patch was rolled back
    registry.revert()
    assert Sub.__dict__["__init__"] is own_init and Sub().made_by == "sub"


def test_delattr_leaves_an_attribute_set_again_since_alone(caplog):
    class Sub(_Base):
        def __init__(self) -> None:
            pass

    c = Changes("a-patch")
    c.delattr(Sub, "__init__")
    later = lambda self: None  # noqa: E731
    Sub.__init__ = later
    with caplog.at_level(logging.WARNING, logger="spec_compat"):
        c.undo()
    assert Sub.__dict__["__init__"] is later
    assert "was set again by someone else" in caplog.text


# -- call (a target's own API) ------------------------------------------------------------

class _Interface:
    """A registry changed only through its API (like transformers' AttentionInterface)."""

    def __init__(self) -> None:
        self._entries: dict[str, Any] = {"attn": "stock"}

    def register(self, key: str, value: Any) -> None:
        self._entries[key] = value

    def __getitem__(self, key: str) -> Any:
        return self._entries[key]


def _registering(value: str) -> Callable[[types.ModuleType, Changes], None]:
    def install(m: types.ModuleType, ch: Changes) -> None:
        before = m.ATTN["attn"]
        ch.call(m.ATTN, "attn", lambda: m.ATTN.register("attn", value), lambda: m.ATTN.register("attn", before),
                label=f"{m.__name__}.ATTN['attn']")
    return install


def test_call_is_undone_and_named_and_returns_what_it_did():
    reg = _Interface()
    c = Changes("a-patch")
    assert c.call(reg, "attn", lambda: reg.register("attn", "patched") or "done",
                  lambda: reg.register("attn", "stock"), label="ATTN['attn']") == "done"
    assert reg["attn"] == "patched" and c.described() == ["ATTN['attn']"]
    c.undo()
    assert reg["attn"] == "stock"


def test_two_unordered_registry_calls_on_one_key_are_refused_and_ordered_ones_apply(fake_module, make_patch):
    reg = _Interface()
    mod = fake_module(ATTN=reg)
    unordered = Registry()
    make_patch(f"{mod.__name__}:ATTN", pid="call-a", install=_registering("a"), reg=unordered)
    make_patch(f"{mod.__name__}:ATTN", pid="call-b", install=_registering("b"), reg=unordered)
    unordered.apply(environ={})
    recs = {r.id: r for r in unordered.records()}
    assert recs["call-a"].status is Status.APPLIED and recs["call-a"].touched == (f"{mod.__name__}.ATTN['attn']",)
    assert recs["call-b"].status is Status.FAILED
    assert f"it changes {mod.__name__}.ATTN['attn'], which patch call-a replaced first" in recs["call-b"].reason
    assert reg["attn"] == "a"  # the refused call was reversed
    unordered.revert()
    assert reg["attn"] == "stock"

    ordered = Registry()
    make_patch(f"{mod.__name__}:ATTN", pid="call-d", after=("call-c",), install=_registering("d"), reg=ordered)
    make_patch(f"{mod.__name__}:ATTN", pid="call-c", install=_registering("c"), reg=ordered)
    ordered.apply(environ={})
    assert {r.status for r in ordered.records()} == {Status.APPLIED} and reg["attn"] == "d"
    ordered.revert()
    assert reg["attn"] == "stock"


def test_a_call_and_a_setitem_on_one_sys_modules_name_are_one_thing_to_the_stacking_check(fake_module, make_patch):
    """attn-mask-utils-module serves a module name through a finder (``call`` on ``sys.modules``/name);
    a patch putting a module at that name (``setitem``) is the same target."""
    name = "_sc_served_module_for_stacking"
    mod = fake_module()
    served = types.ModuleType(name)
    reg = Registry()
    make_patch(f"{mod.__name__}:__name__", pid="serves-by-finder", reg=reg,
               install=lambda m, ch: ch.call(sys.modules, name, lambda: None, lambda: None,
                                             label=f"sys.modules[{name!r}] (served by a sys.meta_path finder)"))
    make_patch(f"{mod.__name__}:__name__", pid="serves-by-item", reg=reg,
               install=lambda m, ch: ch.setitem(sys.modules, name, served, label=f"sys.modules[{name!r}]"))
    reg.apply(environ={})
    rec = {r.id: r for r in reg.records()}["serves-by-item"]
    assert rec.status is Status.FAILED and "which patch serves-by-finder replaced first" in rec.reason
    assert name not in sys.modules
    reg.revert()


# -- os.environ (a command's setting) ---------------------------------------------------------

def test_setitem_on_os_environ_is_undone_although_every_read_is_a_new_string(monkeypatch, caplog):
    var = "SPEC_COMPAT_TEST_LOGGED_VAR"
    monkeypatch.delenv(var, raising=False)
    c = Changes("a-setting")
    c.setitem(os.environ, var, "1", label=f"os.environ[{var!r}]")
    assert os.environ[var] == "1" and c.described() == [f"os.environ[{var!r}]"]
    with caplog.at_level(logging.WARNING, logger="spec_compat"):
        c.undo()
    assert var not in os.environ and "replaced by someone else" not in caplog.text


def _mla_config(rank: int | None) -> types.SimpleNamespace:
    return types.SimpleNamespace(kv_lora_rank=rank)


@pytest.fixture
def without_cuda(monkeypatch) -> Iterator[None]:
    torch = pytest.importorskip("torch")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.delenv("VLLM_MLA_DISABLE", raising=False)
    yield


def test_preferring_non_mla_sets_the_variable_for_the_block_only(without_cuda):
    from spec_compat.verify.settings import preferring_non_mla

    with preferring_non_mla(_mla_config(512)):
        assert os.environ["VLLM_MLA_DISABLE"] == "1"
    assert "VLLM_MLA_DISABLE" not in os.environ
    with preferring_non_mla(_mla_config(None)):  # not an MLA model
        assert "VLLM_MLA_DISABLE" not in os.environ
    with pytest.raises(RuntimeError), preferring_non_mla(_mla_config(512)):
        raise RuntimeError("the engine failed to start")
    assert "VLLM_MLA_DISABLE" not in os.environ  # reverted on the way out of a failure too


def test_preferring_non_mla_leaves_the_callers_own_value(without_cuda, monkeypatch):
    from spec_compat.verify.settings import preferring_non_mla

    monkeypatch.setenv("VLLM_MLA_DISABLE", "0")
    with preferring_non_mla(_mla_config(512)):
        assert os.environ["VLLM_MLA_DISABLE"] == "0"
    assert os.environ["VLLM_MLA_DISABLE"] == "0"


# -- the shipped patches' changes through the log ------------------------------------------------

def test_eagle3_mla_draft_head_registers_through_the_log(fake_module):
    class ModelRegistry:
        def __init__(self) -> None:
            self.models: dict[str, Any] = {}

        def register_model(self, arch: str, cls: str) -> None:
            self.models[arch] = cls

    mod = fake_module(ModelRegistry=ModelRegistry())
    patch = REGISTRY.get("eagle3-mla-draft-head")
    c = Changes(patch.id)
    patch.install(mod, c)
    from spec_compat.patches.serving.eagle3_mla_draft_head import MLA_ARCHS

    assert set(mod.ModelRegistry.models) == set(MLA_ARCHS)
    assert c.described() == [f"vLLM ModelRegistry.models[{a!r}]" for a in MLA_ARCHS]
    c.undo()
    assert mod.ModelRegistry.models == {}


def test_kimi_k2_draft_config_is_a_logged_registry_item(fake_module):
    pytest.importorskip("transformers")
    registry = {"deepseek_v3": "stock"}
    mod = fake_module(_CONFIG_REGISTRY=registry)
    patch = REGISTRY.get("kimi-k2-draft-config")
    c = Changes(patch.id)
    patch.install(mod, c)
    assert "kimi_k2" in registry
    assert c.described() == ["vllm.transformers_utils.config._CONFIG_REGISTRY['kimi_k2']"]
    c.undo()
    assert registry == {"deepseek_v3": "stock"}


# -- no change past the log: every registered patch's install, read ------------------------------------

#: methods that change the object they are called on (a list, a dict, a registry)
_MUTATING = {"append", "insert", "extend", "update", "pop", "popitem", "setdefault", "remove", "clear",
             "discard", "add", "__setitem__", "__delitem__", "__setattr__", "__delattr__", "register",
             "register_model"}
#: calls that build a fresh container the function may fill freely
_FRESH = {"list", "dict", "set", "tuple", "sorted", "defaultdict", "OrderedDict", "deque"}
_SCOPES = (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda, ast.ClassDef)


def _statements(fn: ast.FunctionDef | ast.AsyncFunctionDef) -> Iterator[ast.AST]:
    """The nodes ``fn`` runs itself: not the bodies of the functions, lambdas and classes it defines
    (wrappers run later, on the target's calls, and change the instances they are given)."""
    todo: list[ast.AST] = list(fn.body)
    while todo:
        node = todo.pop()
        if isinstance(node, _SCOPES):
            continue
        yield node
        todo.extend(ast.iter_child_nodes(node))


def _root(node: ast.AST) -> str | None:
    while isinstance(node, (ast.Attribute, ast.Subscript, ast.Call)):
        node = node.func if isinstance(node, ast.Call) else node.value
    return node.id if isinstance(node, ast.Name) else None


def _own_names(fn: ast.FunctionDef | ast.AsyncFunctionDef) -> set[str]:
    """Names whose objects ``fn`` may change: the undo log (a parameter annotated ``Changes`` or named
    ``changes``), the patch itself (``self``), containers ``fn`` built."""
    own = {"self"}
    for arg in fn.args.args + fn.args.kwonlyargs:
        if arg.arg == "changes" or (arg.annotation is not None and "Changes" in ast.unparse(arg.annotation)):
            own.add(arg.arg)
    for node in _statements(fn):
        if isinstance(node, (ast.Assign, ast.AnnAssign)) and node.value is not None:
            v = node.value
            fresh = isinstance(v, (ast.List, ast.Dict, ast.Set, ast.Tuple, ast.ListComp, ast.DictComp, ast.SetComp)) \
                or (isinstance(v, ast.Call) and isinstance(v.func, ast.Name) and v.func.id in _FRESH)
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            own.update(t.id for t in targets if fresh and isinstance(t, ast.Name))
    return own


def changes_past_the_log(fn: ast.FunctionDef | ast.AsyncFunctionDef) -> list[str]:
    """What ``fn`` changes without its undo log: an attribute or item assigned or deleted on an object
    it did not build, ``setattr``/``delattr``, a mutating method of such an object (a registry's
    ``register``, ``sys.meta_path.append``), ``on_undo`` (what it undoes is neither reported nor
    checked for stacking)."""
    own = _own_names(fn)
    found = []
    for node in _statements(fn):
        if isinstance(node, (ast.Assign, ast.AugAssign, ast.AnnAssign, ast.Delete)):
            targets = node.targets if isinstance(node, (ast.Assign, ast.Delete)) else [node.target]
            found += [f"line {node.lineno}: {ast.unparse(t)} {'deleted' if isinstance(node, ast.Delete) else 'set'}"
                      for t in targets if isinstance(t, (ast.Attribute, ast.Subscript)) and _root(t) not in own]
        elif isinstance(node, ast.Call):
            f = node.func
            if (isinstance(f, ast.Name) and f.id in ("setattr", "delattr")) or \
                    (isinstance(f, ast.Attribute) and (f.attr == "on_undo"
                                                       or (f.attr in _MUTATING and _root(f.value) not in own))):
                found.append(f"line {node.lineno}: {ast.unparse(node)}")
    return found


def _parsed(fn: Callable[..., Any]) -> ast.FunctionDef | ast.AsyncFunctionDef:
    lines, first = inspect.getsourcelines(fn)
    tree = ast.parse(textwrap.dedent("".join(lines)))
    ast.increment_lineno(tree, first - 1)  # messages name the file's lines
    node = tree.body[0]
    assert isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
    return node


def _install_and_its_helpers(patch: Any) -> Iterator[tuple[str, Callable[..., Any]]]:
    """The patch's ``install`` and, transitively, the functions of its own module and the methods of
    its own class that it calls by name (a helper is part of the installation)."""
    install = type(patch).install
    module = sys.modules[install.__module__]
    todo: list[tuple[str, Callable[..., Any]]] = [(f"{type(patch).__name__}.install", install)]
    seen: set[Any] = set()
    while todo:
        name, fn = todo.pop()
        if fn in seen:
            continue
        seen.add(fn)
        yield name, fn
        for node in _statements(_parsed(fn)):
            if not isinstance(node, ast.Call):
                continue
            f = node.func
            if isinstance(f, ast.Name):
                helper = vars(module).get(f.id)
            elif isinstance(f, ast.Attribute) and isinstance(f.value, ast.Name) and f.value.id == "self":
                helper = getattr(type(patch), f.attr, None)
            else:
                continue
            if isinstance(helper, types.FunctionType) and helper.__module__ == module.__name__:
                todo.append((helper.__qualname__, helper))


def test_no_registered_patch_changes_its_target_past_the_log():
    offences = []
    registered = REGISTRY.patches()
    assert len(registered) > 50  # every group was registered
    for patch in registered:
        for name, fn in _install_and_its_helpers(patch):
            where = f"{patch.id} ({inspect.getsourcefile(fn)}, {name})"
            offences += [f"{where}: {what}" for what in changes_past_the_log(_parsed(fn))]
    assert not offences, ("changes made past the undo log (use Changes.setattr/wrap/delattr/setitem/call or "
                          "bindings.adapt_call):\n" + "\n".join(offences))


def test_the_scan_names_each_kind_of_change_past_the_log():
    source = textwrap.dedent('''
        def install(self, module, changes: Changes) -> None:
            registry = module.REGISTRY
            mine = []
            mine.append(1)                                  # a list it built: fine
            self.note = 1                                   # the patch's own state: fine
            changes.setattr(module, "x", 1)                 # through the log: fine

            def wrapper(inst):
                inst.seen = True                            # runs later, on an instance: fine
            module.attr = 1
            sys.modules["name"] = module
            del module.Old
            setattr(module.Class, "y", 2)
            registry.register("key", wrapper)
            sys.meta_path.append(object())
            changes.on_undo(lambda: None)
    ''')
    fn = ast.parse(source).body[0]
    found = changes_past_the_log(fn)
    assert sorted(f.split(": ", 1)[1] for f in found) == sorted([
        "module.attr set", "sys.modules['name'] set", "module.Old deleted", "setattr(module.Class, 'y', 2)",
        "registry.register('key', wrapper)", "sys.meta_path.append(object())", "changes.on_undo(lambda: None)",
    ])
