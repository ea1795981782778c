"""Failures at call time inside a shim: does the error name the patch (``spec_compat[<id>]``)?

* Inventory (static, every ``raise`` in ``spec_compat/patches`` and the shim modules they import):
  the error raise sites that name no patch id are exactly the ones listed in
  ``UNNAMED`` (a new one fails here), and every ``spec_compat[<id>]`` names a
  registered patch.
* Named sites: each one reached with fakes, the message carries the id.
* Failures of the wrapped original (upstream raising through a shim), on copies of the
  real target modules: the exception keeps its type, message and traceback (the shim's frame
  is in it) and carries a note ``raised through spec_compat[<id>] (...)``
  (``BaseException.add_note``), shown under the traceback.
"""

from __future__ import annotations

import ast
import functools
import re
import sys
import traceback
import types
from pathlib import Path

import pytest
from faults_support import PATCHES, copy_module, unique

import spec_compat
from spec_compat import REGISTRY
from spec_compat.core.registry import Registry, Status

PKG = Path(spec_compat.__file__).resolve().parent
NAMED = re.compile(r"spec_compat\[([^\]]+)\]")
GUARD_OUTCOMES = {"TargetChanged", "NotNeeded"}

#: raise sites whose message names no patch id (file: function) - each with why that is right
UNNAMED = {
    "patches/training/attn_mask_utils_module.py:prepare_4d_causal_attention_mask":
        "stand-in for transformers' removed _prepare_4d_causal_attention_mask (patch attn-mask-utils-module): "
        "transformers' signature, so no patch id can be passed in, and ValueErrors worded as transformers' own "
        "for callers written against that function",
    "shims/module_view.py:ModuleView.__getattr__":
        "AttributeError(name) of a view not yet initialised (copy, unpickling): the attribute protocol "
        "getattr/hasattr/copy expect from __getattr__, not an error report; nothing failed",
    "patches/training/single_device_bf16.py:DevicePrefetch.__getattr__":
        "attribute protocol, not an error report: AttributeError(name) while unpickling (loader/device not set yet) "
        "is what getattr/hasattr/pickle expect from __getattr__; nothing failed",
}


def _patch_files() -> list[Path]:
    """The patch modules and the shim modules they import (what a registered patch runs)."""
    patches = sorted((PKG / "patches").rglob("*.py"))
    shims = set()
    for path in patches:
        package = ["spec_compat", *path.relative_to(PKG).parent.parts]
        for node in ast.walk(ast.parse(path.read_text())):
            if not isinstance(node, ast.ImportFrom) or not node.level:
                continue
            base = package[: len(package) - (node.level - 1)]
            module = [*base, *(node.module.split(".") if node.module else [])]
            if module == ["spec_compat", "shims"]:
                shims.update(alias.name for alias in node.names)
            elif module[:2] == ["spec_compat", "shims"]:
                shims.add(module[2])
    modules = [PKG / "shims" / f"{name}.py" for name in shims] + [  # a shim package: all its modules
        path for name in shims for path in (PKG / "shims" / name).glob("*.py")]
    return patches + sorted(path for path in modules if path.is_file())


def _error_factories(paths: list[Path]) -> dict[str, str]:
    """Module-level functions of ``paths`` that build and return an exception (``raise f(...)``): name ->
    their source, where the message they word is read."""
    out = {}
    for path in paths:
        for node in ast.parse(path.read_text()).body:
            if isinstance(node, ast.FunctionDef) and any(isinstance(n, ast.Return) for n in ast.walk(node)):
                out[node.name] = ast.unparse(node)
    return out


def _raise_sites() -> list[tuple[str, str, str | None]]:
    """(file:function, exception name, message source) of every raise with a new exception; for
    ``raise factory(...)``, the message source is the factory's (:func:`_error_factories`)."""
    sites = []
    factories = _error_factories(_patch_files())
    for path in _patch_files():
        rel = path.relative_to(PKG).as_posix()
        tree = ast.parse(path.read_text())

        def walk(node, stack):
            for child in ast.iter_child_nodes(node):
                if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                    walk(child, [*stack, child.name])
                    continue
                if isinstance(child, ast.Raise) and isinstance(child.exc, ast.Call):
                    func = child.exc.func
                    name = func.id if isinstance(func, ast.Name) else getattr(func, "attr", "?")
                    msg = ast.unparse(child.exc.args[0]) if child.exc.args else None
                    if isinstance(func, ast.Name) and func.id in factories:
                        msg = factories[func.id]
                    sites.append((f"{rel}:{'.'.join(stack)}", name, msg))
                walk(child, stack)

        walk(tree, [])
    return sites


def test_raise_inventory():
    unnamed, named_ids = set(), set()
    for where, exc, msg in _raise_sites():
        if exc in GUARD_OUTCOMES:
            continue
        ids = NAMED.findall(msg or "")
        if ids:
            named_ids.update(ids)
        else:
            unnamed.add(where)
    assert unnamed == set(UNNAMED), (
        f"raise sites without spec_compat[<id>]: new {sorted(unnamed - set(UNNAMED))}, "
        f"fixed {sorted(set(UNNAMED) - unnamed)} (update UNNAMED and tests/faults/README.md)")
    registered = {p.id for p in PATCHES}
    literal = {i for i in named_ids if "{" not in i}
    assert literal <= registered, sorted(literal - registered)
    # ids built at run time come from the patch class (e.g. f"spec_compat[{CpuRunnerLoadsDrafter.id}]")
    dynamic = {i for i in named_ids if "{" in i}
    assert all(re.fullmatch(r"\{(\w+\.id|patch_id|self\.patch_id)\}", i) for i in dynamic), dynamic


# -- named sites, reached with fakes -----------------------------------------

torch = pytest.importorskip("torch")


def _named(exc: BaseException, pid: str) -> None:
    assert f"spec_compat[{pid}]" in str(exc), str(exc)
    assert pid in {p.id for p in PATCHES}


def test_capture_per_request_rows_short():
    from spec_compat.shims.capture import PerRequestStore, RowCountError

    store = PerRequestStore()
    store.begin_step({"a": 3, "b": 4})
    with pytest.raises(RowCountError) as exc:
        store.store([torch.zeros(5, 2)], ["a", "b"])
    _named(exc.value, "capture-per-request")


@pytest.mark.parametrize("by_request, order", [
    ({"a": [torch.zeros(3, 2)]}, [("a", 3), ("b", 2)]),   # a request lost
    ({"a": [torch.zeros(2, 2)]}, [("a", 3)]),              # rows != prompt length
], ids=["missing", "short"])
def test_rows_by_request_id_mismatch(by_request, order):
    from spec_compat.shims.capture import RowCountError, assemble_in_order

    with pytest.raises(RowCountError) as exc:
        assemble_in_order(by_request, order)
    _named(exc.value, "rows-by-request-id")


def test_results_in_input_order_mismatch():
    from spec_compat.patches.extraction.results_in_input_order import restore_input_order

    with pytest.raises(RuntimeError) as exc:
        restore_input_order([{"input_ids": torch.tensor([1])}], [[1], [2]], 10)
    _named(exc.value, "results-in-input-order")
    with pytest.raises(RuntimeError) as exc:
        restore_input_order([{"input_ids": torch.tensor([9])}], [[1]], 10)
    _named(exc.value, "results-in-input-order")


def test_generate_in_fitting_batches_over_budget():
    from spec_compat.patches.extraction.generate_in_fitting_batches import split_to_fit

    with pytest.raises(ValueError) as exc:
        split_to_fit([[1] * 100], max_seqs=4, num_blocks=2, block_size=16, max_len=1000)
    _named(exc.value, "generate-in-fitting-batches")


def test_decoder_stack_locator_no_stack():
    from spec_compat.shims.decoder import find_decoder_stack

    with pytest.raises(AttributeError) as exc:
        find_decoder_stack(types.SimpleNamespace(), "decoder-stack-locator")
    _named(exc.value, "decoder-stack-locator")


@pytest.mark.parametrize("pid", ["eagle3-deepseek-aux-states", "eagle3-kimi-k25-aux-states"])
def test_aux_state_collector_names_its_patch(pid):
    from spec_compat.patches.serving._eagle3_aux_states import AuxStateCollector

    stack = types.SimpleNamespace(layers=[torch.nn.Identity(), torch.nn.Identity()])
    with pytest.raises(ValueError) as exc:
        AuxStateCollector(stack, [5], pid)
    _named(exc.value, pid)


@pytest.mark.parametrize("pid", ["eagle3-deepseek-aux-states", "eagle3-kimi-k25-aux-states"])
def test_eagle3_patch_missing_stack_names_itself(pid):
    """find_decoder_stack names the patch that calls it (not always decoder-stack-locator)."""
    from spec_compat.patches.serving._eagle3_aux_states import _eagle3_methods
    from spec_compat.shims.decoder import find_decoder_stack

    methods = _eagle3_methods(pid, find_decoder_stack)
    for call in (lambda: methods["set_aux_hidden_state_layers"](types.SimpleNamespace(), (1, 2, 3)),
                 lambda: methods["get_eagle3_aux_hidden_state_layers"](types.SimpleNamespace())):
        with pytest.raises(AttributeError) as exc:
            call()
        _named(exc.value, pid)
        assert "decoder-stack-locator" not in str(exc.value)


@pytest.mark.parametrize("pid", ["eagle3-deepseek-aux-states", "eagle3-kimi-k25-aux-states"])
def test_eagle3_default_aux_layers_of_a_shallow_target_names_the_patch(pid):
    from spec_compat.patches.serving._eagle3_aux_states import _eagle3_methods

    stack = types.SimpleNamespace(layers=[torch.nn.Identity()] * 3)
    methods = _eagle3_methods(pid, lambda model, patch_id: stack)
    with pytest.raises(ValueError) as exc:
        methods["get_eagle3_aux_hidden_state_layers"](types.SimpleNamespace())
    _named(exc.value, pid)


def test_aux_layer_ids_for_a_single_captured_layer_name_the_patch():
    from spec_compat.shims.verifier import aux_layer_ids_for_vllm

    assert aux_layer_ids_for_vllm([2, 5, 7], "draft-names-its-aux-layers") == [3, 6]
    with pytest.raises(ValueError) as exc:
        aux_layer_ids_for_vllm([7], "draft-names-its-aux-layers")
    _named(exc.value, "draft-names-its-aux-layers")


@pytest.mark.parametrize("pid", ["kv-cache-memory-from-platform", "mem-get-info-from-platform"])
def test_kv_budget_on_a_platform_without_mem_get_info_names_the_patch(pid, monkeypatch):
    """No CUDA, a platform that is not the CPU one and whose torch device module has no
    mem_get_info: the KV cache cannot be sized; the error names the patch that asked."""
    from spec_compat.patches.extraction._platform_memory import platform_mem_get_info
    from spec_compat.patches.extraction.kv_cache_memory_from_platform import TorchView

    platform = types.SimpleNamespace(is_cpu=lambda: False, device_type="sc_no_such_device")
    monkeypatch.setitem(sys.modules, "vllm.platforms", types.SimpleNamespace(current_platform=platform))
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    for call in (lambda: platform_mem_get_info(pid), lambda: TorchView(torch, pid).cuda.mem_get_info()):
        with pytest.raises(RuntimeError) as exc:
            call()
        _named(exc.value, pid)


# -- upstream raising through a shim ------------------------------------------

class UpstreamBoom(RuntimeError):
    pass


def raising_like(orig):
    """Same signature and source as ``orig`` for a guard; raises like upstream failing deep inside."""

    @functools.wraps(orig)
    def stand_in(*args, **kwargs):
        raise UpstreamBoom("failure deep inside upstream")

    return stand_in


def _call_fake(pid, module):
    if pid == "kv-cache-config-signature":
        return module.get_kv_cache_config_from_groups(vllm_config=None, kv_cache_groups=[], kv_cache_specs={},
                                                      available_memory=0)
    if pid == "slow-tokenizer-offsets":
        return module._preprocess_batch({"conversations": []}, types.SimpleNamespace(is_fast=False))
    if pid == "checkpoint-load-without-cuda":
        return module.load_safetensors_state_dict("/nonexistent", "cuda:0")
    if pid == "verifier-weights-wrapper-prefix":
        return module.load_model_layers(["lm_head.weight"], "/nonexistent")
    raise AssertionError(pid)


#: shims that call the wrapped original on this (CPU) machine, and the attribute replaced
THROUGH = {
    "kv-cache-config-signature": "get_kv_cache_config_from_groups",
    "slow-tokenizer-offsets": "_preprocess_batch",
    "checkpoint-load-without-cuda": "load_safetensors_state_dict",
    "verifier-weights-wrapper-prefix": "load_model_layers",
}


def _through(pid, real_targets, monkeypatch):
    patch = REGISTRY.get(pid)
    real = real_targets.module(patch.target_module)
    fn_name = THROUGH[pid]
    if not hasattr(real, fn_name):
        pytest.skip(f"{patch.target_module} has no {fn_name} here")
    name = unique("through")
    mod = copy_module(real, name)
    stand_in = mod.__dict__[fn_name] = raising_like(getattr(real, fn_name))
    monkeypatch.setitem(sys.modules, name, mod)
    cls = type(patch)
    reg = Registry()
    reg.register(type(cls.__name__, (cls,), {"target": f"{name}:{patch.target_attr}", "requires": {},
                                              "__doc__": cls.__doc__, "__module__": cls.__module__}))
    reg.apply(environ={})
    try:
        if reg.status(pid) is not Status.APPLIED:
            pytest.skip(f"{pid} does not apply here: {reg.records()[0].reason}")
        if mod.__dict__[fn_name] is stand_in:
            pytest.skip(f"{pid} does not wrap {fn_name} with this version of its target")
        with pytest.raises(UpstreamBoom) as exc:
            _call_fake(pid, mod)
    finally:
        reg.revert()
    return exc


@pytest.mark.parametrize("pid", list(THROUGH))
def test_upstream_failure_through_a_shim_names_the_patch_in_a_note(pid, real_targets, monkeypatch):
    """Upstream's exception keeps its type, message and traceback (callers that catch it or read
    str() see what upstream raised); one note names the patch it went through."""
    exc = _through(pid, real_targets, monkeypatch)
    assert str(exc.value) == "failure deep inside upstream" and type(exc.value) is UpstreamBoom
    frames = [f.filename for f in traceback.extract_tb(exc.tb)]
    assert any(Path(f).resolve().is_relative_to(PKG) for f in frames), frames
    notes = [n for n in getattr(exc.value, "__notes__", []) if f"spec_compat[{pid}]" in n]
    assert len(notes) == 1 and notes[0].startswith(f"raised through spec_compat[{pid}]"), exc.value.__notes__
    assert notes[0] in "".join(traceback.format_exception(exc.value))


def test_binding_adapters_note_the_patches_an_upstream_failure_went_through():
    """bindings.adapt_call (factory and subclass) and wrap_method: upstream raising inside the
    adapted call keeps its type and message and gets one note naming every patch on the binding;
    an error that already names a patch gets no second mention of it."""
    from spec_compat.core import bindings
    from spec_compat.core.registry import Changes

    class Upstream:
        def __init__(self, **kwargs):
            if kwargs.get("boom"):
                raise UpstreamBoom("init failed")

        def step(self):
            raise UpstreamBoom("step failed")

    def factory(**kwargs):
        raise UpstreamBoom("factory failed")

    mod = types.ModuleType(unique("bind"))
    mod.make, mod.Upstream = factory, Upstream
    changes = [Changes(pid) for pid in ("faults-a", "faults-b", "faults-c")]
    try:
        bindings.adapt_call(changes[0], mod, "make", lambda kw: kw)
        bindings.adapt_call(changes[1], mod, "make", lambda kw: kw)
        bindings.adapt_call(changes[0], mod, "Upstream", lambda kw: kw, kind="subclass")
        bindings.wrap_method(changes[2], mod, "Upstream", "step", lambda wrapped, inst, a, kw: wrapped(*a, **kw))
        cases = [(lambda: mod.make(), "factory failed", ["faults-a", "faults-b"]),
                 (lambda: mod.Upstream(boom=True), "init failed", ["faults-a"]),
                 (lambda: mod.Upstream().step(), "step failed", ["faults-c"])]
        for call, message, ids in cases:
            with pytest.raises(UpstreamBoom) as exc:
                call()
            assert str(exc.value) == message
            (note,) = exc.value.__notes__
            assert note.startswith("raised through " + ", ".join(f"spec_compat[{i}]" for i in ids) + " ("), note

        def wrapper(wrapped, inst, a, kw):
            raise RuntimeError("spec_compat[faults-c]: the wrapper's own error")

        bindings.wrap_method(changes[2], mod, "Upstream", "step", wrapper)
        with pytest.raises(RuntimeError) as exc:
            mod.Upstream().step()
        assert not getattr(exc.value, "__notes__", None)
    finally:
        for c in reversed(changes):
            c.undo()
    assert mod.make is factory and mod.Upstream is Upstream


def test_offsets_mismatch_names_the_patch():
    from spec_compat.patches.extraction.slow_tokenizer_offsets import OffsetsTokenizer

    class Slow:
        is_fast = False

        def __call__(self, text, **kwargs):
            return {"input_ids": [1, 2]}

        def decode(self, ids):
            return "zz"

    with pytest.raises(ValueError) as exc:
        OffsetsTokenizer(Slow(), "slow-tokenizer-offsets")("hello", return_offsets_mapping=True)
    _named(exc.value, "slow-tokenizer-offsets")


@pytest.mark.parametrize("index", ["{not json", '{"metadata": {}}', '{"weight_map": ["a"]}', "[1]"],
                         ids=["not-json", "no-weight-map", "weight-map-list", "not-an-object"])
def test_corrupt_checkpoint_index_names_the_patch(index, tmp_path):
    from spec_compat.shims.verifier import checkpoint_names

    (tmp_path / "model.safetensors.index.json").write_text(index)
    with pytest.raises(ValueError) as exc:
        checkpoint_names(tmp_path, "verifier-weights-wrapper-prefix")
    _named(exc.value, "verifier-weights-wrapper-prefix")
    (tmp_path / "model.safetensors.index.json").write_text('{"weight_map": {"a": "x.safetensors"}}')
    assert checkpoint_names(tmp_path, "verifier-weights-wrapper-prefix") == ["a"]
