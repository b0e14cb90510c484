"""What a method's body does with its parameters, read from its ``ast`` (never run).

Three drifts crashed engines although every signature was right, so no signature comparison can
see them:

* a pass-through (an allocator's ``get_cpu_copy``, a composite pool's offload) that accepts
  ``mamba_indices`` or ``**kwargs`` and calls its delegate without it: recurrent state was
  silently lost on resume;
* a declared capability whose method only raises ``NotImplementedError``: engines probe with
  ``hasattr`` and crash at the first retraction;
* a write path that indexes a buffer with ``loc`` although a ``KVWriteLoc`` record may arrive.

The source level and the runtime signature level both call these functions (the runtime level on
``inspect.getsource``), so a finding is the same whichever level reports it.
"""

from __future__ import annotations

import ast
from collections.abc import Collection, Iterator
from dataclasses import dataclass

__all__ = ["Dropped", "RawUse", "dropped_parameters", "only_raises_not_implemented", "raw_loc_uses"]

FunctionNode = ast.FunctionDef | ast.AsyncFunctionDef

#: Calls that look at a value without passing it on.
_INSPECTING = frozenset(
    {"isinstance", "issubclass", "len", "type", "id", "repr", "str", "print", "bool", "hasattr"}
)
_LOGGERS = frozenset({"logger", "log", "logging", "_logger", "LOGGER", "_log"})

#: Tensor methods (and ``torch.*`` functions) whose arguments are row indices.
_INDEX_OPS = frozenset(
    {
        "index_copy_",
        "index_copy",
        "index_put_",
        "index_put",
        "index_select",
        "index_fill_",
        "index_add_",
        "scatter_",
        "scatter",
        "gather",
        "take",
    }
)
#: Attributes that only exist on a ``KVWriteLoc``: reading them is handling the record.
_WRITELOC_FIELDS = frozenset({"loc", "full", "full_loc", "swa_loc"})


def _statements(fn: FunctionNode) -> list[ast.stmt]:
    body = list(fn.body)
    if (
        body
        and isinstance(body[0], ast.Expr)
        and isinstance(body[0].value, ast.Constant)
        and isinstance(body[0].value.value, str)
    ):
        body = body[1:]
    return body


def _is_not_implemented(exc: ast.expr | None) -> bool:
    if isinstance(exc, ast.Call):
        exc = exc.func
    if isinstance(exc, ast.Name):
        return exc.id == "NotImplementedError"
    return isinstance(exc, ast.Attribute) and exc.attr == "NotImplementedError"


def only_raises_not_implemented(fn: FunctionNode) -> bool:
    """True when the body (after its docstring) is nothing but ``raise NotImplementedError``."""
    body = _statements(fn)
    return len(body) == 1 and isinstance(body[0], ast.Raise) and _is_not_implemented(body[0].exc)


def _first_arg(fn: FunctionNode) -> str | None:
    args = fn.args.posonlyargs + fn.args.args
    return args[0].arg if args else None


def _names(node: ast.AST) -> set[str]:
    return {n.id for n in ast.walk(node) if isinstance(n, ast.Name)}


def _bound_names(target: ast.AST) -> set[str]:
    """Names an assignment target binds: ``a, b = ...`` binds both; ``buf[loc] = ...`` none."""
    return {
        n.id for n in ast.walk(target) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store)
    }


Flows = list[tuple[set[str], set[str]]]


def _flows(nodes: list[ast.AST]) -> Flows:
    """(names read, names bound) of every binding among ``nodes`` (a body, walked once)."""
    flows: Flows = []
    for node in nodes:
        if isinstance(node, ast.Assign):
            bound: set[str] = set()
            for target in node.targets:
                bound |= _bound_names(target)
            flows.append((_names(node.value), bound))
        elif isinstance(node, (ast.AnnAssign, ast.AugAssign)) and node.value is not None:
            flows.append((_names(node.value), _bound_names(node.target)))
        elif isinstance(node, ast.NamedExpr):
            flows.append((_names(node.value), {node.target.id}))
        elif isinstance(node, (ast.For, ast.AsyncFor)):
            flows.append((_names(node.iter), _bound_names(node.target)))
        elif isinstance(node, ast.withitem) and node.optional_vars is not None:
            flows.append((_names(node.context_expr), _bound_names(node.optional_vars)))
    return flows


def _tainted(flows: Flows, name: str) -> set[str]:
    """``name`` plus every local assigned from an expression that mentions one of them."""
    tainted = {name}
    changed = True
    while changed:
        changed = False
        for read, bound in flows:
            if read & tainted and not bound <= tainted:
                tainted |= bound
                changed = True
    return tainted


def _passes_on(call: ast.Call) -> bool:
    func = call.func
    if isinstance(func, ast.Name) and func.id in _INSPECTING:
        return False
    return not (
        isinstance(func, ast.Attribute)
        and isinstance(func.value, ast.Name)
        and func.value.id in _LOGGERS
    )


def _call_arguments(call: ast.Call) -> Iterator[ast.expr]:
    yield from call.args
    for kw in call.keywords:
        yield kw.value


@dataclass(frozen=True)
class Dropped:
    """A parameter a pass-through accepts and never passes on."""

    param: str
    star: str  # "", "*" or "**", as declared
    line: int  # the first delegate call, where it should have been passed
    call: str  # that call's source text


def _delegate_calls(fn: FunctionNode, nodes: list[ast.AST], method: str) -> list[ast.Call]:
    me = _first_arg(fn)
    calls = [
        n
        for n in nodes
        if isinstance(n, ast.Call)
        and isinstance(n.func, ast.Attribute)
        and n.func.attr == method
        and not (isinstance(n.func.value, ast.Name) and n.func.value.id == me)
    ]
    return sorted(calls, key=lambda c: (c.lineno, c.col_offset))


def _discarded(nodes: list[ast.AST]) -> set[str]:
    """Names dropped on purpose, where the checker can see it: ``del x`` or ``_ = x``."""
    out: set[str] = set()
    for node in nodes:
        if isinstance(node, ast.Delete):
            out |= {t.id for t in node.targets if isinstance(t, ast.Name)}
        elif (
            isinstance(node, ast.Assign)
            and all(isinstance(t, ast.Name) and t.id == "_" for t in node.targets)
            and isinstance(node.value, ast.Name)
        ):
            out.add(node.value.id)
    return out


def dropped_parameters(fn: FunctionNode, method: str, names: Collection[str]) -> list[Dropped]:
    """Parameters in ``names`` (plus ``*args``/``**kwargs``) that a delegating body drops.

    A body delegates when it calls ``<something other than self>.<method>(...)``. A parameter
    counts as passed on when it, or a local computed from it, appears among the arguments of
    any call that is not mere inspection (``isinstance``, ``len``, logging, ...): passing it to a
    helper of one's own is fine, mentioning it in a ``None`` check and no more is not.

    A composite may have a good reason to drop one (an SWA pool's MHA sub-pools hold no
    recurrent state); it says so where a reader and the checker both see it: ``del
    mamba_indices`` (or ``_ = mamba_indices``). Only a silent drop is reported.
    """
    nodes = list(ast.walk(fn))
    delegates = _delegate_calls(fn, nodes, method)
    if not delegates:
        return []
    calls = [n for n in nodes if isinstance(n, ast.Call)]
    if any(isinstance(c.func, ast.Name) and c.func.id == "locals" for c in calls):
        return []
    a = fn.args
    declared: list[tuple[str, str]] = [
        (p.arg, "") for p in a.posonlyargs + a.args + a.kwonlyargs if p.arg in names
    ]
    if a.vararg is not None:
        declared.append((a.vararg.arg, "*"))
    if a.kwarg is not None:
        declared.append((a.kwarg.arg, "**"))
    discarded = _discarded(nodes)
    first = delegates[0]
    flows = _flows(nodes)
    passed_on = [_names(arg) for c in calls if _passes_on(c) for arg in _call_arguments(c)]
    dropped: list[Dropped] = []
    for name, star in declared:
        if name in discarded:
            continue
        tainted = _tainted(flows, name)
        passed = any(names & tainted for names in passed_on)
        if not passed:
            dropped.append(Dropped(name, star, first.lineno, ast.unparse(first)))
    return dropped


@dataclass(frozen=True)
class RawUse:
    """``loc`` used as row indices before anything could have unwrapped a ``KVWriteLoc``."""

    line: int
    text: str


def _mentions_raw(node: ast.AST, loc: str) -> bool:
    """Whether ``node`` reads ``loc`` itself (``loc.full`` and friends do not count)."""
    skip: set[int] = set()
    for sub in ast.walk(node):
        if (
            isinstance(sub, ast.Attribute)
            and sub.attr in _WRITELOC_FIELDS
            and isinstance(sub.value, ast.Name)
        ):
            skip.add(id(sub.value))
    return any(
        isinstance(sub, ast.Name) and sub.id == loc and id(sub) not in skip
        for sub in ast.walk(node)
    )


def _is_call_to(call: ast.Call, name: str) -> bool:
    func = call.func
    return (isinstance(func, ast.Name) and func.id == name) or (
        isinstance(func, ast.Attribute) and func.attr == name
    )


def _unwraps(call: ast.Call, args: list[ast.expr], loc: str) -> bool:
    """``unwrap_write_loc(loc)``, or an ``isinstance(loc, ...)``/``hasattr(loc, ...)`` test."""
    if _is_call_to(call, "unwrap_write_loc"):
        return any(_mentions_raw(a, loc) for a in args)
    return (
        (_is_call_to(call, "isinstance") or _is_call_to(call, "hasattr"))
        and bool(args)
        and isinstance(args[0], ast.Name)
        and args[0].id == loc
    )


def raw_loc_uses(fn: FunctionNode, loc: str) -> list[RawUse]:
    """Index uses of parameter ``loc`` that come before any unwrapping, in source order.

    Unwrapping is a call to ``unwrap_write_loc(loc)``, an ``isinstance``/``hasattr`` test of
    ``loc`` naming ``KVWriteLoc`` or one of its fields, or rebinding ``loc``. Index uses are
    ``buf[loc]`` (read or write) and ``loc`` among the arguments of ``index_copy_``,
    ``index_put_``, ``index_select``, ``scatter_`` and the like. Passing ``loc`` on to another
    method (a sub-pool's ``set_kv_buffer``) is neither: that method is checked on its own.
    """
    guards: list[tuple[int, int]] = []
    uses: list[tuple[int, int, str]] = []
    for node in ast.walk(fn):
        if isinstance(node, ast.Call):
            args = list(_call_arguments(node))
            if _unwraps(node, args, loc):
                guards.append((node.lineno, node.col_offset))
            elif (
                isinstance(node.func, ast.Attribute)
                and node.func.attr in _INDEX_OPS
                and any(_mentions_raw(a, loc) for a in args)
            ):
                uses.append((node.lineno, node.col_offset, ast.unparse(node)))
        elif isinstance(node, ast.Subscript) and _mentions_raw(node.slice, loc):
            uses.append((node.lineno, node.col_offset, ast.unparse(node)))
        elif isinstance(node, (ast.Assign, ast.AnnAssign, ast.AugAssign, ast.For, ast.NamedExpr)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            if any(loc in _bound_names(t) for t in targets):
                guards.append((node.lineno, node.col_offset))
    first_guard = min(guards, default=None)
    return [
        RawUse(line, text)
        for line, col, text in sorted(uses)
        if first_guard is None or (line, col) < first_guard
    ]
