"""What the receiver of a call can be, read from source: the classes a call can reach.

``kvcache drift`` checks a call ``x.m(..., kw=...)`` only against the methods ``x`` can resolve
to. ``x`` is typed the way a reader types it, without running anything:

* ``self`` (and ``cls``) in a method of ``K``: ``K`` and its subclasses that inherit the calling
  method (a subclass that overrides the caller never runs this call);
* a parameter's annotation (``pool: KVCache``, ``Optional[...]``, unions, string annotations);
* an attribute ``self.x``: its annotation (``x: T`` in the class, ``self.x: T = ...`` in any
  method), else everything assigned to it in the class's methods (``self.x = C(...)``, a typed
  parameter), else a property's return annotation;
* a local: what is assigned to it; ``isinstance(x, C)`` around the call narrows it to ``C``;
* ``C(...)`` is exactly ``C``; a call of a function or method is its return annotation;
* ``C.m(self, ...)`` names the class itself.

A declared type reaches the class and its subclasses; a constructed one only that class. What
cannot be typed is *unknown* (the caller is conservative about it); standard-library and
third-party objects, builtins and modules are *foreign*: a module function or a queue's ``get``
is never matched to a pool method.
"""

from __future__ import annotations

import ast
import builtins
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field

from ...contracts.signature import MethodSig, ParamKind
from ..members.sources import (
    ClassSource,
    ExternalBase,
    FunctionNode,
    ImportRef,
    LocalScope,
    ModuleSource,
    SourceIndex,
)

__all__ = ["Break", "Context", "Typed", "TypeSet", "Typer", "binding_breaks", "is_stub"]

_DEPTH = 6  # how far one expression's type is chased through assignments


@dataclass(frozen=True)
class Typed:
    """One class a value can be: an instance (``exact``: of this class only, else also of its
    subclasses), or the class object itself (``is_class``); ``how`` says why, for messages."""

    cls: ClassSource
    exact: bool
    how: str
    is_class: bool = False
    #: Known from an ``isinstance`` test around the use: a dispatch on what arrived, not a
    #: declaration that every subclass may arrive.
    guard: bool = False


@dataclass(frozen=True)
class TypeSet:
    """What an expression can be: known classes, plus whether it may be something unknown, or
    is something foreign (stdlib, third-party, a builtin value, a module)."""

    known: tuple[Typed, ...] = ()
    unknown: bool = False
    foreign: bool = False

    def __or__(self, other: TypeSet) -> TypeSet:
        seen = {(t.cls.qualname, t.exact, t.is_class) for t in self.known}
        more = tuple(t for t in other.known if (t.cls.qualname, t.exact, t.is_class) not in seen)
        return TypeSet(
            self.known + more, self.unknown or other.unknown, self.foreign or other.foreign
        )


UNKNOWN = TypeSet(unknown=True)
FOREIGN = TypeSet(foreign=True)


@dataclass(frozen=True)
class Context:
    """Where an expression is: its module, enclosing class and function, and local scope."""

    module: ModuleSource
    cls: ClassSource | None = None
    func: FunctionNode | None = None
    scope: LocalScope | None = None


def is_stub(fn: FunctionNode) -> bool:
    """A body that implements nothing: ``...``, ``pass``, a docstring, a lone ``raise``, or an
    ``@abstractmethod``."""
    if any(_decorator_name(d) == "abstractmethod" for d in fn.decorator_list):
        return True
    body = [s for s in fn.body if not _is_docstring(s)]
    if not body:
        return True
    first = body[0]
    if isinstance(first, ast.Raise):
        return True
    return len(body) == 1 and (
        isinstance(first, ast.Pass)
        or (isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant))
    )


def raises_only(fn: FunctionNode) -> str | None:
    """The exception a refusing body raises first thing (``raise RuntimeError(...)``), or None
    when the body does something. Statements after that ``raise`` never run."""
    body = [s for s in fn.body if not _is_docstring(s)]
    if not body or not isinstance(body[0], ast.Raise):
        return None
    exc = body[0].exc
    if isinstance(exc, ast.Call):
        exc = exc.func
    if isinstance(exc, ast.Name):
        return exc.id
    if isinstance(exc, ast.Attribute):
        return exc.attr
    return "Exception"


def _is_docstring(stmt: ast.stmt) -> bool:
    return (
        isinstance(stmt, ast.Expr)
        and isinstance(stmt.value, ast.Constant)
        and isinstance(stmt.value.value, str)
    )


def _decorator_name(node: ast.expr) -> str:
    if isinstance(node, ast.Call):
        node = node.func
    if isinstance(node, ast.Name):
        return node.id
    return node.attr if isinstance(node, ast.Attribute) else ""


def method_kind(fn: FunctionNode) -> str:
    names = {_decorator_name(d) for d in fn.decorator_list}
    if "staticmethod" in names:
        return "static"
    if "classmethod" in names:
        return "class"
    return "method"


def _first_arg(fn: FunctionNode) -> str | None:
    args = fn.args.posonlyargs + fn.args.args
    return args[0].arg if args else None


def _annotation_expr(node: ast.expr | None) -> ast.expr | None:
    """An annotation as an expression (string annotations parsed)."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        try:
            return ast.parse(node.value, mode="eval").body
        except SyntaxError:
            return None
    return node


_UNION_NAMES = frozenset({"Optional", "Union"})
_CLASS_NAMES = frozenset({"Type", "type"})
_ANY_NAMES = frozenset({"Any", "object", "Self"})


@dataclass
class Typer:
    """Types expressions in the modules of one drift run (results cached per run)."""

    index: SourceIndex
    #: Every class read, for subclass look-ups.
    classes: Sequence[ClassSource]
    #: ``replaced[id(C)]``: classes installed in C's place (``engine_mod.C = Replacement``).
    replaced: dict[int, list[ClassSource]] = field(default_factory=dict)
    _children: dict[int, list[ClassSource]] | None = None
    _attrs: dict[tuple[int, str], TypeSet] = field(default_factory=dict)
    _assigned: dict[int, dict[str, list[tuple[str, ast.expr, FunctionNode]]]] = field(
        default_factory=dict
    )
    _guard_cache: dict[int, list[ast.stmt]] = field(default_factory=dict)
    _descendants: dict[int, list[ClassSource]] = field(default_factory=dict)

    # -- classes -------------------------------------------------------------------------------
    def descendants(self, cls: ClassSource) -> list[ClassSource]:
        """``cls``, every class read that has it in its MRO, and what replaces either."""
        known = self._descendants.get(id(cls))
        if known is not None:
            return known
        found = self._descendants_of(cls)
        self._descendants[id(cls)] = found
        return found

    def _descendants_of(self, cls: ClassSource) -> list[ClassSource]:
        if self._children is None:
            children: dict[int, list[ClassSource]] = {}
            for klass in self.classes:
                for ancestor in self.index.mro(klass)[1:]:
                    if isinstance(ancestor, ClassSource):
                        children.setdefault(id(ancestor), []).append(klass)
            self._children = children
        out = [cls, *self._children.get(id(cls), [])]
        for klass in list(out):
            for replacement in self.replaced.get(id(klass), []):
                if all(r is not replacement for r in out):
                    out.append(replacement)
        return out

    def reached(self, typed: Typed) -> list[ClassSource]:
        """The classes an instance typed so can be of."""
        if typed.exact:
            return [typed.cls, *self.replaced.get(id(typed.cls), [])]
        return self.descendants(typed.cls)

    # -- annotations ---------------------------------------------------------------------------
    def annotation(self, node: ast.expr | None, ctx: Context, how: str) -> TypeSet:
        expr = _annotation_expr(node)
        if expr is None:
            return UNKNOWN
        return self._annotation(expr, ctx, how, 0)

    def _annotation(self, expr: ast.expr, ctx: Context, how: str, depth: int) -> TypeSet:
        if depth > _DEPTH:
            return UNKNOWN
        if isinstance(expr, ast.Constant):
            if expr.value is None:
                return TypeSet()
            if isinstance(expr.value, str):
                inner = _annotation_expr(expr)
                return self._annotation(inner, ctx, how, depth + 1) if inner else UNKNOWN
            return FOREIGN
        if isinstance(expr, ast.BinOp) and isinstance(expr.op, ast.BitOr):
            return self._annotation(expr.left, ctx, how, depth + 1) | self._annotation(
                expr.right, ctx, how, depth + 1
            )
        if isinstance(expr, ast.Subscript):
            head = ast.unparse(expr.value).split(".")[-1]
            items = expr.slice.elts if isinstance(expr.slice, ast.Tuple) else [expr.slice]
            if head in _UNION_NAMES:
                out = TypeSet()
                for item in items:
                    out = out | self._annotation(item, ctx, how, depth + 1)
                return out
            if head in _CLASS_NAMES:
                of_class = self._annotation(items[0], ctx, how, depth + 1)
                return TypeSet(
                    tuple(Typed(t.cls, False, t.how, is_class=True) for t in of_class.known),
                    of_class.unknown,
                    of_class.foreign,
                )
            if head == "Annotated":
                return self._annotation(items[0], ctx, how, depth + 1)
            return FOREIGN  # a container (list[Pool], dict[...]) is not a pool
        if isinstance(expr, (ast.Name, ast.Attribute)):
            if ast.unparse(expr).split(".")[-1] in _ANY_NAMES:
                return UNKNOWN
            found = self.index.resolve_expr(ctx.module, expr, scope=ctx.scope)
            if isinstance(found, ClassSource):
                if found.is_protocol:
                    return UNKNOWN  # structural: any class with the method may be passed
                return TypeSet((Typed(found, False, how),))
            if isinstance(found, ExternalBase) and found.known:
                return FOREIGN
            return UNKNOWN
        return UNKNOWN

    # -- expressions ---------------------------------------------------------------------------
    def of(
        self, expr: ast.expr, ctx: Context, at: ast.AST | None = None, depth: int = 0
    ) -> TypeSet:
        """What ``expr`` can be when evaluated in ``ctx`` (``at``: the node it is used at, for
        ``isinstance`` narrowing)."""
        if depth > _DEPTH:
            return UNKNOWN
        if isinstance(expr, ast.Name):
            return self._name(expr.id, ctx, at, depth)
        if isinstance(expr, ast.Attribute):
            return self._attribute(expr, ctx, at, depth)
        if isinstance(expr, ast.Call):
            return self._call(expr, ctx, depth)
        if isinstance(expr, ast.IfExp):
            return self.of(expr.body, ctx, at, depth + 1) | self.of(expr.orelse, ctx, at, depth + 1)
        if isinstance(expr, ast.BoolOp) and isinstance(expr.op, ast.Or):
            out = TypeSet()
            for value in expr.values:
                out = out | self.of(value, ctx, at, depth + 1)
            return out
        if isinstance(expr, ast.NamedExpr):
            return self.of(expr.value, ctx, at, depth + 1)
        if isinstance(
            expr,
            (
                ast.Constant,
                ast.JoinedStr,
                ast.List,
                ast.Tuple,
                ast.Dict,
                ast.Set,
                ast.ListComp,
                ast.DictComp,
                ast.SetComp,
                ast.GeneratorExp,
                ast.Compare,
                ast.BinOp,
                ast.UnaryOp,
                ast.Lambda,
            ),
        ):
            return FOREIGN
        return UNKNOWN

    def _name(self, name: str, ctx: Context, at: ast.AST | None, depth: int) -> TypeSet:
        fn = ctx.func
        if fn is not None:
            narrowed = self._narrowed(name, ctx, at)
            if narrowed is not None:
                return narrowed
            if ctx.cls is not None and name == _first_arg(fn) and method_kind(fn) != "static":
                is_class = method_kind(fn) == "class"
                return TypeSet((Typed(ctx.cls, False, f"`{name}` in {ctx.cls.name}", is_class),))
            a = fn.args
            for arg in a.posonlyargs + a.args + a.kwonlyargs:
                if arg.arg == name:
                    if arg.annotation is None:
                        return UNKNOWN
                    note = ast.unparse(arg.annotation)
                    return self.annotation(arg.annotation, ctx, f"`{name}: {note}`")
            if name in (a.vararg.arg if a.vararg else None, a.kwarg.arg if a.kwarg else None):
                return FOREIGN
            assigned = self._local_values(fn, name)
            if assigned:
                out = TypeSet()
                for value, annotation in assigned:
                    if annotation is not None:
                        note = ast.unparse(annotation)
                        out = out | self.annotation(annotation, ctx, f"`{name}: {note}`")
                    elif value is not None:
                        out = out | self.of(value, ctx, None, depth + 1)
                    else:
                        out = out | UNKNOWN
                return out
        local = ctx.scope.lookup(name) if ctx.scope is not None else None
        if isinstance(local, ClassSource):
            return TypeSet((Typed(local, True, f"class `{name}`", is_class=True),))
        if isinstance(local, ImportRef) and local.attr is None:
            return FOREIGN  # a module
        if local is not None or name in ctx.module.classes or name in ctx.module.imports:
            found = self.index.resolve_expr(ctx.module, ast.Name(name), scope=ctx.scope)
            if isinstance(found, ClassSource):
                return TypeSet((Typed(found, True, f"class `{name}`", is_class=True),))
            if found is None:
                return FOREIGN  # a module, or a function
            return FOREIGN if found.known else UNKNOWN
        value = ctx.module.aliases.get(name)
        if value is not None:
            return self.of(value, Context(ctx.module), None, depth + 1)
        if hasattr(builtins, name):
            return FOREIGN
        return UNKNOWN

    def _local_values(
        self, fn: FunctionNode, name: str
    ) -> list[tuple[ast.expr | None, ast.expr | None]]:
        """``(value, annotation)`` of every binding of local ``name`` in ``fn`` (nested
        functions excluded); ``(None, None)`` for a binding that is not an assignment."""
        out: list[tuple[ast.expr | None, ast.expr | None]] = []
        for node in _own_nodes(fn):
            if isinstance(node, ast.Assign):
                for target in node.targets:
                    if isinstance(target, ast.Name) and target.id == name:
                        out.append((node.value, None))
                    elif _binds(target, name):
                        out.append((None, None))
            elif isinstance(node, ast.AnnAssign) and _binds(node.target, name):
                out.append((node.value, node.annotation))
            elif isinstance(node, (ast.For, ast.AsyncFor, ast.comprehension)) and _binds(
                node.target, name
            ):
                out.append((None, None))
            elif isinstance(node, ast.withitem) and node.optional_vars is not None:
                if _binds(node.optional_vars, name):
                    out.append((None, None))
            elif isinstance(node, ast.NamedExpr) and node.target.id == name:
                out.append((node.value, None))
            elif isinstance(node, (ast.Import, ast.ImportFrom)):
                for alias in node.names:
                    if (alias.asname or alias.name.split(".")[0]) == name:
                        out.append((None, None))
            elif isinstance(node, ast.ExceptHandler) and node.name == name:
                out.append((None, None))
        return out

    def _narrowed(self, name: str, ctx: Context, at: ast.AST | None) -> TypeSet | None:
        """``C`` when ``at`` lies in the body of ``if isinstance(name, C)`` (or after an
        ``assert isinstance(name, C)``) in the enclosing function."""
        fn = ctx.func
        if fn is None or at is None:
            return None
        line = getattr(at, "lineno", None)
        if line is None:
            return None
        for node in self._guards(fn):
            test: ast.expr | None = None
            if isinstance(node, ast.If):
                first = node.body[0].lineno if node.body else None
                last = node.body[-1].end_lineno if node.body else None
                if first is not None and last is not None and first <= line <= last:
                    test = node.test
            elif isinstance(node, ast.Assert) and node.lineno < line:
                test = node.test
            if test is None:
                continue
            for check in _and_terms(test):
                classes = _isinstance_of(check, name)
                if classes is None:
                    continue
                out = TypeSet()
                for c in classes:
                    out = out | self.annotation(c, ctx, f"`isinstance({name}, {ast.unparse(c)})`")
                return TypeSet(
                    tuple(Typed(t.cls, t.exact, t.how, t.is_class, True) for t in out.known),
                    out.unknown,
                    out.foreign,
                )
        return None

    def _guards(self, fn: FunctionNode) -> list[ast.stmt]:
        """The ``if``/``assert`` statements of ``fn`` that test ``isinstance`` (cached)."""
        key = id(fn)
        known = self._guard_cache.get(key)
        if known is None:
            known = [
                s
                for s in _own_statements(fn)
                if isinstance(s, (ast.If, ast.Assert)) and "isinstance" in ast.unparse(s.test)
            ]
            self._guard_cache[key] = known
        return known

    def _attribute(
        self, expr: ast.Attribute, ctx: Context, at: ast.AST | None, depth: int
    ) -> TypeSet:
        owner_module = self.index.module_of(ctx.module, expr.value, ctx.scope)
        if owner_module is not None:
            found = self.index.resolve_attr(owner_module, expr.attr)
            if isinstance(found, ClassSource):
                return TypeSet((Typed(found, True, f"class `{expr.attr}`", is_class=True),))
            return FOREIGN  # a module function or constant
        owner = self.of(expr.value, ctx, at, depth + 1)
        out = TypeSet(unknown=owner.unknown, foreign=owner.foreign)
        for typed in owner.known:
            if typed.is_class:
                method = self.index.find_method(typed.cls, expr.attr)
                if method is None:
                    out = out | self.attribute_of(typed.cls, expr.attr, depth + 1)
                continue
            out = out | self.attribute_of(typed.cls, expr.attr, depth + 1)
        return out

    def attribute_of(self, cls: ClassSource, attr: str, depth: int = 0) -> TypeSet:
        """What ``instance.attr`` can be, from the class and its bases (cached)."""
        key = (id(cls), attr)
        if key in self._attrs:
            return self._attrs[key]
        self._attrs[key] = UNKNOWN  # a cycle through this attribute: unknown
        result = self._attribute_of(cls, attr, depth)
        self._attrs[key] = result
        return result

    def _attribute_of(self, cls: ClassSource, attr: str, depth: int) -> TypeSet:
        values: list[tuple[ast.expr, Context]] = []
        for klass in self.index.mro(cls):
            if not isinstance(klass, ClassSource):
                continue
            ctx = Context(klass.module, klass, None, klass.scope)
            stmt = klass.class_assignments.get(attr)
            if isinstance(stmt, ast.AnnAssign):
                return self.annotation(
                    stmt.annotation, ctx, f"`{attr}: {ast.unparse(stmt.annotation)}`"
                )
            prop = klass.methods.get(attr)
            if prop is not None and any(
                _decorator_name(d) in ("property", "cached_property") for d in prop.decorator_list
            ):
                if prop.returns is None:
                    return UNKNOWN
                return self.annotation(
                    prop.returns,
                    Context(klass.module, klass, prop, klass.scope),
                    f"`{klass.name}.{attr} -> {ast.unparse(prop.returns)}`",
                )
            if isinstance(stmt, ast.Assign):
                values.append((stmt.value, ctx))
            for kind, value, method in self._self_assigned(klass).get(attr, ()):
                mctx = Context(klass.module, klass, method, klass.scope)
                if kind == "annotated":
                    note = ast.unparse(value)
                    return self.annotation(value, mctx, f"`self.{attr}: {note}`")
                if kind == "unpacked":
                    return UNKNOWN
                values.append((value, mctx))
        if not values:
            return UNKNOWN
        out = TypeSet()
        for value, vctx in values:
            typed = self.of(value, vctx, None, depth + 1)
            how = f"`self.{attr} = {_short(value)}`"
            out = out | TypeSet(
                tuple(Typed(t.cls, t.exact, f"{how} ({t.how})", t.is_class) for t in typed.known),
                typed.unknown,
                typed.foreign,
            )
        return out

    def _self_assigned(
        self, klass: ClassSource
    ) -> dict[str, list[tuple[str, ast.expr, FunctionNode]]]:
        """``self.x`` bindings in the class's methods, by name, read once per class:
        ``("annotated", annotation, method)``, ``("assigned", value, method)`` or
        ``("unpacked", target, method)`` (a tuple target: the value cannot be split)."""
        key = id(klass)
        known = self._assigned.get(key)
        if known is not None:
            return known
        out: dict[str, list[tuple[str, ast.expr, FunctionNode]]] = {}
        for method in klass.methods.values():
            me = _first_arg(method)
            if me is None:
                continue
            for node in _own_statements(method):
                if isinstance(node, ast.AnnAssign):
                    if _is_self_attr(node.target, me, None):
                        assert isinstance(node.target, ast.Attribute)
                        out.setdefault(node.target.attr, []).insert(
                            0, ("annotated", node.annotation, method)
                        )
                elif isinstance(node, ast.Assign):
                    for target in node.targets:
                        if _is_self_attr(target, me, None):
                            assert isinstance(target, ast.Attribute)
                            out.setdefault(target.attr, []).append(("assigned", node.value, method))
                        elif isinstance(target, ast.Tuple):
                            for elt in target.elts:
                                if _is_self_attr(elt, me, None):
                                    assert isinstance(elt, ast.Attribute)
                                    out.setdefault(elt.attr, []).append(("unpacked", elt, method))
        self._assigned[key] = out
        return out

    def _call(self, call: ast.Call, ctx: Context, depth: int) -> TypeSet:
        func = call.func
        if isinstance(func, ast.Name) and func.id == "getattr" and len(call.args) >= 2:
            name = call.args[1]
            if isinstance(name, ast.Constant) and isinstance(name.value, str):
                attr = ast.Attribute(call.args[0], name.value, ast.Load())
                ast.copy_location(attr, call)
                return self._attribute(attr, ctx, None, depth + 1)
            return UNKNOWN
        if isinstance(func, ast.Name) and func.id == "super":
            return UNKNOWN
        if (
            isinstance(func, ast.Call)
            and isinstance(func.func, ast.Name)
            and func.func.id == "type"
        ):
            inner = self.of(func.args[0], ctx, None, depth + 1) if func.args else UNKNOWN
            return TypeSet(
                tuple(Typed(t.cls, False, t.how) for t in inner.known), inner.unknown, inner.foreign
            )
        callee = self.of(func, ctx, call, depth + 1)
        out = TypeSet(unknown=callee.unknown, foreign=callee.foreign)
        for typed in callee.known:
            if typed.is_class:
                how = f"`{_short(call)}`"
                out = out | TypeSet((Typed(typed.cls, typed.exact, how),))
        if isinstance(func, ast.Attribute) and callee.unknown and not callee.known:
            out = self._method_return(func, ctx, depth) or out
        if isinstance(func, ast.Name) and not callee.known:
            returned = self._function_return(func.id, ctx)
            if returned is not None:
                return returned
        return out

    def _method_return(self, func: ast.Attribute, ctx: Context, depth: int) -> TypeSet | None:
        owner = self.of(func.value, ctx, None, depth + 1)
        if not owner.known or owner.unknown:
            return None
        out = TypeSet()
        for typed in owner.known:
            found = self.index.find_method(typed.cls, func.attr)
            if found is None or found[1].returns is None:
                return None
            klass, method = found
            note = ast.unparse(found[1].returns)
            out = out | self.annotation(
                method.returns,
                Context(klass.module, klass, method, klass.scope),
                f"`{klass.name}.{func.attr}() -> {note}`",
            )
        return out

    def _function_return(self, name: str, ctx: Context) -> TypeSet | None:
        for stmt in ctx.module.tree.body:
            if isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef)) and stmt.name == name:
                if stmt.returns is None:
                    return None
                note = ast.unparse(stmt.returns)
                return self.annotation(stmt.returns, Context(ctx.module), f"`{name}() -> {note}`")
        return None


def _short(node: ast.AST) -> str:
    text = ast.unparse(node)
    return text if len(text) <= 60 else text[:57] + "..."


def _is_self_attr(target: ast.expr, me: str | None, attr: str | None) -> bool:
    return (
        isinstance(target, ast.Attribute)
        and (attr is None or target.attr == attr)
        and isinstance(target.value, ast.Name)
        and target.value.id == me
    )


def _binds(target: ast.expr, name: str) -> bool:
    return any(
        isinstance(n, ast.Name) and n.id == name and isinstance(n.ctx, ast.Store)
        for n in ast.walk(target)
    )


def _own_statements(fn: FunctionNode) -> Iterator[ast.stmt]:
    """Every statement of ``fn``'s body at any depth, not entering nested functions or classes
    (assignments and tests are statements: their expressions need no walk)."""
    stack: list[ast.stmt] = list(fn.body)
    while stack:
        stmt = stack.pop()
        yield stmt
        if isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            continue
        for name in ("body", "orelse", "finalbody"):
            stack.extend(getattr(stmt, name, ()))
        for handler in getattr(stmt, "handlers", ()):
            stack.extend(handler.body)
        for case in getattr(stmt, "cases", ()):
            stack.extend(case.body)


def _own_nodes(fn: FunctionNode) -> Iterator[ast.AST]:
    """Every node of ``fn``'s body, not descending into nested functions or classes."""
    stack: list[ast.AST] = list(fn.body)
    while stack:
        node = stack.pop()
        yield node
        for child in ast.iter_child_nodes(node):
            if not isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                stack.append(child)


def _and_terms(test: ast.expr) -> list[ast.expr]:
    if isinstance(test, ast.BoolOp) and isinstance(test.op, ast.And):
        return [t for v in test.values for t in _and_terms(v)]
    return [test]


def _isinstance_of(test: ast.expr, name: str) -> list[ast.expr] | None:
    if (
        isinstance(test, ast.Call)
        and isinstance(test.func, ast.Name)
        and test.func.id == "isinstance"
        and len(test.args) == 2
        and isinstance(test.args[0], ast.Name)
        and test.args[0].id == name
    ):
        classes = test.args[1]
        return list(classes.elts) if isinstance(classes, ast.Tuple) else [classes]
    return None


@dataclass(frozen=True)
class Break:
    """How a call fails against one signature: the parameter concerned and Python's words."""

    parameter: str | None
    reason: str


def binding_breaks(call: ast.Call, sig: MethodSig, *, drop_first: bool = False) -> list[Break]:
    """Every way ``call`` cannot bind to ``sig`` (which excludes ``self``), as Python would
    refuse it. ``drop_first``: the call passes ``self`` explicitly (``Class.m(self, ...)``).
    Unpacked arguments (``*a``, ``**kw``) make the counts unknowable: only named keywords are
    then checked."""
    args = list(call.args[1:] if drop_first else call.args)
    starred = any(isinstance(a, ast.Starred) for a in args)
    double = any(k.arg is None for k in call.keywords)
    params = sig.params
    var_kw = any(p.kind is ParamKind.VAR_KEYWORD for p in params)
    var_pos = any(p.kind is ParamKind.VAR_POSITIONAL for p in params)
    positional = [p for p in params if p.positional]
    name = sig.name
    out: list[Break] = []
    filled: set[str] = set()
    if not starred:
        if len(args) > len(positional) and not var_pos:
            out.append(
                Break(
                    None,
                    f"{name}() takes {len(positional)} positional argument"
                    f"{'' if len(positional) == 1 else 's'} but {len(args)} were given",
                )
            )
        filled = {p.name for p in positional[: len(args)]}
    for kw in call.keywords:
        if kw.arg is None:
            continue
        param = sig.get(kw.arg)
        if param is None or param.kind in (ParamKind.VAR_POSITIONAL, ParamKind.VAR_KEYWORD):
            if not var_kw:
                out.append(Break(kw.arg, f"{name}() got an unexpected keyword argument '{kw.arg}'"))
        elif param.kind is ParamKind.POSITIONAL_ONLY and not var_kw:
            out.append(
                Break(
                    kw.arg,
                    f"{name}() got some positional-only arguments passed as keyword arguments: "
                    f"'{kw.arg}'",
                )
            )
        elif kw.arg in filled:
            out.append(Break(kw.arg, f"{name}() got multiple values for argument '{kw.arg}'"))
        else:
            filled.add(kw.arg)
    if not starred and not double:
        for param in params:
            if param.required and param.name not in filled:  # noqa: SIM102 (two reasons)
                if param.kind is ParamKind.KEYWORD_ONLY or param.positional:
                    out.append(
                        Break(
                            param.name,
                            f"{name}() missing 1 required argument: '{param.name}'",
                        )
                    )
    return out
