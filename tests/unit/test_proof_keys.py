"""A proof's key is what its run really loaded (tests/support/proof_keys.py): every process it starts
traces the project files it imports (tests/support/trace/sitecustomize.py) and its environment's
versions; the recorded list is re-hashed against today's tree at collection, so CI re-runs a proof
exactly when one of its inputs changed."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

from proof_keys import (KEY_DISTRIBUTIONS, current_key, digest, static_closure, trace_env,  # tests/support
                        traced_inputs)

ROOT = Path(__file__).resolve().parents[2]
RECORDS = ROOT / "matrix" / "results" / "proofs"

CHILD = textwrap.dedent('''
    import multiprocessing as mp
    import sys

    def work():
        import spawned_only  # imported only by the spawned child
        print("child", spawned_only.X)

    if __name__ == "__main__":
        import parent_only
        ctx = mp.get_context("spawn")
        p = ctx.Process(target=work)
        p.start(); p.join()
        sys.exit(p.exitcode)
''')


def test_every_process_of_a_run_traces_what_it_imports(tmp_path):
    """The main script, a module it imports and one only a *spawned* child imports (vLLM's workers
    are spawned) are all traced, each process with its environment's versions; a module outside the
    root is not."""
    root = tmp_path / "root"
    root.mkdir()
    (root / "main.py").write_text(CHILD)
    (root / "parent_only.py").write_text("X = 1\n")
    (root / "spawned_only.py").write_text("X = 2\n")
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "elsewhere.py").write_text("Y = 1\n")
    trace = tmp_path / "trace"
    trace.mkdir()
    env = dict(os.environ, **trace_env(trace))
    env["PROOF_TRACE_ROOT"] = str(root)
    env["PYTHONPATH"] = os.pathsep.join([env["PYTHONPATH"], str(root), str(outside)])
    proc = subprocess.run([sys.executable, str(root / "main.py")], env=env, cwd=root, capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 0 and "child 2" in proc.stdout, proc.stderr
    traces = sorted(trace.glob("*.trace"))
    assert len(traces) >= 2, [t.name for t in traces]  # parent and spawned child (and the resource tracker)
    heads = [json.loads(t.read_text().splitlines()[0]) for t in traces]
    assert {h["prefix"] for h in heads} == {os.path.realpath(sys.prefix)}
    assert all(set(h["versions"]) == set(KEY_DISTRIBUTIONS) for h in heads)
    noted = {line for t in traces for line in t.read_text().splitlines()[1:]}
    assert {"main.py", "parent_only.py", "spawned_only.py"} <= noted, noted
    assert not any("elsewhere" in n for n in noted), noted


def test_traced_inputs_keep_the_proven_patch_and_drop_other_patch_modules_and_the_core(tmp_path):
    trace = tmp_path / "trace"
    trace.mkdir()
    (trace / "1.trace").write_text(json.dumps({"prefix": "/env/a", "versions": {"torch": "2.10.0"}}) + "\n" + "\n".join([
        "spec_compat/core/registry.py", "spec_compat/patches/extraction/capture_per_request.py",
        "spec_compat/patches/serving/cpu_spec_decode.py", "spec_compat/patches/extraction/__init__.py",
        "spec_compat/core/manifest.py", "tests/support/ehs_engine.py", "no/such/file.py"]) + "\n")
    files, envs = traced_inputs(trace, {"spec_compat/patches/extraction/capture_per_request.py"})
    assert files == {"spec_compat/patches/extraction/capture_per_request.py", "spec_compat/patches/extraction/__init__.py",
                     "tests/support/ehs_engine.py"}
    assert envs == {"/env/a": {"torch": "2.10.0"}}


def test_static_closure_follows_spec_compat_and_support_imports():
    files = static_closure([ROOT / "tests" / "engine" / "test_extract_hidden_states_proof.py"])
    assert {"tests/support/ehs_engine.py", "tests/support/lock_reader.py", "tests/support/proof_runs.py"} <= files
    assert not any(f.startswith("spec_compat/patches/") and not f.endswith("__init__.py") for f in files), files
    # the helpers a server proof borrows from a sibling test module (serve_args, _post, _written)
    native = static_closure([ROOT / "tests" / "server" / "test_native_cpu.py"])
    assert "tests/server/test_speculators_client.py" in native and "spec_compat/verify/reference.py" in native


VERSIONS = {"main": {d: "1.0" for d in KEY_DISTRIBUTIONS}}


def test_the_key_moves_with_code_versions_and_missing_files_not_with_comments(tmp_path):
    (tmp_path / "a.py").write_text('"""doc"""\nX = 1\n')
    (tmp_path / "b.txt").write_text("data\n")
    key = digest("p", "decl", ["a.py", "b.txt"], VERSIONS, tmp_path)
    assert digest("p", "decl", ["b.txt", "a.py"], VERSIONS, tmp_path) == key  # order-free
    (tmp_path / "a.py").write_text('"""other doc"""\n# a comment\nX = 1\n')
    assert digest("p", "decl", ["a.py", "b.txt"], VERSIONS, tmp_path) == key
    (tmp_path / "a.py").write_text("X = 2\n")
    assert digest("p", "decl", ["a.py", "b.txt"], VERSIONS, tmp_path) != key
    (tmp_path / "a.py").write_text("X = 1\n")
    assert digest("p", "decl", ["a.py", "b.txt"], VERSIONS, tmp_path) == key
    client = {**VERSIONS, "client": {d: "1.0" for d in KEY_DISTRIBUTIONS}}
    assert digest("p", "decl", ["a.py", "b.txt"], client, tmp_path) != key  # a second environment
    newer = {"main": dict(VERSIONS["main"], torch="1.1")}
    assert digest("p", "decl", ["a.py", "b.txt"], newer, tmp_path) != key
    (tmp_path / "b.txt").unlink()
    assert digest("p", "decl", ["a.py", "b.txt"], VERSIONS, tmp_path) != key
    assert digest("p", "other decl", ["a.py"], VERSIONS, tmp_path) != digest("p", "decl", ["a.py"], VERSIONS, tmp_path)


class _RecordedEnvs:
    """Today's environments as they were recorded (the test is about files, not this machine)."""

    def __init__(self, versions: dict) -> None:
        self.versions = versions

    def get(self, label: str) -> dict:
        return self.versions[label]


def _records() -> list[tuple[str, str, dict]]:
    out = []
    for path in sorted(RECORDS.glob("*.json")):
        for node, rec in json.loads(path.read_text())["proofs"].items():
            if "inputs" in rec:
                out.append((f"{path.stem}::{node}", rec["pid"], rec))
    return out


def test_a_planted_change_in_a_support_file_moves_exactly_the_proofs_that_loaded_it(tmp_path):
    """On a copy of every recorded input: a one-line change in a tests/support file that some recorded
    proofs loaded and others did not moves the keys of those that loaded it, and no other key."""
    from spec_compat import REGISTRY
    from spec_compat import patches  # noqa: F401

    records = _records()
    assert records, "no proof record carries its inputs (matrix/run records them)"
    users: dict[str, set[str]] = {}
    for name, _pid, rec in records:
        for f in rec["inputs"]["files"]:
            if f.startswith("tests/support/"):
                users.setdefault(f, set()).add(name)
    candidates = sorted((len(u), f) for f, u in users.items() if 0 < len(u) < len(records))
    assert candidates, "no support file separates the recorded proofs"
    _n, planted = candidates[0]  # the support file the fewest proofs loaded
    copy = tmp_path / "tree"
    for f in {f for _n, _p, rec in records for f in rec["inputs"]["files"]}:
        if (ROOT / f).is_file():
            (copy / f).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy(ROOT / f, copy / f)

    def keys() -> dict[str, str]:
        out = {}
        for name, pid, rec in records:
            declaration = repr(REGISTRY.get(pid).proof)
            out[name] = current_key(pid, declaration, rec["inputs"], _RecordedEnvs(rec["inputs"]["versions"]), copy)
        return out

    before = keys()
    with (copy / planted).open("a") as fh:
        fh.write("PLANTED_REGRESSION = True\n")
    after = keys()
    moved = {n for n in before if before[n] != after[n]}
    assert moved == users[planted], (planted, sorted(moved ^ users[planted]))
    assert len(moved) < len(records)
    print(f"{planted}: {len(moved)} of {len(records)} recorded proofs move: {sorted(moved)}")


def test_the_client_environment_is_named_whatever_its_python_links_to(tmp_path, monkeypatch):
    """A venv's python links to the base interpreter: the client is its venv directory, and a record
    labelled with the client env's path under another envs root (another machine's HOME) reads
    today's client env of the same name."""
    import proof_keys

    env = tmp_path / "envs" / "cellx.client"
    (env / "bin").mkdir(parents=True)
    (env / "bin" / "python").symlink_to(sys.executable)
    monkeypatch.setenv("SPEC_COMPAT_CLIENT_PYTHON", str(env / "bin" / "python"))
    wrong = str(Path(os.path.realpath(env / "bin" / "python")).parents[1])  # the base interpreter's prefix
    labels = proof_keys.label_envs({os.path.realpath(env): {"torch": "1"}, "/m": {"torch": "2"}}, "/m", wrong)
    assert set(labels) == {"client", "main"}
    seen = []
    monkeypatch.setattr(proof_keys, "env_versions", lambda py: seen.append(py) or {"torch": "1"})
    assert proof_keys.CurrentEnvs().get("/elsewhere/envs/cellx.client") == {"torch": "1"}
    assert seen == [str(Path(os.path.realpath(env)) / "bin" / "python")]


def _copy_of_inputs(records, tmp_path: Path) -> Path:
    copy = tmp_path / "tree"
    for f in {f for _n, _p, rec in records for f in rec["inputs"]["files"]} | {"spec_compat/core/registry.py"}:
        if (ROOT / f).is_file():
            (copy / f).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy(ROOT / f, copy / f)
    return copy


def _keys(records, copy: Path) -> dict[str, str]:
    from spec_compat import REGISTRY
    from spec_compat import patches  # noqa: F401

    return {name: current_key(pid, repr(REGISTRY.get(pid).proof), rec["inputs"],
                              _RecordedEnvs(rec["inputs"]["versions"]), copy) for name, pid, rec in records}


def test_the_shared_core_is_an_input_of_no_proof():
    """The registry, the undo log, switches, versions, hooks and the plugin entry point are loaded by
    every run; ordinary tests guard them on every CI run, so a lint fix there re-runs no proof."""
    from proof_keys import is_core

    records = _records()
    assert records
    with_core = [(n, p, rec) for n, p, rec in records if any(is_core(f) for f in rec["inputs"]["files"])]
    assert len(with_core) < len(records)
    # only a record made under the earlier rule names the core, and it is stale: CI re-runs and re-keys it
    current = _keys(with_core, ROOT)
    assert not [n for n, _p, rec in with_core if current[n] == rec["key"]]
    for core in ("spec_compat/core/registry.py", "spec_compat/core/switches.py", "spec_compat/plugin.py",
                 "spec_compat/__init__.py"):
        assert is_core(core)
    assert not is_core("spec_compat/cli/selftest.py") and not is_core("spec_compat/shims/capture.py")


def test_a_planted_change_in_one_patch_unit_moves_exactly_its_proofs(tmp_path):
    """A one-line change in a patch module moves the keys of the proofs of the patches it declares (and
    of those declaring it in ``depends_on`` / ``after``), and no other key."""
    import proof_keys
    from spec_compat import REGISTRY
    from spec_compat import patches  # noqa: F401

    records = _records()
    unit = "spec_compat/patches/hidden_states/ehs_render_token_ids.py"
    owners = {name for name, pid, _rec in records
              if unit in proof_keys.patch_modules(REGISTRY.get(pid), REGISTRY)}
    assert owners, f"no recorded proof of a patch in {unit}"
    copy = _copy_of_inputs(records, tmp_path)
    before = _keys(records, copy)
    with (copy / unit).open("a") as fh:
        fh.write("PLANTED_CHANGE = True\n")
    after = _keys(records, copy)
    moved = {n for n in before if before[n] != after[n]}
    assert moved == owners, sorted(moved ^ owners)
    print(f"{unit}: {len(moved)} of {len(records)} recorded proofs move: {sorted(moved)}")


def test_an_f_string_without_a_placeholder_keys_as_the_string_it_spells(tmp_path):
    (tmp_path / "a.py").write_text('X = f"abc"\nY = f"a{X}"\n')
    key = digest("p", "decl", ["a.py"], VERSIONS, tmp_path)
    (tmp_path / "a.py").write_text('X = "abc"\nY = f"a{X}"\n')
    assert digest("p", "decl", ["a.py"], VERSIONS, tmp_path) == key
    (tmp_path / "a.py").write_text('X = "abc"\nY = "a{X}"\n')
    assert digest("p", "decl", ["a.py"], VERSIONS, tmp_path) != key


def test_the_key_is_the_same_whatever_python_spells_the_tree():
    """A record made on a lent device's Python 3.12 is read here on 3.11: the fields a version adds empty
    (3.12's ``type_params=[]``) and 3.12.1's empty piece at the end of a format spec key as nothing,
    while a real difference still moves the key."""
    import ast

    from proof_keys import _dump, _PlainFStrings, code_of

    fn = ast.parse("def f(x):\n    return x\n").body[0]
    assert fn.decorator_list == []
    bare = _dump(fn)
    del fn.decorator_list  # a version without the field: as 3.11 has no type_params, empty in 3.12
    assert _dump(fn) == bare
    fn.decorator_list = [ast.Name("d")]
    assert _dump(fn) != bare

    spec = ast.parse('f"{x:<{w}}"').body[0].value
    plain = _dump(_PlainFStrings().visit(spec))
    spelled = ast.parse('f"{x:<{w}}"').body[0].value
    spelled.values[0].format_spec.values.append(ast.Constant(""))  # 3.12.1's trailing empty piece
    assert _dump(_PlainFStrings().visit(spelled)) == plain
    other = ast.parse('f"{x:>{w}}"').body[0].value
    assert _dump(_PlainFStrings().visit(other)) != plain
    assert b"type_params" not in code_of(ROOT / "spec_compat" / "core" / "registry.py")


def test_the_helpers_beside_the_units_count_for_the_proofs_whose_units_import_them():
    """``patches/_guards.py`` (shape checks shared by units) is no unit: a recorded proof whose unit
    imports it lists it, so a change there re-runs those proofs."""
    from proof_keys import is_unit

    assert not is_unit("spec_compat/patches/_guards.py") and not is_unit("spec_compat/patches/ranges.py")
    assert is_unit("spec_compat/patches/hidden_states/ehs_render_token_ids.py")
    assert not is_unit("spec_compat/patches/hidden_states/__init__.py")
    users = [n for n, _p, rec in _records() if "spec_compat/patches/_guards.py" in rec["inputs"]["files"]]
    assert users, "no recorded proof lists the units' shared guards"
