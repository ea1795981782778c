"""The ``spec-compat`` parser: each command's module is imported only when that command runs (so a
proof that runs ``spec-compat selftest`` does not depend on the evaluator's code), every command has
its arguments when the whole parser is built, and ``spec-compat fixture`` writes the published heads."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from spec_compat.cli import command_of, commands, main, parser
from spec_compat.fixtures.published_heads import HEADS

ROOT = Path(__file__).resolve().parents[2]


def test_a_command_imports_its_module_only():
    code = ("import sys; from spec_compat.cli import main; rc = main(['patches']); "
            "print('MODULES', sorted(m for m in sys.modules if m.startswith('spec_compat.cli.')))")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=str(ROOT))
    assert proc.returncode == 0, proc.stderr[-2000:]
    line = next(ln for ln in proc.stdout.splitlines() if ln.startswith("MODULES"))
    loaded = set(eval(line.split(" ", 1)[1]))  # noqa: S307  (our own printed list)
    assert "spec_compat.cli.report" in loaded
    assert not loaded & {"spec_compat.cli.demo", "spec_compat.cli.evaluate", "spec_compat.cli.selftest",
                         "spec_compat.cli.fixture", "spec_compat.cli.compare_drafts"}, loaded


def test_the_whole_parser_has_every_commands_arguments(capsys):
    p = parser()
    for name in commands():
        with pytest.raises(SystemExit) as exc:
            p.parse_args([name, "--help"])
        assert exc.value.code == 0
        assert f"usage: spec-compat {name}" in capsys.readouterr().out
    assert parser().parse_args(["evaluate", "--target", "t", "--draft", "a", "--draft", "b"]).draft == ["a", "b"]


@pytest.mark.parametrize("argv, expected", [
    (["report", "--json"], "report"), (["--version"], None), ([], None),
    (["run", "script.py", "report"], "run"), (["-h", "evaluate"], "evaluate")])
def test_command_of(argv, expected):
    assert command_of(argv) == expected


def test_an_unknown_command_is_refused_naming_the_choices(capsys):
    with pytest.raises(SystemExit) as exc:
        main(["reprot"])
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert "invalid choice: 'reprot'" in err and "report" in err


@pytest.mark.parametrize("name", HEADS)
def test_fixture_writes_each_published_head(tmp_path, capsys, name):
    assert main(["fixture", name, str(tmp_path / name)]) == 0
    assert capsys.readouterr().out.strip() == str(tmp_path / name)
    cfg = json.loads((tmp_path / name / "config.json").read_text())
    assert cfg["architectures"][0] in ("LlamaForCausalLMEagle3", "Eagle3DeepseekV2ForCausalLM")
    assert (tmp_path / name / "model.safetensors").stat().st_size > 0


@pytest.mark.parametrize("argv, message", [
    (["llama", "--draft-vocab", "96"], "--draft-vocab apply to the published heads"),
    (["torchspec-eagle3", "--layers", "2"], "--layers apply to target fixtures, not to the head 'torchspec-eagle3'"),
    (["torchspec-eagle3", "--draft-vocab", "100000"], "--draft-vocab must be in 1..256, got 100000"),
    (["nope"], "unknown fixture 'nope'; known: llama, kimi-k25, deepseek-v3, smollm2 (targets), torchspec-eagle3"),
    (["smollm2", "--seed", "1"], "--seed do not apply to 'smollm2', a pretrained checkpoint"),
    (["smollm2", "--layers", "2"], "--layers do not apply to 'smollm2', a pretrained checkpoint"),
    (["llama", "--cache-dir", "C"], "--cache-dir applies to the smollm2 fixture, not to the fixture 'llama'"),
    (["torchspec-eagle3", "--cache-dir", "C"], "--cache-dir applies to the smollm2 fixture, not to the head"),
])
def test_fixture_refuses_options_that_do_not_apply(tmp_path, capsys, argv, message):
    assert main(["fixture", argv[0], str(tmp_path / "out"), *argv[1:]]) == 2
    assert message in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


def test_help_names_every_switch():
    from spec_compat.cli import parser
    from spec_compat.core.switches import SWITCHES

    epilog = parser(only="").epilog or ""
    missing = [var for var in SWITCHES if var not in epilog]
    assert not missing, f"spec-compat --help does not name {missing}"


def test_commands_are_discovered_from_their_modules_declarations(tmp_path):
    """A command is one module with a ``COMMANDS`` literal: the package names none of them itself, so
    adding a command changes no file another command's run imports (a proof's key stays)."""
    from spec_compat import cli

    init = (Path(cli.__file__)).read_text()
    code = "\n".join(ln for ln in init.split('"""')[-1].splitlines() if not ln.lstrip().startswith("#"))
    for name, (module, _) in commands().items():
        assert f'"{name}"' not in code and f"'{name}'" not in code, f"cli/__init__.py names the command {name!r}"
        assert cli._declared(Path(cli.__file__).with_name(f"{module}.py"))[name]
    mod = tmp_path / "extra.py"
    mod.write_text('"""x"""\n\nCOMMANDS = {\n    "one": "first",\n    "two": "second",\n}\n\nVALUE = 1\n')
    assert cli._declared(mod) == {"one": "first", "two": "second"}
    (tmp_path / "none.py").write_text("X = 1\n")
    assert cli._declared(tmp_path / "none.py") == {}
    assert set(commands()) >= {"report", "patches", "run", "selftest", "demo", "evaluate", "fixture"}
