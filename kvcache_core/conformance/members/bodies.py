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
#: kvcache's own slot validators: they take a slot tensor, and raise on a ``KVWriteLoc``.
_SLOT_VALIDATORS = frozenset({"check_slots", "check_rows"})
#: Name prefixes of validation helpers (after any leading underscores): handing a parameter to
#: one checks it, and does not pass it on.
_VALIDATION_PREFIXES = ("check", "validate", "verify", "assert", "ensure")


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
    """True when the body (after its docstring) starts with ``raise NotImplementedError``.

    Whatever follows that ``raise`` is dead code: it never runs, so it does not implement
    anything.
    """
    body = _statements(fn)
    return bool(body) and isinstance(body[0], ast.Raise) and _is_not_implemented(body[0].exc)


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


def _call_name(call: ast.Call) -> str:
    func = call.func
    if isinstance(func, ast.Name):
        return func.id
    return func.attr if isinstance(func, ast.Attribute) else ""


def _is_validation(call: ast.Call) -> bool:
    """``check_slots(...)``, ``self._validate(...)``, ``verify_x(...)`` and the like."""
    return _call_name(call).lstrip("_").startswith(_VALIDATION_PREFIXES)


def _passes_on(call: ast.Call) -> bool:
    func = call.func
    if isinstance(func, ast.Name) and func.id in _INSPECTING:
        return False
    if _is_validation(call):
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
    any call that is neither mere inspection (``isinstance``, ``len``, logging, ...) nor a
    validation helper (``check_*``, ``validate*``, ``verify*``, ``assert*``, ``ensure*``, with or
    without leading underscores): passing it to a helper of one's own that does work is fine;
    checking it, or mentioning it in a ``None`` test, and no more is not. A validator's *result*
    is a local computed from it, so ``m = check_slots(m)`` followed by the delegate call with
    ``m`` is forwarding.

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


def _mentions_raw(node: ast.AST, loc: str | Collection[str]) -> bool:
    """Whether ``node`` reads ``loc`` (or one of several names) itself: ``loc.full`` and the
    other ``KVWriteLoc`` fields do not count."""
    names = {loc} if isinstance(loc, str) else set(loc)
    skip: set[int] = set()
    for sub in ast.walk(node):
        if (
            isinstance(sub, ast.Attribute)
            and sub.attr in _WRITELOC_FIELDS
            and isinstance(sub.value, ast.Name)
        ):
            skip.add(id(sub.value))
    return any(
        isinstance(sub, ast.Name) and sub.id in names and id(sub) not in skip
        for sub in ast.walk(node)
    )


def _is_call_to(call: ast.Call, name: str) -> bool:
    func = call.func
    return (isinstance(func, ast.Name) and func.id == name) or (
        isinstance(func, ast.Attribute) and func.attr == name
    )


def _reads_fields(fn: FunctionNode) -> set[str]:
    """Names whose ``KVWriteLoc`` fields (``x.full``, ``x.swa_loc``, ...) the body reads."""
    return {
        n.value.id
        for n in ast.walk(fn)
        if isinstance(n, ast.Attribute)
        and n.attr in _WRITELOC_FIELDS
        and isinstance(n.value, ast.Name)
    }


def _unwrapped_name(call: ast.Call, fields_read: set[str]) -> str | None:
    """The name a call really unwraps, if it is one: ``unwrap_write_loc(x)``; an
    ``isinstance(x, ...)`` test naming ``KVWriteLoc``, or of an ``x`` whose record fields the
    body reads elsewhere (``if isinstance(x, Tensor): ... else: x.full``); a ``hasattr(x, f)``
    test of a ``KVWriteLoc`` field. Any other call unwraps nothing."""
    args = list(_call_arguments(call))
    if not args or not isinstance(args[0], ast.Name):
        return None
    name = args[0].id
    if _is_call_to(call, "unwrap_write_loc"):
        return name
    if _is_call_to(call, "isinstance") and len(args) > 1:
        names_writeloc = any(
            (isinstance(n, ast.Name) and n.id == "KVWriteLoc")
            or (isinstance(n, ast.Attribute) and n.attr == "KVWriteLoc")
            for n in ast.walk(args[1])
        )
        return name if names_writeloc or name in fields_read else None
    if _is_call_to(call, "hasattr") and len(args) > 1:
        attr = args[1]
        if isinstance(attr, ast.Constant) and attr.value in _WRITELOC_FIELDS:
            return name
    return None


def _contains_unwrap(node: ast.AST) -> bool:
    return any(
        isinstance(n, ast.Call) and _is_call_to(n, "unwrap_write_loc") for n in ast.walk(node)
    )


def _end(node: ast.expr | ast.stmt) -> tuple[int, int]:
    return (node.end_lineno or node.lineno, node.end_col_offset or 0)


#: A use (an indexing expression or call), an unwrapped name, or (names bound, value bound).
_Event = ast.Call | ast.Subscript | str | tuple[set[str], ast.expr | None]


def raw_loc_uses(fn: FunctionNode, loc: str) -> list[RawUse]:
    """Index uses of parameter ``loc`` (or of a local alias of it) before it is unwrapped.

    The body is read in source order. ``loc`` starts *raw*. A local assigned from an expression
    that reads a raw name (``slots = loc``, ``slots = loc.long()``) is raw too; one assigned
    from anything else (``loc = loc.full``, ``slots, _ = unwrap_write_loc(loc)``) is not. A raw
    name stops being raw at a real unwrap of *that name*: ``unwrap_write_loc(x)``, an
    ``isinstance(x, ...)`` test naming ``KVWriteLoc`` (or of an ``x`` whose record fields the
    body also reads), a ``hasattr(x, "full")``-style test of a record field. A test of any other
    name unwraps nothing.

    Index uses are ``buf[x]`` (read or write), ``x`` among the arguments of ``index_copy_``,
    ``index_put_``, ``index_select``, ``scatter_`` and the like, and ``x`` handed to kvcache's
    slot validators ``check_slots``/``check_rows`` (they raise on a record). Passing ``loc`` on
    to another method (a sub-pool's ``set_kv_buffer``) is neither: that method is checked on its
    own.
    """
    fields_read = _reads_fields(fn)
    # (position, kind, payload); kinds: 0 = use, 1 = unwrap, 2 = binding. A binding takes
    # effect at the end of its statement (its value is read first).
    events: list[tuple[tuple[int, int], int, _Event]] = []
    for node in ast.walk(fn):
        if isinstance(node, ast.Call):
            unwrapped = _unwrapped_name(node, fields_read)
            if unwrapped is not None:
                events.append(((node.lineno, node.col_offset), 1, unwrapped))
            elif (
                isinstance(node.func, ast.Attribute) and node.func.attr in _INDEX_OPS
            ) or _call_name(node) in _SLOT_VALIDATORS:
                events.append(((node.lineno, node.col_offset), 0, node))
        elif isinstance(node, ast.Subscript):
            events.append(((node.lineno, node.col_offset), 0, node))
        elif isinstance(node, (ast.Assign, ast.AnnAssign, ast.NamedExpr)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            bound: set[str] = set()
            for t in targets:
                bound |= _bound_names(t)
            events.append((_end(node), 2, (bound, node.value)))
        elif isinstance(node, (ast.For, ast.AsyncFor)):
            events.append((_end(node.target), 2, (_bound_names(node.target), None)))
    events.sort(key=lambda e: (e[0], e[1]))
    raw = {loc}
    uses: list[RawUse] = []
    for _, _kind, payload in events:
        if isinstance(payload, (ast.Call, ast.Subscript)):
            read: list[ast.expr] = (
                list(_call_arguments(payload)) if isinstance(payload, ast.Call) else [payload.slice]
            )
            if raw and any(_mentions_raw(a, raw) for a in read):
                uses.append(RawUse(payload.lineno, ast.unparse(payload)))
        elif isinstance(payload, str):
            raw.discard(payload)
        elif isinstance(payload, tuple):
            bound, value = payload
            if value is not None and _mentions_raw(value, raw) and not _contains_unwrap(value):
                raw |= bound
            else:
                raw -= bound
    return uses
