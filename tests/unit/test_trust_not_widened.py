"""The two patches that give a stock load ``trust_remote_code`` never widen trust beyond the stock
code's own consent for the same path (issue 46, items 2 and 3), on fake targets:

* ``tokenizer-trust-remote-code``: applied only where speculators' generator loads the tokenizer's own
  path with ``AutoConfig.from_pretrained(path, trust_remote_code=True)`` run by every ``__init__``; at
  run time only that ``__init__``'s load of that path is trusted;
* ``launch-vllm-trust-remote-code``: only the stock ``launch_vllm.py`` run by ``spec-compat run``, its one
  ``AutoConfig.from_pretrained(args.model)``, and only when it hands ``--trust-remote-code`` to vLLM.
"""

from __future__ import annotations

import importlib
import runpy
import sys
import textwrap
import types
import uuid

import pytest

from spec_compat import REGISTRY
from spec_compat import patches  # noqa: F401  (registers every patch)
from spec_compat.core.registry import Registry, Status


def _apply_on(pid: str, module: types.ModuleType) -> Registry:
    """A registry holding only ``pid``, its target moved onto ``module``, its ranges dropped, applied."""
    cls = type(REGISTRY.get(pid))
    attr = REGISTRY.get(pid).target_attr
    reg = Registry()
    reg.register(type(cls.__name__, (cls,), {"target": f"{module.__name__}:{attr}", "requires": {},
                                              "__doc__": cls.__doc__, "__module__": cls.__module__}))
    reg.apply(environ={})
    return reg


def _module(tmp_path, monkeypatch, source: str) -> types.ModuleType:
    name = f"fake_{uuid.uuid4().hex[:12]}"
    (tmp_path / f"{name}.py").write_text(textwrap.dedent(source))
    monkeypatch.syspath_prepend(str(tmp_path))
    importlib.invalidate_caches()
    mod = importlib.import_module(name)
    monkeypatch.setitem(sys.modules, name, mod)
    return mod


# -- tokenizer-trust-remote-code ------------------------------------------------------------

TOKENIZER = "tokenizer-trust-remote-code"

GENERATOR = '''
class AutoConfig:
    calls = []

    @classmethod
    def from_pretrained(cls, path, **kwargs):
        cls.calls.append((path, kwargs))


def ModelConfig(**kwargs):
    return kwargs


class AutoTokenizer:
    calls = []

    @classmethod
    def from_pretrained(cls, path, *args, **kwargs):
        cls.calls.append((path, kwargs))
        return "tokenizer"


def load_tokenizer(path):
    """Another caller of the module's AutoTokenizer."""
    return AutoTokenizer.from_pretrained(path)


class VllmHiddenStatesGenerator:
    def __init__(self, model_path, trust=True, draft_path="/draft"):
{body}
        self.mc = ModelConfig(model=model_path, tokenizer=model_path, trust_remote_code=True)


class Subclass(VllmHiddenStatesGenerator):
    def __init__(self, model_path):
        self.tokenizer = AutoTokenizer.from_pretrained(model_path)
'''

#: __init__'s first lines (its body's indentation: 8 spaces); the config load is what varies
CONFIG_LOADS = {
    "stock": """
        self.tokenizer = AutoTokenizer.from_pretrained(model_path)
        config = AutoConfig.from_pretrained(model_path, trust_remote_code=True)""",
    "config-untrusted": """
        self.tokenizer = AutoTokenizer.from_pretrained(model_path)
        config = AutoConfig.from_pretrained(model_path)""",
    "config-trust-explicitly-false": """
        self.tokenizer = AutoTokenizer.from_pretrained(model_path)
        config = AutoConfig.from_pretrained(model_path, trust_remote_code=False)""",
    "config-trust-is-the-callers-choice": """
        self.tokenizer = AutoTokenizer.from_pretrained(model_path)
        config = AutoConfig.from_pretrained(model_path, trust_remote_code=trust)""",
    "config-trusted-only-sometimes": """
        self.tokenizer = AutoTokenizer.from_pretrained(model_path)
        if trust:
            config = AutoConfig.from_pretrained(model_path, trust_remote_code=True)""",
    "config-trusted-load-may-be-skipped": """
        self.tokenizer = AutoTokenizer.from_pretrained(model_path)
        try:
            config = AutoConfig.from_pretrained(model_path, trust_remote_code=True)
        except ValueError:
            config = None""",
    "config-trusted-in-a-function-never-called": """
        self.tokenizer = AutoTokenizer.from_pretrained(model_path)
        later = lambda: AutoConfig.from_pretrained(model_path, trust_remote_code=True)""",
    "config-trusts-another-path": """
        self.tokenizer = AutoTokenizer.from_pretrained(model_path)
        config = AutoConfig.from_pretrained(draft_path, trust_remote_code=True)""",
}


def _generator(tmp_path, monkeypatch, variant: str) -> types.ModuleType:
    return _module(tmp_path, monkeypatch, GENERATOR.replace("{body}", CONFIG_LOADS[variant].strip("\n")))


@pytest.mark.parametrize("variant", [v for v in CONFIG_LOADS if v != "stock"])
def test_tokenizer_not_trusted_where_the_config_load_does_not_trust(variant, tmp_path, monkeypatch):
    mod = _generator(tmp_path, monkeypatch, variant)
    original = mod.AutoTokenizer
    reg = _apply_on(TOKENIZER, mod)
    try:
        assert reg.status(TOKENIZER) is Status.TARGET_CHANGED, reg.records()
        assert mod.AutoTokenizer is original
        mod.VllmHiddenStatesGenerator("/m", trust=False)
        assert original.calls == [("/m", {})]  # loaded as speculators asks: transformers refuses remote code
    finally:
        reg.revert()


def test_tokenizer_trusted_only_at_the_generators_own_load_of_its_path(tmp_path, monkeypatch):
    mod = _generator(tmp_path, monkeypatch, "stock")
    original = mod.AutoTokenizer
    reg = _apply_on(TOKENIZER, mod)
    try:
        assert reg.status(TOKENIZER) is Status.APPLIED, reg.records()
        mod.VllmHiddenStatesGenerator("/m")
        assert mod.AutoConfig.calls == [("/m", {"trust_remote_code": True})]
        assert original.calls == [("/m", {"trust_remote_code": True})]  # the same trust as its config load
        original.calls.clear()
        mod.load_tokenizer("/m")  # another function of the module
        mod.AutoTokenizer.from_pretrained("/m")  # a caller outside the module
        mod.Subclass("/m")  # another __init__
        mod.AutoTokenizer.from_pretrained("/m", trust_remote_code=False)  # an explicit choice
        assert original.calls == [("/m", {}), ("/m", {}), ("/m", {}), ("/m", {"trust_remote_code": False})]
    finally:
        reg.revert()
    assert mod.AutoTokenizer is original


# -- launch-vllm-trust-remote-code ----------------------------------------------------------

LAUNCH = "launch-vllm-trust-remote-code"

TRANSFORMERS = '''
class AutoConfig:
    calls = []

    @classmethod
    def from_pretrained(cls, pretrained_model_name_or_path, **kwargs):
        cls.calls.append((pretrained_model_name_or_path, kwargs))
        return cls()
'''

#: the shape of speculators 0.5-0.7's scripts/launch_vllm.py main() (written here, not copied)
SCRIPT = '''
import argparse
from {tf} import AutoConfig


def parse_args():
    parser = argparse.ArgumentParser()
    parser.add_argument("model")
    return parser.parse_known_args()


def main():
    args, vllm_args = parse_args()
    if "--" in vllm_args:
        vllm_args.remove("--")
{load}
    cmd = ["python", "-m", "vllm.entrypoints.cli.main", "serve", args.model, *vllm_args]
    return cmd


if __name__ == "__main__":
    main()
'''

STOCK_LOAD = "    config = AutoConfig.from_pretrained(args.model)"


@pytest.fixture
def fake_transformers(tmp_path, monkeypatch):
    mod = _module(tmp_path, monkeypatch, TRANSFORMERS)
    reg = _apply_on(LAUNCH, mod)
    assert reg.status(LAUNCH) is Status.APPLIED, reg.records()
    yield mod
    reg.revert()


def _launch(tmp_path, monkeypatch, tf: types.ModuleType, argv: list[str], *, name: str = "launch_vllm.py",
            load: str = STOCK_LOAD, under_run: bool = True) -> list:
    """Run the fake script as ``spec-compat run`` does (``__main__``, ``SCRIPT`` set) and return the config loads."""
    import os

    from spec_compat.cli import run

    script = tmp_path / name
    script.write_text(SCRIPT.format(tf=tf.__name__, load=load))
    monkeypatch.setattr(run, "SCRIPT", os.path.realpath(script) if under_run else None)
    monkeypatch.setattr(sys, "argv", [str(script), *argv])
    tf.AutoConfig.calls.clear()
    runpy.run_path(str(script), run_name="__main__")
    return list(tf.AutoConfig.calls)


@pytest.mark.parametrize("vllm,trusted", [
    (["--", "--trust-remote-code"], True),
    (["--", "--trust_remote_code", "--port", "8000"], True),
    ([], False),
    (["--", "--port", "8000"], False),
    (["--", "--trust-remote-code", "--no-trust-remote-code"], False),
    (["--", "--no-trust-remote-code", "--trust-remote-code"], True),
])
def test_launch_config_trusted_exactly_when_vllm_is(vllm, trusted, fake_transformers, tmp_path, monkeypatch):
    calls = _launch(tmp_path, monkeypatch, fake_transformers, ["/m", *vllm])
    assert calls == [("/m", {"trust_remote_code": True} if trusted else {})]


@pytest.mark.parametrize("case", ["not-under-spec-compat-run", "another-script-name", "another-load",
                                  "two-loads"])
def test_launch_config_trust_only_for_the_stock_script_under_run(case, fake_transformers, tmp_path, monkeypatch):
    kw: dict = {}
    if case == "not-under-spec-compat-run":
        kw["under_run"] = False
    elif case == "another-script-name":
        kw["name"] = "my_launcher.py"
    elif case == "another-load":
        kw["load"] = "    config = AutoConfig.from_pretrained(vllm_args[-1])"
    elif case == "two-loads":
        kw["load"] = STOCK_LOAD + "\n    other = AutoConfig.from_pretrained(args.model)"
    calls = _launch(tmp_path, monkeypatch, fake_transformers, ["/m", "--", "--trust-remote-code"], **kw)
    assert calls and all(kwargs == {} for _, kwargs in calls), calls


def test_launch_config_other_callers_unchanged(fake_transformers):
    fake_transformers.AutoConfig.calls.clear()
    fake_transformers.AutoConfig.from_pretrained("/m")
    assert fake_transformers.AutoConfig.calls == [("/m", {})]
