"""Driver-side patch of the generator's tokenizer loading (speculators 0.3-0.4): a remote-code
tokenizer gets the trust speculators already gives the same model path, checked on its source."""

from __future__ import annotations

from types import ModuleType
from typing import Any

from ...core.proof import Proof, SELFTEST
from ...core.registry import Changes, Patch, TargetChanged, register
from .. import _guards as guard
from ._generator_target import GENERATOR, generator_source


def _tokenizer_path_is_trusted(class_source: str) -> str:
    """The parameter of the generator's ``__init__`` that its one bare
    ``AutoTokenizer.from_pretrained(p)`` loads, after checking on the syntax tree that the very
    same ``p`` (never re-assigned in ``__init__``) is loaded by ``AutoConfig.from_pretrained(p,
    trust_remote_code=True)`` (the literal ``True``; the call is the whole value of a statement of
    ``__init__``'s own body, so it runs whenever ``__init__`` does) and handed as ``model=`` (and ``tokenizer=``, if given) to a
    ``ModelConfig(..., trust_remote_code=True)`` - in ``__init__`` itself or in a method that
    ``__init__`` calls only with ``p`` for that parameter (and that does not re-assign it).
    Anything else raises TargetChanged."""
    import ast
    import textwrap

    def changed(why: str) -> str:
        return f"the generator no longer loads the tokenizer bare from the path it trusts for AutoConfig and " \
               f"ModelConfig: {why}"

    try:
        tree = ast.parse(textwrap.dedent(class_source))
    except SyntaxError as exc:
        raise TargetChanged(changed(f"its source does not parse ({exc})")) from None
    cls = next((n for n in tree.body if isinstance(n, ast.ClassDef)), None)
    methods = {n.name: n for n in (cls.body if cls else []) if isinstance(n, ast.FunctionDef)}
    init = methods.get("__init__")
    if init is None:
        raise TargetChanged(changed("no __init__"))

    def calls(fn: ast.AST, dotted: str) -> list[ast.Call]:
        return [c for c in ast.walk(fn) if isinstance(c, ast.Call) and ast.unparse(c.func) == dotted]

    def trusts(call: ast.Call) -> bool:
        return any(k.arg == "trust_remote_code" and isinstance(k.value, ast.Constant) and k.value.value is True
                   for k in call.keywords)

    def name_of(node: ast.AST | None) -> str | None:
        return node.id if isinstance(node, ast.Name) else None

    def param_names(fn: ast.FunctionDef) -> list[str]:
        return [a.arg for a in (*fn.args.posonlyargs, *fn.args.args, *fn.args.kwonlyargs)]

    def rebound(fn: ast.FunctionDef, name: str) -> bool:
        """``name`` is assigned, deleted or declared global/nonlocal anywhere in ``fn``."""
        for n in ast.walk(fn):
            if isinstance(n, ast.Name) and n.id == name and not isinstance(n.ctx, ast.Load):
                return True
            if isinstance(n, (ast.Global, ast.Nonlocal)) and name in n.names:
                return True
        return False

    toks = calls(init, "AutoTokenizer.from_pretrained")
    if len(toks) != 1:
        raise TargetChanged(changed(f"__init__ calls AutoTokenizer.from_pretrained {len(toks)} times, "
                                    "expected once"))
    (tok,) = toks
    if any(k.arg in ("trust_remote_code", None) for k in tok.keywords) or any(
            isinstance(a, ast.Starred) for a in tok.args):
        raise TargetChanged(changed("the tokenizer call passes trust_remote_code (or **kwargs) itself"))
    path = name_of(tok.args[0]) if tok.args else None
    if path is None or path not in param_names(init) or path == "self":
        shown = ast.unparse(tok.args[0]) if tok.args else "(none)"
        raise TargetChanged(changed(f"the tokenizer path {shown} is not a parameter of __init__"))
    if rebound(init, path):
        raise TargetChanged(changed(f"{path} is re-assigned in __init__"))
    # the config load that trusts the path runs whenever __init__ does: the whole value of a statement
    # of its own body (not under an if / try / loop / with, nor in a lambda, a nested function or a
    # conditional expression)
    unconditional = [stmt.value for stmt in init.body if isinstance(stmt, (ast.Assign, ast.AnnAssign, ast.Expr))
                     and isinstance(stmt.value, ast.Call) and ast.unparse(stmt.value.func) == "AutoConfig.from_pretrained"]
    if not any(trusts(c) and c.args and name_of(c.args[0]) == path for c in unconditional):
        raise TargetChanged(changed(f"no AutoConfig.from_pretrained({path}, trust_remote_code=True) "
                                    "run unconditionally by __init__"))

    def hands_path(call: ast.Call, given: str) -> bool:
        """``ModelConfig(model=given, [tokenizer=given,] trust_remote_code=True)``."""
        kw = {k.arg: k.value for k in call.keywords}
        return (trusts(call) and name_of(kw.get("model")) == given
                and ("tokenizer" not in kw or name_of(kw["tokenizer"]) == given))

    def binds(c: ast.Call, fn: ast.FunctionDef, given: str) -> bool:
        """The call ``self.fn(...)`` passes ``path`` itself for ``fn``'s parameter ``given``."""
        if any(isinstance(a, ast.Starred) for a in c.args) or any(k.arg is None for k in c.keywords):
            return False
        positional = [a.arg for a in (*fn.args.posonlyargs, *fn.args.args)][1:]  # after self
        bound = dict(zip(positional, c.args))
        bound.update({k.arg: k.value for k in c.keywords})
        return name_of(bound.get(given)) == path

    for call in calls(init, "ModelConfig"):
        if hands_path(call, path):
            return path
    for name, fn in methods.items():
        handed = calls(init, f"self.{name}")
        if name == "__init__" or not handed:
            continue
        for call in calls(fn, "ModelConfig"):
            given = name_of({k.arg: k.value for k in call.keywords}.get("model"))
            if (given in param_names(fn)[1:] and not rebound(fn, given) and hands_path(call, given)
                    and all(binds(c, fn, given) for c in handed)):
                return path
    raise TargetChanged(changed(f"no ModelConfig(model={path}, trust_remote_code=True) of the same path"))


@register
class TokenizerTrustRemoteCode(Patch):
    """speculators (generator:84) loads the tokenizer bare while it loads the same model's config and
    vLLM ModelConfig with ``trust_remote_code=True``; Kimi-K2.5's tokenizer is remote code -> ValueError.
    Trust is never widened: applied only where speculators' own unconditional ``AutoConfig(path,
    trust_remote_code=True)`` and ``ModelConfig`` trust the very path the tokenizer loads (else
    ``target-changed``), and only the generator's own ``__init__`` load of that path gets it; any
    other caller, another path or an explicit ``trust_remote_code`` is passed through unchanged."""

    id = "tokenizer-trust-remote-code"
    proof = Proof("fails", SELFTEST, r"ValueError: The repository \S+ contains custom code which must be executed to correctly load the model", using="kimi-k25 short")
    summary = ("tokenizer loaded with trust_remote_code=True, only at the generator's own tokenizer load and only "
               "because speculators already trusts the same model path for AutoConfig and ModelConfig")
    upstream = "speculators 0.3.0-0.4.x generator:84 AutoTokenizer.from_pretrained(path) -> remote-code tokenizer fails"
    fixes = ("K1",)
    target = f"{GENERATOR}:AutoTokenizer"
    requires = {"speculators": ">=0.3,<0.5"}

    def check(self, module: ModuleType) -> None:
        _tokenizer_path_is_trusted(generator_source(module))
        guard.has_attrs(guard.attr(module, "AutoTokenizer"), "AutoTokenizer", "from_pretrained")

    def install(self, module: ModuleType, changes: Changes) -> None:
        import inspect
        import logging
        import sys

        original = module.AutoTokenizer
        log = logging.getLogger("spec_compat")
        param = _tokenizer_path_is_trusted(generator_source(module))
        # the code of the __init__ the guard read (wrappers other patches put around it call it)
        init_code = inspect.unwrap(guard.attr(module, "VllmHiddenStatesGenerator").__init__).__code__

        def trusted_call(path: Any) -> bool:
            """The caller is the generator's own ``__init__``, loading the path it was given for ``param``."""
            frame = sys._getframe(2)
            return frame.f_code is init_code and frame.f_locals.get(param, trusted_call) is path

        class AutoTokenizer:
            """speculators' AutoTokenizer: same trust as its config loading of the same path."""

            @staticmethod
            def from_pretrained(path: Any, *args: Any, **kwargs: Any) -> Any:
                if "trust_remote_code" not in kwargs and trusted_call(path):
                    log.info("spec_compat[%s]: tokenizer of %s loaded with trust_remote_code=True, as "
                             "speculators loads its config", TokenizerTrustRemoteCode.id, path)
                    kwargs["trust_remote_code"] = True
                return original.from_pretrained(path, *args, **kwargs)

            def __getattr__(self, name: str) -> Any:  # pragma: no cover - class-level use only
                return getattr(original, name)

        changes.setattr(module, "AutoTokenizer", AutoTokenizer)
