"""Driver-side patch for speculators 0.5-0.7's stock ``scripts/launch_vllm.py`` run with ``spec-compat
run``: its config read gets the ``--trust-remote-code`` the user gave ``vllm serve``, and only that.

The script (v0.5.0, v0.6.0.1, v0.7.0.1: ``main``) reads the model's config with
``AutoConfig.from_pretrained(args.model)`` - no ``trust_remote_code`` - to pick the layers to
extract, then ``exec``s ``vllm serve args.model ... *vllm_args``.  On a checkpoint that ships its
configuration as remote code (Kimi-K2.5) transformers asks "Do you wish to run the custom code?
[y/N]"; without a terminal that is ``EOFError`` and then ``ValueError: The repository ... contains
custom code ...``: the script stops before ``vllm serve`` starts even when the user passed
``-- --trust-remote-code``, the consent vLLM itself asks for the same path.

Only that one call is changed: ``AutoConfig.from_pretrained`` called directly (no other frame
between, transformers' own calls included) from the ``main`` of the ``__main__`` module whose file
is the script ``spec-compat run`` runs (:data:`spec_compat.cli.run.SCRIPT`), named
``launch_vllm.py``, whose ``main`` has the stock shape (:func:`stock_launch_main`, checked on its
syntax tree), for the path ``args.model`` it hands to ``vllm serve`` - and only when the
``vllm_args`` it hands there hold ``--trust-remote-code`` (vLLM's spelling or ``--trust_remote_code``,
not undone by a later ``--no-trust-remote-code``).  Anything else, the same script without the flag
included, loads as the script asks (transformers' prompt).
"""

from __future__ import annotations

import ast
import logging
import os
import sys
from collections.abc import Sequence
from types import FrameType, ModuleType
from typing import Any

from ...core.proof import Proof
from ...core.registry import Changes, Patch, TargetChanged, register
from .. import _guards as guard

log = logging.getLogger("spec_compat")

AUTO_CONFIG = "transformers.models.auto.configuration_auto"
SCRIPT_NAME = "launch_vllm.py"
PROOF = "tests/server/test_script_era_launch.py::test_stock_launch_script_stops_only_without_this_patch"

#: vLLM's flag (its parser turns ``_`` into ``-`` in option names) and its negation
_TRUST = ("--trust-remote-code", "--trust_remote_code")
_DISTRUST = ("--no-trust-remote-code", "--no_trust_remote_code")
#: frames passed over between the wrapper and its caller (wrapt's pure-Python wrapper, this package)
_PASSED_OVER = ("wrapt", "spec_compat")


def vllm_trusts(vllm_args: Sequence[str]) -> bool:
    """Whether ``vllm serve`` given ``vllm_args`` trusts remote code: its last ``--trust-remote-code`` /
    ``--no-trust-remote-code`` (either spelling) is the first.  A value spelled ``--trust-remote-code=...``
    (which vLLM's boolean flag refuses) or a ``--config`` file's setting is not read: not trusted."""
    verdict = False
    for arg in vllm_args:
        if arg in _TRUST:
            verdict = True
        elif arg in _DISTRUST:
            verdict = False
    return verdict


def stock_launch_main(source: str) -> str | None:
    """Why ``source`` (the script's text) is not speculators' stock launch script, or None when it is:
    a top-level ``main`` that binds ``args, vllm_args = parse_args()`` once (neither name bound again),
    calls ``AutoConfig.from_pretrained(args.model)`` exactly once and bare, and builds the ``vllm serve``
    command as one list holding ``"serve"``, ``args.model`` and ``*vllm_args``."""
    try:
        tree = ast.parse(source)
    except SyntaxError as exc:
        return f"it does not parse ({exc.msg})"
    main = next((n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == "main"), None)
    if main is None:
        return "no top-level main()"
    binds = [n for n in ast.walk(main) if isinstance(n, ast.Assign) and len(n.targets) == 1
             and isinstance(n.targets[0], ast.Tuple) and [ast.unparse(e) for e in n.targets[0].elts] == ["args", "vllm_args"]
             and isinstance(n.value, ast.Call) and ast.unparse(n.value) == "parse_args()"]
    if len(binds) != 1:
        return "main() does not bind `args, vllm_args = parse_args()` once"
    stores = [n.id for n in ast.walk(main) if isinstance(n, ast.Name) and n.id in ("args", "vllm_args")
              and not isinstance(n.ctx, ast.Load)]
    if len(stores) != 2 or any(isinstance(n, (ast.Global, ast.Nonlocal)) for n in ast.walk(main)):
        return "main() binds args or vllm_args again"
    loads = [n for n in ast.walk(main) if isinstance(n, ast.Call) and ast.unparse(n.func) == "AutoConfig.from_pretrained"]
    if len(loads) != 1:
        return f"main() calls AutoConfig.from_pretrained {len(loads)} times, expected once"
    if ast.unparse(loads[0]) != "AutoConfig.from_pretrained(args.model)":
        return f"main() loads the config as `{ast.unparse(loads[0])}`, not `AutoConfig.from_pretrained(args.model)`"
    for node in ast.walk(main):
        if isinstance(node, ast.List):
            items = [ast.unparse(e) for e in node.elts]
            if "'serve'" in items and "args.model" in items and "*vllm_args" in items:
                return None
    return "main() builds no `[..., 'serve', args.model, ..., *vllm_args]` command"


def launch_frame(frame: FrameType | None) -> FrameType | None:
    """``frame`` (the wrapper's caller, wrapt and spec_compat frames passed over) when it is ``main``
    of the stock launch script that ``spec-compat run`` runs as ``__main__``; else None."""
    while frame is not None and str(frame.f_globals.get("__name__", "")).split(".")[0] in _PASSED_OVER:
        frame = frame.f_back
    if frame is None or frame.f_code.co_name != "main" or frame.f_globals.get("__name__") != "__main__":
        return None
    run = sys.modules.get("spec_compat.cli.run")
    running = getattr(run, "SCRIPT", None)
    path = frame.f_globals.get("__file__")
    if not running or not isinstance(path, str) or os.path.basename(path) != SCRIPT_NAME:
        return None
    if os.path.realpath(path) != running or os.path.realpath(frame.f_code.co_filename) != running:
        return None
    return frame


@register
class LaunchVllmTrustRemoteCode(Patch):
    """speculators 0.5-0.7's ``scripts/launch_vllm.py`` reads the model config with
    ``AutoConfig.from_pretrained(args.model)`` and no ``trust_remote_code`` before it starts ``vllm
    serve``: on Kimi-K2.5 (remote-code config) transformers prompts "Do you wish to run the custom code?
    [y/N]", then ``EOFError`` / ``ValueError``, even with ``-- --trust-remote-code`` for vLLM. Under
    ``spec-compat run`` that one read is trusted exactly when the arguments the script hands to ``vllm
    serve`` hold ``--trust-remote-code``; without the flag it prompts as before."""

    id = "launch-vllm-trust-remote-code"
    proof = Proof("fails", PROOF, r"in main\n    config = AutoConfig\.from_pretrained\(args\.model\)\n(?:  .*\n)*"
                                  r"ValueError: The repository \S+ contains custom code which must be executed to "
                                  r"correctly load the model", using="kimi-k25")
    summary = ("under `spec-compat run`, the stock launch_vllm.py's config read of the model it serves gets "
               "trust_remote_code=True only when the arguments it passes to `vllm serve` hold --trust-remote-code")
    upstream = ("speculators 0.5.0-0.7.0.x scripts/launch_vllm.py main(): AutoConfig.from_pretrained(args.model) "
                "without trust_remote_code -> remote-code config prompts, EOFError/ValueError before vllm serve")
    target = f"{AUTO_CONFIG}:AutoConfig"
    requires = {"speculators": ">=0.5,<0.8"}
    after = ("verifier-config-text-model",)

    def check(self, module: ModuleType) -> None:
        cls = guard.attr(module, "AutoConfig")
        raw = cls.__dict__.get("from_pretrained")
        if not isinstance(raw, classmethod):
            raise TargetChanged("AutoConfig.from_pretrained is no longer a classmethod")
        guard.has_params(raw.__func__, "AutoConfig.from_pretrained", "pretrained_model_name_or_path")
        if not any(p.kind is p.VAR_KEYWORD for p in guard.params(raw.__func__, "AutoConfig.from_pretrained").values()):
            raise TargetChanged("AutoConfig.from_pretrained takes no **kwargs (where trust_remote_code goes)")

    def install(self, module: ModuleType, changes: Changes) -> None:
        pid = self.id
        checked: dict[str, str | None] = {}  # script path -> why it is not the stock script (None: it is)

        def from_pretrained(wrapped: Any, klass: Any, args: tuple, kwargs: dict) -> Any:
            if len(args) != 1 or kwargs:  # the stock call passes the path alone
                return wrapped(*args, **kwargs)
            frame = launch_frame(sys._getframe(1))
            if frame is None:
                return wrapped(*args, **kwargs)
            path = frame.f_code.co_filename
            if path not in checked:
                try:
                    with open(path, encoding="utf-8") as f:
                        checked[path] = stock_launch_main(f.read())
                except OSError as exc:
                    checked[path] = f"it cannot be read ({exc})"
                if checked[path] is not None:
                    log.warning("spec_compat[%s]: %s is not speculators' stock launch script (%s): its config is "
                                "loaded as it asks", pid, path, checked[path])
            script_args, vllm_args = frame.f_locals.get("args"), frame.f_locals.get("vllm_args")
            if (checked[path] is not None or getattr(script_args, "model", None) is not args[0]
                    or not isinstance(vllm_args, list) or not all(isinstance(a, str) for a in vllm_args)
                    or not vllm_trusts(vllm_args)):
                return wrapped(*args, **kwargs)
            log.info("spec_compat[%s]: config of %s loaded with trust_remote_code=True: the script passes "
                     "--trust-remote-code to vllm serve for it", pid, args[0])
            return wrapped(*args, trust_remote_code=True)

        changes.wrap(module.AutoConfig, "from_pretrained", from_pretrained)
