"""Host safety: the vLLM plugin never raises into vLLM, double import, and
``spec-compat run`` propagating the script's exit status and signals exactly as
``python script.py`` does.  (Fake-patch concurrency and apply/revert rounds are in
tests/unit/test_concurrency.py and test_registry_lifecycle.py; the real registry's are
in test_real_registry_lifecycle.py here.)"""

from __future__ import annotations

import json
import logging
import signal
import subprocess
import sys
import textwrap
import types

import pytest
from faults_helpers import child_env
from faults_support import unique

import spec_compat
from spec_compat import plugin
from spec_compat.core import switches
from spec_compat.core.registry import Changes, Patch, PatchError, Registry, Status, TargetChanged

# -- the plugin ---------------------------------------------------------------


def _fake_registry(install=None, check=None) -> tuple[Registry, types.ModuleType]:
    mod = types.ModuleType(unique("plugin"))
    mod.Thing = object()
    sys.modules[mod.__name__] = mod

    def _install(self, module, changes: Changes):
        if install:
            install(module, changes)

    def _check(self, module):
        if check:
            check(module)

    reg = Registry()
    reg.register(type("P", (Patch,), {"__doc__": "fake", "id": "fake-broken", "summary": "s", "upstream": "u",
                                      "target": f"{mod.__name__}:Thing", "install": _install, "check": _check}))
    return reg, mod


def _half_way(module, changes):
    changes.setattr(module, "Thing", "replaced")
    raise RuntimeError("install exploded")


def _guard_bug(module):
    raise KeyError("guard bug")


def _changed(module):
    raise TargetChanged("drifted")


@pytest.mark.parametrize("broken", ["install-raises", "guard-raises", "target-changed"])
def test_plugin_with_a_broken_patch_logs_and_returns(broken, monkeypatch, caplog):
    reg, mod = _fake_registry(**{"install-raises": {"install": _half_way},
                                 "guard-raises": {"check": _guard_bug},
                                 "target-changed": {"check": _changed}}[broken])
    thing = mod.Thing
    monkeypatch.setattr(spec_compat, "REGISTRY", reg)
    caplog.set_level(logging.WARNING, logger="spec_compat")
    try:
        assert plugin.register() is None
        assert plugin.register() is None  # re-entrant
        status = reg.status("fake-broken")
        assert status is {"install-raises": Status.FAILED, "guard-raises": Status.FAILED,
                          "target-changed": Status.TARGET_CHANGED}[broken]
        assert mod.Thing is thing
        assert any("fake-broken" in r.getMessage() for r in caplog.records)
    finally:
        reg.revert()
        sys.modules.pop(mod.__name__, None)


@pytest.mark.parametrize("error", [RuntimeError("registry exploded"), ImportError("no module named x"),
                                   switches.SwitchError("SPEC_COMPAT_DISABLE='?': malformed"),
                                   RecursionError("deep")])
def test_plugin_when_apply_itself_raises_logs_and_returns(error, monkeypatch, caplog):
    def apply():
        raise error

    monkeypatch.setattr(spec_compat, "apply", apply)
    caplog.set_level(logging.ERROR, logger="spec_compat")
    assert plugin.register() is None
    msg = " ".join(r.getMessage() for r in caplog.records)
    assert type(error).__name__ in msg and str(error) in msg


@pytest.mark.parametrize("env", [{"SPEC_COMPAT_DISABLE": "no-such-patch"}, {"SPEC_COMPAT_DISABLE": "Bad Id"},
                                 {"SPEC_COMPAT_DISABLE": "x,,y", "SPEC_COMPAT_STRICT": "sometimes"}],
                         ids=["unknown-id", "malformed-id", "malformed-both"])
def test_plugin_with_malformed_switches_logs_and_returns(env, monkeypatch, caplog):
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    before = spec_compat.records()
    caplog.set_level(logging.ERROR, logger="spec_compat")
    assert plugin.register() is None
    assert "SPEC_COMPAT_DISABLE" in caplog.text
    assert spec_compat.records() == before  # nothing decided differently


def test_plugin_in_strict_mode_raises_by_design(monkeypatch):
    """SPEC_COMPAT_STRICT=1 (CI) is the one exception: a drifted patch raises PatchError
    out of the plugin, naming the patch."""
    reg, mod = _fake_registry(check=_changed)
    monkeypatch.setattr(spec_compat, "REGISTRY", reg)
    monkeypatch.setenv("SPEC_COMPAT_STRICT", "1")
    try:
        with pytest.raises(PatchError, match="fake-broken"):
            plugin.register()
    finally:
        reg.revert()
        sys.modules.pop(mod.__name__, None)


def test_platform_plugin_never_raises(monkeypatch, caplog):
    from spec_compat.core import versions as _versions

    def broken(name):
        raise RuntimeError("metadata exploded")

    monkeypatch.setattr(_versions, "installed_version", broken)
    caplog.set_level(logging.ERROR, logger="spec_compat")
    assert plugin.cpu_platform() is None
    assert "metadata exploded" in caplog.text


BROKEN_REGISTRY = """
import importlib.abc, sys
class Broken(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name == "spec_compat.patches.serving.eagle3_deepseek_aux_states":
            raise SyntaxError("a broken patch module")
        return None
sys.meta_path.insert(0, Broken())
"""


def test_plugin_with_a_registry_that_cannot_import(tmp_path):
    """A patch module that cannot be imported: the plugin entry point still loads (patch
    modules are loaded on first use), and register() - whose call vLLM's loader
    (vllm/plugins/__init__.py load_plugins_by_group) does not guard - logs the error and
    returns.  The loader's loop is reproduced here (importing vllm.plugins would cost ~10 s
    of the suite)."""
    probe = BROKEN_REGISTRY + textwrap.dedent("""
        import logging
        logging.basicConfig(level=logging.ERROR)
        from importlib.metadata import EntryPoint
        ep = EntryPoint(name="spec_compat", value="spec_compat.plugin:register", group="vllm.general_plugins")
        plugins = {}
        try:
            plugins[ep.name] = ep.load()
        except Exception as exc:
            print("LOAD-FAILED", type(exc).__name__, exc)
        for func in plugins.values():
            func()
        print("HOST-CONTINUES", len(plugins))
    """)
    proc = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, env=child_env(),
                          cwd=tmp_path, timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "LOAD-FAILED" not in proc.stdout
    assert "HOST-CONTINUES 1" in proc.stdout
    assert "plugin could not apply the registry: SyntaxError" in proc.stderr, proc.stderr[-3000:]


# -- double import ------------------------------------------------------------

PROBE = """
import importlib, json, sys
import spec_compat
first = [r.as_dict() for r in spec_compat.records()]
importlib.reload(spec_compat)
import spec_compat as again
second = [r.as_dict() for r in again.records()]
print(json.dumps({"first": first, "second": second, "same_registry": again.REGISTRY is spec_compat.REGISTRY,
                  "patches": len(again.REGISTRY.patches())}))
"""


def test_reload_is_idempotent_and_two_processes_agree(tmp_path):
    runs = []
    for _ in range(2):
        proc = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True, env=child_env(),
                              cwd=tmp_path, timeout=120)
        assert proc.returncode == 0, proc.stderr[-3000:]
        runs.append(json.loads(proc.stdout.strip().splitlines()[-1]))
    a, b = runs
    assert a["first"] == a["second"] and a["same_registry"]
    assert a["patches"] == len(spec_compat.REGISTRY.patches())
    assert a == b


RELOAD_THEN_TARGET = """
import importlib, json, sys
sys.path.insert(0, sys.argv[1])
import spec_compat
from spec_compat.core.registry import Patch
calls = []
class Counting(Patch):
    \"\"\"Counts its installs.\"\"\"
    id = "faults-counting"
    summary = upstream = "counts"
    target = "faults_target:value"
    def install(self, module, changes):
        calls.append(module)
        changes.setattr(module, "value", module.value + 1)
spec_compat.REGISTRY.register(Counting)
spec_compat.apply()
importlib.reload(spec_compat)
importlib.reload(spec_compat)
spec_compat.apply(); spec_compat.apply()
import faults_target
status = spec_compat.REGISTRY.status("faults-counting").value
spec_compat.apply()
print(json.dumps({"status": status, "installs": len(calls), "value": faults_target.value}))
"""


def test_double_import_installs_once(tmp_path):
    """spec_compat reloaded twice and applied four times before its target is imported:
    one install, one change."""
    (tmp_path / "faults_target.py").write_text("value = 1\n")
    proc = subprocess.run([sys.executable, "-c", RELOAD_THEN_TARGET, str(tmp_path)], capture_output=True,
                          text=True, env=child_env(), cwd=tmp_path, timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out == {"status": "applied", "installs": 1, "value": 2}


# -- spec-compat run: same exit status and signals as python ------------------

SCRIPTS = {
    "exit-0": "import sys\nsys.exit(0)\n",
    "exit-3": "import sys\nsys.exit(3)\n",
    "exit-255": "raise SystemExit(255)\n",
    "exit-256": "import sys\nsys.exit(256)\n",
    "exit-message": "import sys\nsys.exit('fatal: bad input')\n",
    "os-exit-42": "import os\nos._exit(42)\n",
    "keyboard-interrupt": "raise KeyboardInterrupt\n",
    "exception-in-atexit": "import atexit, sys\natexit.register(lambda: print('ATEXIT RAN'))\nsys.exit(5)\n",
    "sigint-self": "import os, signal\nos.kill(os.getpid(), signal.SIGINT)\nimport time; time.sleep(5)\n",
    "sigkill-self": "import os, signal\nos.kill(os.getpid(), signal.SIGKILL)\n",
    "unflushed-output": "import sys\nsys.stdout.write('partial line without newline')\nsys.exit(4)\n",
}


def _both(tmp_path, body: str, *args: str) -> tuple[subprocess.CompletedProcess, subprocess.CompletedProcess]:
    script = tmp_path / "script.py"
    script.write_text(body)
    env = child_env()
    plain = subprocess.run([sys.executable, str(script), *args], capture_output=True, text=True, env=env,
                           cwd=tmp_path, timeout=60)
    run = subprocess.run([sys.executable, "-m", "spec_compat", "run", str(script), *args], capture_output=True,
                         text=True, env=env, cwd=tmp_path, timeout=60)
    return plain, run


@pytest.mark.parametrize("case", list(SCRIPTS))
def test_run_exits_like_python(case, tmp_path):
    plain, run = _both(tmp_path, SCRIPTS[case])
    assert run.returncode == plain.returncode, (run.returncode, plain.returncode, run.stderr[-2000:])
    assert run.stdout == plain.stdout
    if case == "exit-message":
        assert run.returncode == 1 and "fatal: bad input" in run.stderr
    if case == "keyboard-interrupt":
        assert "KeyboardInterrupt" in run.stderr
    if case == "exception-in-atexit":
        assert "ATEXIT RAN" in run.stdout


WAITER = textwrap.dedent("""
    import signal, sys, time
    if len(sys.argv) > 1 and sys.argv[1] == "handler":
        signal.signal(signal.SIGTERM, lambda *a: sys.exit(143))
    print("READY", flush=True)
    time.sleep(30)
""")


def _default_dispositions() -> None:
    """Children start with default signal handling: an ignored SIGINT/SIGHUP is inherited across
    exec (pytest started with nohup or as a background job) and Python then keeps ignoring it."""
    for s in (signal.SIGINT, signal.SIGHUP, signal.SIGTERM):
        signal.signal(s, signal.SIG_DFL)


@pytest.mark.parametrize("sig, mode", [(signal.SIGTERM, "default"), (signal.SIGINT, "default"),
                                       (signal.SIGTERM, "handler"), (signal.SIGHUP, "default")],
                         ids=["sigterm", "sigint", "sigterm-handler", "sighup"])
def test_run_signal_from_outside_like_python(sig, mode, tmp_path):
    script = tmp_path / "waiter.py"
    script.write_text(WAITER)
    codes = []
    for cmd in ([sys.executable, str(script), mode], [sys.executable, "-m", "spec_compat", "run", str(script), mode]):
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=child_env(),
                                cwd=tmp_path, preexec_fn=_default_dispositions)
        try:
            assert proc.stdout.readline().strip() == "READY"
            proc.send_signal(sig)
            proc.communicate(timeout=30)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        codes.append(proc.returncode)
    plain, run = codes
    assert run == plain, (run, plain)
    assert run == {"default": -sig, "handler": 143}[mode]
