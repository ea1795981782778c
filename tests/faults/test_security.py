"""Security: where ``trust_remote_code`` is enabled, nothing written into site-packages,
nothing imported from the current directory, no environment secrets in the report."""

from __future__ import annotations

import ast
import importlib.util
import inspect
import json
import subprocess
import sys
import textwrap
import types
from pathlib import Path

import pytest
from faults_helpers import child_env
from faults_support import full_run_command, unique

import spec_compat
from spec_compat import REGISTRY
from spec_compat.core.registry import Registry, Status

PKG = Path(spec_compat.__file__).resolve().parent

# -- trust_remote_code ---------------------------------------------------------

#: every place spec_compat turns trust_remote_code on (file:function -> why it may)
TRUST_SITES = {
    "patches/extraction/tokenizer_trust_remote_code.py:TokenizerTrustRemoteCode.install.AutoTokenizer.from_pretrained":
        "tokenizer-trust-remote-code: the generator's AutoTokenizer, only where its guard found speculators "
        "trusting the same model_path for AutoConfig and vLLM's ModelConfig (which also loads the tokenizer)",
    "patches/extraction/launch_vllm_trust_remote_code.py:LaunchVllmTrustRemoteCode.install.from_pretrained":
        "launch-vllm-trust-remote-code: the stock launch_vllm.py's one config read under spec-compat run, only "
        "when the arguments it hands to vllm serve hold --trust-remote-code (the user's consent to vLLM)",
    "patches/training/verifier_config_text_model.py:VerifierConfigTextModel.install.for_speculators":
        "verifier-config-text-model: speculators' training code (or a script built on speculators) loading a "
        "config.json that declares auto_map.AutoConfig - speculators' training code itself never trusts",
    "cli/checkpoints.py:load_config": "the commands' config load: trust = consent(checkpoint, --trust-remote-code)",
    "cli/engine_runs.py:engine_kwargs": "the commands' vLLM engine: trust = consent(checkpoint, --trust-remote-code)",
    "cli/evaluate.py:evaluate": "spec-compat evaluate: trust = consent(target, --trust-remote-code)",
    "cli/compare_drafts.py:evaluate_drafts": "spec-compat evaluate, several drafts: the same consent",
    "cli/compare_drafts.py:cmd_evaluate": "spec-compat evaluate: the user's --trust-remote-code",
    "cli/regenerate.py:regenerate_chats": "the demo's regeneration: trust = consent(target, the caller's word)",
    "cli/selftest.py:_run_checks": "spec-compat selftest: trust = consent(--model, --trust-remote-code)",
    "cli/selftest.py:main": "spec-compat selftest: the user's word, or True for the fixture this command wrote",
    "cli/selftest.py:cmd_selftest": "spec-compat selftest: the user's --trust-remote-code",
    "cli/demo.py:_steps": "spec-compat demo: the fixture the demo wrote (kimi-k25 ships its remote code in the package)",
    "cli/demo_steps.py:verifier_text_config":
        "spec-compat demo: spec-compat's own fixture (kimi-k25 ships its remote code in the package)",
}


def _trust_sites() -> dict[str, str]:
    """file:function -> how, for every trust_remote_code that is not a literal False."""
    sites = {}
    for path in sorted(PKG.rglob("*.py")):
        rel = path.relative_to(PKG).as_posix()
        if rel.startswith("fixtures/"):
            continue

        def walk(node, stack):
            for child in ast.iter_child_nodes(node):
                if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                    walk(child, [*stack, child.name])
                    continue
                where = f"{rel}:{'.'.join(stack)}"
                if isinstance(child, ast.keyword) and child.arg == "trust_remote_code":
                    if not (isinstance(child.value, ast.Constant) and child.value.value is False):
                        sites[where] = ast.unparse(child)
                if isinstance(child, ast.Assign) and any(
                        isinstance(t, ast.Subscript) and "trust_remote_code" in ast.unparse(t.slice)
                        for t in child.targets):
                    sites[where] = ast.unparse(child)
                walk(child, stack)

        walk(ast.parse(path.read_text()), [])
    return sites


def test_trust_remote_code_sites_are_the_known_ones():
    found = _trust_sites()
    assert set(found) == set(TRUST_SITES), (
        f"new: {sorted(set(found) - set(TRUST_SITES))}; gone: {sorted(set(TRUST_SITES) - set(found))} "
        "(review, then update TRUST_SITES and tests/faults/README.md)")


GEN_TEMPLATE = '''
class AutoConfig:
    @classmethod
    def from_pretrained(cls, path, **kwargs):
        return None


def ModelConfig(**kwargs):
    return kwargs


class AutoTokenizer:
    calls = []

    @classmethod
    def from_pretrained(cls, path, *args, **kwargs):
        cls.calls.append((path, kwargs))
        return "tokenizer"


class VllmHiddenStatesGenerator:
    def __init__(self, model_path, draft_path=None):
{body}
'''

GENERATORS = {
    "stock": """
        self.tokenizer = AutoTokenizer.from_pretrained(model_path)
        config = AutoConfig.from_pretrained(model_path, trust_remote_code=True)
        self.mc = ModelConfig(model=model_path, tokenizer=model_path, trust_remote_code=True)""",
    "config-untrusted": """
        self.tokenizer = AutoTokenizer.from_pretrained(model_path)
        config = AutoConfig.from_pretrained(model_path)
        self.mc = ModelConfig(model=model_path, trust_remote_code=True)""",
    "model-config-untrusted": """
        self.tokenizer = AutoTokenizer.from_pretrained(model_path)
        config = AutoConfig.from_pretrained(model_path, trust_remote_code=True)
        self.mc = ModelConfig(model=model_path)""",
    "other-path": """
        self.tokenizer = AutoTokenizer.from_pretrained(draft_path)
        config = AutoConfig.from_pretrained(model_path, trust_remote_code=True)
        self.mc = ModelConfig(model=model_path, trust_remote_code=True)""",
    "tokenizer-trusts-itself": """
        self.tokenizer = AutoTokenizer.from_pretrained(model_path, trust_remote_code=True)
        config = AutoConfig.from_pretrained(model_path, trust_remote_code=True)
        self.mc = ModelConfig(model=model_path, trust_remote_code=True)""",
    "rebound-path": """
        config = AutoConfig.from_pretrained(model_path, trust_remote_code=True)
        self.mc = ModelConfig(model=model_path, trust_remote_code=True)
        model_path = draft_path
        self.tokenizer = AutoTokenizer.from_pretrained(model_path)""",
    "rebound-by-walrus": """
        config = AutoConfig.from_pretrained(model_path, trust_remote_code=True)
        self.mc = ModelConfig(model=model_path, trust_remote_code=True)
        if (model_path := draft_path) is not None:
            self.tokenizer = AutoTokenizer.from_pretrained(model_path)""",
    "tokenizer-kwargs": """
        self.tokenizer = AutoTokenizer.from_pretrained(model_path, **self.kw)
        config = AutoConfig.from_pretrained(model_path, trust_remote_code=True)
        self.mc = ModelConfig(model=model_path, tokenizer=model_path, trust_remote_code=True)""",
    # speculators' own layout: ModelConfig is built in a method that __init__ hands the path to
    "model-config-in-method": """
        self.tokenizer = AutoTokenizer.from_pretrained(model_path)
        config = AutoConfig.from_pretrained(model_path, trust_remote_code=True)
        self.mc = self._config(model_path=model_path)

    def _config(self, model_path):
        return ModelConfig(model=model_path, tokenizer=model_path, trust_remote_code=True)""",
    "model-config-in-method-other-path": """
        self.tokenizer = AutoTokenizer.from_pretrained(model_path)
        config = AutoConfig.from_pretrained(model_path, trust_remote_code=True)
        self.mc = self._config(draft_path)

    def _config(self, model_path):
        return ModelConfig(model=model_path, tokenizer=model_path, trust_remote_code=True)""",
    "model-config-method-rebinds": """
        self.tokenizer = AutoTokenizer.from_pretrained(model_path)
        config = AutoConfig.from_pretrained(model_path, trust_remote_code=True)
        self.mc = self._config(model_path)

    def _config(self, model_path):
        model_path = model_path + "-other"
        return ModelConfig(model=model_path, tokenizer=model_path, trust_remote_code=True)""",
}
#: the variants where speculators trusts the tokenizer's own path already (the patch applies)
TRUSTED_SAME_PATH = {"stock", "model-config-in-method"}


def _apply_on(pid: str, module: types.ModuleType) -> Registry:
    cls = type(REGISTRY.get(pid))
    attr = REGISTRY.get(pid).target_attr
    reg = Registry()
    reg.register(type(cls.__name__, (cls,), {"target": f"{module.__name__}:{attr}", "requires": {},
                                              "__doc__": cls.__doc__, "__module__": cls.__module__}))
    reg.apply(environ={})
    return reg


def _module_from_source(tmp_path, monkeypatch, source: str) -> types.ModuleType:
    import importlib

    name = unique("gen")
    (tmp_path / f"{name}.py").write_text(source)
    monkeypatch.syspath_prepend(str(tmp_path))
    importlib.invalidate_caches()
    mod = importlib.import_module(name)
    monkeypatch.setitem(sys.modules, name, mod)
    return mod


@pytest.mark.parametrize("variant", list(GENERATORS))
def test_tokenizer_trusted_only_where_speculators_trusts_the_same_path(variant, tmp_path, monkeypatch):
    body = GENERATORS[variant].strip("\n")  # written at the indentation of __init__'s body
    mod = _module_from_source(tmp_path, monkeypatch, GEN_TEMPLATE.format(body=body))
    original = mod.AutoTokenizer
    reg = _apply_on("tokenizer-trust-remote-code", mod)
    try:
        status = reg.status("tokenizer-trust-remote-code")
        trusted_same_path = variant in TRUSTED_SAME_PATH
        assert status is (Status.APPLIED if trusted_same_path else Status.TARGET_CHANGED), reg.records()
        if status is Status.APPLIED:
            mod.VllmHiddenStatesGenerator("/m")  # its own tokenizer load: trusted as its config load is
            mod.AutoTokenizer.from_pretrained("/m")  # any other caller: as it asks
            mod.AutoTokenizer.from_pretrained("/m", trust_remote_code=False)
            assert original.calls == [("/m", {"trust_remote_code": True}), ("/m", {}),
                                      ("/m", {"trust_remote_code": False})]
        else:
            assert mod.AutoTokenizer is original
    finally:
        reg.revert()
    assert mod.AutoTokenizer is original


def test_real_generator_trusts_the_tokenizer_path_itself():
    """Independently of the patch's guard: in the installed speculators, the path the
    tokenizer is loaded from is the one AutoConfig and vLLM's ModelConfig (model= and
    tokenizer=) load with trust_remote_code=True."""
    gen = pytest.importorskip("speculators.data_generation.vllm_hidden_states_generator")
    tree = ast.parse(textwrap.dedent(inspect.getsource(gen.VllmHiddenStatesGenerator)))
    methods = {n.name: n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef)}
    init = methods["__init__"]

    def calls(fn, dotted):
        return [c for c in ast.walk(fn) if isinstance(c, ast.Call) and ast.unparse(c.func) == dotted]

    def trusts(call):
        return any(k.arg == "trust_remote_code" and isinstance(k.value, ast.Constant) and k.value.value is True
                   for k in call.keywords)

    (tok,) = calls(init, "AutoTokenizer.from_pretrained")
    assert not any(k.arg == "trust_remote_code" for k in tok.keywords)
    path = ast.unparse(tok.args[0])
    assert path in [a.arg for a in init.args.args], "the tokenizer path is the constructor's parameter"
    rebinds = [n for n in ast.walk(init) if isinstance(n, (ast.Assign, ast.AugAssign, ast.AnnAssign))
               and path in [ast.unparse(t) for t in getattr(n, "targets", [getattr(n, "target", None)]) if t]]
    assert not rebinds, "the path is rebound in __init__"
    cfg = [c for c in calls(init, "AutoConfig.from_pretrained") if trusts(c)]
    assert cfg and all(ast.unparse(c.args[0]) == path for c in cfg)
    # ModelConfig(model=p, tokenizer=p, trust_remote_code=True) in the method __init__ hands the same path to
    mc = [c for fn in methods.values() for c in calls(fn, "ModelConfig") if trusts(c)]
    assert mc, "vLLM's ModelConfig is built with trust_remote_code=True"
    (owner,) = [fn for fn in methods.values() if any(c in mc for c in calls(fn, "ModelConfig"))]
    kw = {k.arg: ast.unparse(k.value) for k in mc[0].keywords}
    param = kw["model"]
    assert kw.get("tokenizer", param) == param
    handed = [c for c in calls(init, f"self.{owner.name}")]
    assert handed, f"__init__ calls {owner.name}"
    params = [a.arg for a in owner.args.args][1:]
    for c in handed:
        bound = dict(zip(params, map(ast.unparse, c.args)))
        bound.update({k.arg: ast.unparse(k.value) for k in c.keywords})
        assert bound.get(param) in (path, f"self.{path}"), (param, bound)


CALLER = """
def load(path, **kwargs):
    return AutoConfig.from_pretrained(path, **kwargs)
"""


def _caller(name: str, auto_config, extra: dict | None = None):
    g = {"__name__": name, "AutoConfig": auto_config, **(extra or {})}
    exec(compile(CALLER, f"<{name}>", "exec"), g)
    return g["load"]


@pytest.mark.parametrize("caller, remote, kwargs, trusted", [
    ("__main__", True, {}, False),                                   # a user's own code
    ("transformers.pipelines", True, {}, False),                     # another library
    ("speculators.data_generation.preprocessing", True, {}, False),  # passes its own trust
    ("speculators.train.trainer", False, {}, False),                 # no remote code declared
    ("speculators.train.trainer", True, {"trust_remote_code": False}, False),  # explicit refusal kept
    ("speculators.train.trainer", "missing", {}, False),             # no config.json
    ("speculators.train.trainer", True, {}, True),                   # the rule
    ("__main__+speculators", True, {}, True),                        # a stock speculators script
], ids=["user", "library", "data-generation", "no-auto-map", "explicit-false", "no-config", "training",
        "script"])
def test_verifier_config_trusts_only_speculators_training_on_declared_remote_code(
        caller, remote, kwargs, trusted, tmp_path):
    model = tmp_path / "model"
    model.mkdir()
    if remote != "missing":
        cfg = {"model_type": "x", "hidden_size": 8}
        if remote:
            cfg["auto_map"] = {"AutoConfig": "configuration_x.XConfig"}
        (model / "config.json").write_text(json.dumps(cfg))
    seen = []

    class AutoConfig:
        @classmethod
        def from_pretrained(cls, pretrained_model_name_or_path, *args, **kw):
            seen.append(dict(kw))
            return types.SimpleNamespace(hidden_size=8)

    mod = types.ModuleType(unique("auto"))
    mod.AutoConfig = AutoConfig
    sys.modules[mod.__name__] = mod
    reg = _apply_on("verifier-config-text-model", mod)
    try:
        assert reg.status("verifier-config-text-model") is Status.APPLIED, reg.records()
        name, _, plus = caller.partition("+")
        # a stock speculators script: its globals hold what it imported from speculators
        trainer = type("Trainer", (), {"__module__": "speculators.train.trainer"})
        load = _caller(name, mod.AutoConfig, {"Trainer": trainer} if plus else None)
        load(str(model), **kwargs)
    finally:
        reg.revert()
        sys.modules.pop(mod.__name__, None)
    assert seen[0].get("trust_remote_code", False) is trusted, seen


def test_remote_code_is_named_from_the_checkpoints_own_files(tmp_path):
    """What the commands refuse without --trust-remote-code: any auto_map a checkpoint's config or
    tokenizer config names (transformers imports those modules), and nothing else."""
    from spec_compat.cli.checkpoints import RemoteCodeRefused, consent, remote_code_modules

    cases = {"auto-config": ({"auto_map": {"AutoConfig": "c.C"}}, None, ["c"]),
             "tokenizer-only": ({"model_type": "llama"}, {"auto_map": {"AutoTokenizer": ["t.T", None]}}, ["t"]),
             "hub-ref": ({"auto_map": {"AutoConfig": "org/repo--conf.C"}}, None, ["conf"]),
             "plain": ({"model_type": "llama"}, None, []), "malformed": (None, None, [])}
    for name, (cfg, tok, want) in cases.items():
        d = tmp_path / name
        d.mkdir()
        (d / "config.json").write_text("{nope" if cfg is None else json.dumps(cfg))
        if tok is not None:
            (d / "tokenizer_config.json").write_text(json.dumps(tok))
        assert remote_code_modules(d) == want, name
        assert consent(d, "target", trust=True) is bool(want), name
        if want:
            with pytest.raises(RemoteCodeRefused, match=rf"target '.*{name}' ships its own code \(auto_map names "
                                                        rf"{want[0]}\.py\): pass --trust-remote-code to run it"):
                consent(d, "target", trust=False)
        else:
            assert consent(d, "target", trust=False) is False


# -- a full non-engine run: site-packages untouched, no secrets in the report ---

@pytest.fixture(scope="module")
def full_run(full_run_in_background, tmp_path_factory):
    handle = full_run_in_background or full_run_command(tmp_path_factory.mktemp("full-run"))
    return handle.finish(timeout=540), handle.out, handle.values


def test_full_run_writes_nothing_into_site_packages(full_run):
    watched, out, _ = full_run
    (proc,) = watched.procs
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert json.loads((out / "workload.json").read_text())
    assert watched.changes.files > 1000, watched.roots  # the snapshot saw the environment
    assert not watched.changes, watched.changes.summary()


def test_report_never_includes_environment_secrets(full_run):
    watched, out, values = full_run
    (proc,) = watched.procs
    assert proc.returncode == 0, proc.stderr[-3000:]
    data = json.loads((out / "report.json").read_text())
    assert data["patches"]
    texts = {name: (out / name).read_text() for name in ("report.json", "report.txt", "patches.txt")}
    texts["stdout+stderr (SPEC_COMPAT_LOG=DEBUG)"] = proc.stdout + proc.stderr
    for where, text in texts.items():
        leaked = [var for var, value in values.items() if value in text]
        assert not leaked, f"{where} contains the value of {leaked}"


# -- the plugin imports nothing from the current directory ----------------------

BAIT = ("vllm", "speculators", "torch", "transformers", "packaging", "wrapt", "spec_compat_evil", "sitecustomize",
        "usercustomize", "plugin", "registry", "switches", "cli", "patches", "shims", "json", "logging", "typing")


def _bait(cwd: Path) -> Path:
    marker = cwd / "IMPORTED"
    for name in BAIT:
        (cwd / f"{name}.py").write_text(f"open({str(marker)!r}, 'a').write({name!r} + '\\n')\n")
    return marker


PLUGIN_PROBE = """
import os, sys
import spec_compat.plugin as plugin
plugin.register()
plugin.cpu_platform()
from spec_compat.cli import main
main(["patches"])
cwd = os.getcwd()
assert cwd not in sys.path and "" not in sys.path, sys.path
from_cwd = [m for m, mod in list(sys.modules.items())
            if getattr(mod, "__file__", None) and os.path.dirname(os.path.abspath(mod.__file__)) == cwd]
assert not from_cwd, from_cwd
print("PROBE-OK")
"""


def test_plugin_imports_nothing_from_the_current_directory(tmp_path):
    marker = _bait(tmp_path)
    proc = subprocess.run([sys.executable, "-P", "-c", PLUGIN_PROBE], capture_output=True, text=True,
                          env=child_env(), cwd=tmp_path, timeout=120)
    assert proc.returncode == 0 and "PROBE-OK" in proc.stdout, proc.stderr[-3000:]
    assert not marker.exists(), marker.read_text()


def test_run_adds_the_scripts_directory_not_the_current_one(tmp_path):
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    marker = _bait(cwd)
    scripts = tmp_path / "scripts"
    scripts.mkdir()
    (scripts / "helper_mod.py").write_text("VALUE = 7\n")
    (scripts / "main.py").write_text("import helper_mod, os, sys\nassert os.getcwd() not in sys.path\n"
                                     "print('RUN', helper_mod.VALUE)\n")
    proc = subprocess.run([sys.executable, "-P", "-m", "spec_compat", "run", str(scripts / "main.py")],
                          capture_output=True, text=True, env=child_env(), cwd=cwd, timeout=120)
    assert proc.returncode == 0 and "RUN 7" in proc.stdout, proc.stderr[-3000:]
    assert not marker.exists(), marker.read_text()


def test_bait_works(tmp_path):
    """Without -P, Python itself puts the current directory first for ``-c``: the bait
    is imported (so the tests above would notice)."""
    marker = _bait(tmp_path)
    subprocess.run([sys.executable, "-c", "import wrapt"], env=child_env(), cwd=tmp_path, timeout=60)
    assert "wrapt" in marker.read_text().split()


# -- consent: a checkpoint's own code runs only with --trust-remote-code ----------

MARKER_CONFIG = '''
import os
from pathlib import Path
from transformers import PretrainedConfig

Path(os.environ["MARKER_FILE"]).write_text("imported")


class XConfig(PretrainedConfig):
    model_type = "marker-x"
'''


def _marker_checkpoint(root: Path) -> Path:
    """A checkpoint whose configuration module writes ``$MARKER_FILE`` when imported."""
    d = root / "marker-ckpt"
    d.mkdir()
    (d / "config.json").write_text(json.dumps({"model_type": "marker-x",
                                               "auto_map": {"AutoConfig": "configuration_x.XConfig"}}))
    (d / "configuration_x.py").write_text(MARKER_CONFIG)
    return d


def _eagle3_draft(root: Path) -> Path:
    d = root / "draft"
    d.mkdir()
    (d / "config.json").write_text(json.dumps({"speculators_model_type": "eagle3", "architectures": ["Eagle3Speculator"]}))
    return d


#: command -> its arguments naming the checkpoint (``{ckpt}``, ``{draft}``)
CONSENT_COMMANDS = {
    "selftest": ["selftest", "--model", "{ckpt}"],
    "evaluate": ["evaluate", "--target", "{ckpt}", "--draft", "{draft}"],
    "evaluate-several": ["evaluate", "--target", "{ckpt}", "--draft", "{draft}", "--draft", "{draft}"],
}


def _spec_compat(args: list[str], tmp_path: Path, timeout: int = 300) -> tuple[subprocess.CompletedProcess, Path]:
    ckpt = tmp_path / "marker-ckpt" if (tmp_path / "marker-ckpt").is_dir() else _marker_checkpoint(tmp_path)
    draft = tmp_path / "draft" if (tmp_path / "draft").is_dir() else _eagle3_draft(tmp_path)
    marker = tmp_path / "marker"
    env = dict(child_env(), MARKER_FILE=str(marker))
    argv = [a.format(ckpt=ckpt, draft=draft) for a in args]
    proc = subprocess.run([sys.executable, "-m", "spec_compat", *argv], capture_output=True, text=True, env=env,
                          timeout=timeout, cwd=tmp_path)
    return proc, marker


@pytest.mark.parametrize("command", CONSENT_COMMANDS)
def test_remote_code_is_refused_without_the_flag(command, tmp_path):
    proc, marker = _spec_compat(CONSENT_COMMANDS[command], tmp_path)
    assert not marker.exists(), "the checkpoint's configuration module was imported without --trust-remote-code"
    assert proc.returncode == 2, proc.stdout[-2000:] + proc.stderr[-3000:]
    lines = [ln for ln in proc.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1, proc.stderr
    assert "marker-ckpt' ships its own code (auto_map names configuration_x.py): pass --trust-remote-code" \
        in lines[0], lines


@pytest.mark.parametrize("command", ["selftest", "evaluate"])
def test_remote_code_runs_with_the_flag(command, tmp_path):
    if importlib.util.find_spec("vllm") is None:
        pytest.skip(f"{command} loads the checkpoint once its engine can start: this environment has no vLLM "
                    "(the refusal without the flag, checked first, is tested here all the same)")
    if command == "evaluate":
        from spec_compat.cli.evaluate import serving_unsupported

        why = serving_unsupported()
        if why:  # evaluate refuses before the load, with this line (tests/unit/test_compare_drafts.py)
            pytest.skip(f"evaluate cannot serve here, so it stops before loading the checkpoint: {why}")
    proc, marker = _spec_compat([*CONSENT_COMMANDS[command], "--trust-remote-code"], tmp_path)
    assert marker.exists(), ("--trust-remote-code given, yet the checkpoint's configuration was not loaded: "
                             + proc.stdout[-2000:] + proc.stderr[-3000:])


def test_an_unknown_configuration_is_one_line(tmp_path):
    d = tmp_path / "unknown-type"
    d.mkdir()
    (d / "config.json").write_text(json.dumps({"model_type": "nonesuch-lm"}))
    proc, _ = _spec_compat(["selftest", "--model", str(d)], tmp_path)
    assert proc.returncode == 2, proc.stderr[-3000:]
    lines = [ln for ln in proc.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and "unknown-type': model_type 'nonesuch-lm' is not a configuration transformers" \
        in lines[0], proc.stderr
