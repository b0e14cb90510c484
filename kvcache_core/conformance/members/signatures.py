"""Read a method's signature as a neutral ``MethodSig``: from source (``ast``) or from a live
object (``inspect``), so that one comparison serves the no-import and the runtime levels.

The data types themselves (``MethodSig``, ``Param``, ``ParamKind``) live in
``contracts/signature.py``, beside the contract history written in them; reading code is the
checker's work, and the contract never imports the checker.
"""

from __future__ import annotations

import ast
import inspect
import linecache
import types
from collections.abc import Callable
from functools import lru_cache

from ...contracts.signature import MethodSig, Param, ParamKind

__all__ = ["normalize_annotation", "sig_from_ast", "sig_from_callable"]

_FROM_INSPECT = {
    inspect.Parameter.POSITIONAL_ONLY: ParamKind.POSITIONAL_ONLY,
    inspect.Parameter.POSITIONAL_OR_KEYWORD: ParamKind.POSITIONAL_OR_KEYWORD,
    inspect.Parameter.VAR_POSITIONAL: ParamKind.VAR_POSITIONAL,
    inspect.Parameter.KEYWORD_ONLY: ParamKind.KEYWORD_ONLY,
    inspect.Parameter.VAR_KEYWORD: ParamKind.VAR_KEYWORD,
}


def _strip_module(node: ast.expr) -> ast.expr:
    """``torch.Tensor`` -> ``Tensor``; ``typing.Optional`` -> ``Optional``."""

    class _Strip(ast.NodeTransformer):
        def visit_Attribute(self, n: ast.Attribute) -> ast.AST:
            return ast.Name(id=n.attr, ctx=ast.Load())

    return _Strip().visit(node)  # type: ignore[no-any-return]


def _union_members(node: ast.expr) -> list[str] | None:
    """Members of ``a | b``, ``Optional[a]`` or ``Union[a, b]``; None when not a union."""
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.BitOr):
        return (_union_members(node.left) or [_norm(node.left)]) + (
            _union_members(node.right) or [_norm(node.right)]
        )
    if isinstance(node, ast.Subscript) and isinstance(node.value, ast.Name):
        if node.value.id == "Optional":
            return [_norm(node.slice), "None"]
        if node.value.id == "Union":
            elts = node.slice.elts if isinstance(node.slice, ast.Tuple) else [node.slice]
            return [_norm(e) for e in elts]
    return None


def _norm(node: ast.expr) -> str:
    members = _union_members(node)
    if members is not None:
        flat = sorted(set(members), key=lambda m: (m == "None", m))
        return " | ".join(flat)
    if isinstance(node, ast.Subscript) and isinstance(node.value, ast.Name):
        name = {"Tuple": "tuple", "List": "list", "Dict": "dict"}.get(node.value.id, node.value.id)
        elts = node.slice.elts if isinstance(node.slice, ast.Tuple) else [node.slice]
        return f"{name}[{', '.join(_norm(e) for e in elts)}]"
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        try:
            return _norm(_strip_module(ast.parse(node.value, mode="eval").body))
        except SyntaxError:
            return node.value
    return ast.unparse(node)


@lru_cache(maxsize=4096)
def normalize_annotation(text: str | None) -> str | None:
    """Canonical text of an annotation, so ``Optional[torch.Tensor]`` equals ``Tensor | None``."""
    if text is None:
        return None
    try:
        tree = ast.parse(text.strip(), mode="eval").body
    except SyntaxError:
        return text.strip()
    return _norm(_strip_module(tree))


def _annotation_text(annotation: object) -> str | None:
    if annotation is inspect.Parameter.empty:
        return None
    if isinstance(annotation, str):
        return annotation
    return inspect.formatannotation(annotation)


def _default_text(default: object) -> str | None:
    if default is inspect.Parameter.empty:
        return None
    return repr(default)


def _def_location(func: Callable[..., object]) -> tuple[str | None, int | None]:
    """File and line of ``def`` itself, past any decorators, so both levels point at one line.

    Read from the code object and ``linecache`` rather than ``inspect.getsourcelines``, which
    tokenizes the whole function: discovery describes every contract method of every plugin at
    engine start-up, and this keeps that to microseconds per method.
    """
    code = getattr(inspect.unwrap(func), "__code__", None)
    if code is None:
        return None, None
    path, first = code.co_filename, code.co_firstlineno
    for offset in range(64):
        text = linecache.getline(path, first + offset).lstrip()
        if not text:
            break
        if text.startswith(("def ", "async def ")):
            return path, first + offset
    return path, first


def sig_from_callable(name: str, func: Callable[..., object], *, bound: bool = False) -> MethodSig:
    """Describe a function or method taken from a class (``self`` is dropped unless ``bound``).

    Cached per function object: a method shared by several classes or Protocols (every
    capability Protocol extends ``KVPool``) is described once per process.
    """
    try:
        hash(func)
    except TypeError:  # a callable object that is not hashable: describe it every time
        return _describe_callable(name, func, bound)
    return _describe_cached(name, func, bound)


def _params_from_code(func: types.FunctionType) -> tuple[list[Param], str | None]:
    """What ``inspect.signature`` would say of a plain function, read straight from its code
    object (ten times cheaper; discovery describes every contract method at start-up)."""
    code = func.__code__
    names = code.co_varnames
    count, kw_count = code.co_argcount, code.co_kwonlyargcount
    defaults = func.__defaults__ or ()
    kw_defaults = func.__kwdefaults__ or {}
    notes = func.__annotations__
    empty = inspect.Parameter.empty
    first_default = count - len(defaults)

    def make(name: str, kind: ParamKind, default: object) -> Param:
        return Param(name, kind, _default_text(default), _annotation_text(notes.get(name, empty)))

    params = [
        make(
            names[i],
            ParamKind.POSITIONAL_ONLY
            if i < code.co_posonlyargcount
            else ParamKind.POSITIONAL_OR_KEYWORD,
            defaults[i - first_default] if i >= first_default else empty,
        )
        for i in range(count)
    ]
    extra = count + kw_count
    if code.co_flags & inspect.CO_VARARGS:
        params.append(make(names[extra], ParamKind.VAR_POSITIONAL, empty))
        extra += 1
    params += [
        make(n, ParamKind.KEYWORD_ONLY, kw_defaults.get(n, empty))
        for n in names[count : count + kw_count]
    ]
    if code.co_flags & inspect.CO_VARKEYWORDS:
        params.append(make(names[extra], ParamKind.VAR_KEYWORD, empty))
    return params, _annotation_text(notes.get("return", empty))


def _describe_callable(name: str, func: Callable[..., object], bound: bool) -> MethodSig:
    if (
        type(func) is types.FunctionType
        and not hasattr(func, "__wrapped__")
        and not hasattr(func, "__signature__")
    ):
        fast, returns = _params_from_code(func)
        if not bound and fast and fast[0].positional:
            fast = fast[1:]
        path, line = _def_location(func)
        return MethodSig(name=name, params=tuple(fast), returns=returns, path=path, line=line)
    return _describe_with_inspect(name, func, bound)


def _describe_with_inspect(name: str, func: Callable[..., object], bound: bool) -> MethodSig:
    sig = inspect.signature(func)
    params = list(sig.parameters.values())
    if (
        not bound
        and params
        and params[0].kind
        in (
            inspect.Parameter.POSITIONAL_ONLY,
            inspect.Parameter.POSITIONAL_OR_KEYWORD,
        )
    ):
        params = params[1:]
    path: str | None
    line: int | None
    path, line = _def_location(func)
    return MethodSig(
        name=name,
        params=tuple(
            Param(
                name=p.name,
                kind=_FROM_INSPECT[p.kind],
                default=_default_text(p.default),
                annotation=_annotation_text(p.annotation),
            )
            for p in params
        ),
        returns=_annotation_text(sig.return_annotation),
        path=path,
        line=line,
    )


_describe_cached = lru_cache(maxsize=4096)(_describe_callable)


def _decorator_names(node: ast.FunctionDef | ast.AsyncFunctionDef) -> set[str]:
    names: set[str] = set()
    for dec in node.decorator_list:
        target = dec.func if isinstance(dec, ast.Call) else dec
        if isinstance(target, ast.Name):
            names.add(target.id)
        elif isinstance(target, ast.Attribute):
            names.add(target.attr)
    return names


def _ast_text(node: ast.expr | None) -> str | None:
    return None if node is None else ast.unparse(node)


def sig_from_ast(
    node: ast.FunctionDef | ast.AsyncFunctionDef,
    *,
    path: str | None = None,
    line_offset: int = 0,
) -> MethodSig:
    """Describe a method from its ``def`` alone, without importing or running anything.

    The result matches `sig_from_callable` on the same method: ``self`` (or ``cls``) is
    dropped unless the method is a ``staticmethod``; defaults and annotations are their source
    text. ``line_offset`` shifts ``node.lineno`` when the node was parsed from an extract.
    """
    a = node.args
    positional = [(p, ParamKind.POSITIONAL_ONLY) for p in a.posonlyargs] + [
        (p, ParamKind.POSITIONAL_OR_KEYWORD) for p in a.args
    ]
    # Defaults align with the *last* positional parameters.
    first_default = len(positional) - len(a.defaults)
    params: list[Param] = []
    for i, (arg, kind) in enumerate(positional):
        default = a.defaults[i - first_default] if i >= first_default else None
        params.append(Param(arg.arg, kind, _ast_text(default), _ast_text(arg.annotation)))
    if a.vararg is not None:
        params.append(
            Param(a.vararg.arg, ParamKind.VAR_POSITIONAL, None, _ast_text(a.vararg.annotation))
        )
    for arg, kw_default in zip(a.kwonlyargs, a.kw_defaults, strict=True):
        params.append(
            Param(arg.arg, ParamKind.KEYWORD_ONLY, _ast_text(kw_default), _ast_text(arg.annotation))
        )
    if a.kwarg is not None:
        params.append(
            Param(a.kwarg.arg, ParamKind.VAR_KEYWORD, None, _ast_text(a.kwarg.annotation))
        )
    if "staticmethod" not in _decorator_names(node) and params and params[0].positional:
        params = params[1:]
    return MethodSig(
        name=node.name,
        params=tuple(params),
        returns=_ast_text(node.returns),
        path=path,
        line=node.lineno + line_offset,
    )
