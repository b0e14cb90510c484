"""Installed plugins' targets read from source, for the source level: no plugin is imported.

``kvcache check --level source`` starts like a linter, so it must not import a plugin (which
imports torch) only to learn which classes its ``PoolSpec``s name. When a plugin's hook is
written in the plain form every built-in plugin uses::

    @hookimpl
    def kvcache_pool_specs() -> list[PoolSpec]:
        return [PoolSpec(name="mha", pool_class=MHAPool, allocator_class=Alloc,
                         factory=create, capabilities=frozenset({Capability.OFFLOAD}))]

its module file is located (``importlib.util.find_spec`` of the top-level package only, which
runs nothing, then a walk of the package's folders), parsed, and each class name resolved
through the module's imports (``SourceIndex``), giving the very targets the import path
(``plugins.spec_targets``) gives. Anything this cannot read for certain (a computed argument, a
hook that is not a list literal of ``PoolSpec(...)`` calls, a class that does not resolve to one
top-level class statement, a module file that cannot be found or parsed) makes that plugin, and
only that plugin, go through the import path as before: the answer never depends on which path
was taken (``plugins.source_plugin_targets`` chooses the path per plugin). A test compares both
paths on every installed plugin.

What reading cannot see: a plugin module that parses but fails when imported (a missing
dependency, an exception at import time). The import path reports that as a load error; the
source level, which reads a plugin the way it reads a file, checks its classes.
"""

from __future__ import annotations

import ast
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from importlib import metadata
from types import MappingProxyType

from ..members.sources import ClassSource, ModuleSource, SourceIndex, flatten_statements
from ..results.model import CheckResult
from .target import ClassTarget

__all__ = [
    "CAPABILITY_COMPANION_NAMES",
    "CAPABILITY_PROTOCOL_NAMES",
    "PluginLoad",
    "StaticSpec",
    "select_plugin_targets",
    "static_spec_targets",
    "static_specs",
]

#: ``Capability`` member name -> (its value, the role it applies to, the Protocol's name): the
#: torch-free twin of ``contracts.spec.CAPABILITY_PROTOCOLS`` (a test checks they agree).
CAPABILITY_PROTOCOL_NAMES: Mapping[str, tuple[str, str, str]] = MappingProxyType(
    {
        "OFFLOAD": ("offload", "pool", "OffloadablePool"),
        "MLA": ("mla", "pool", "MLAPool"),
        "INDEXER": ("indexer", "pool", "IndexerKeyPool"),
        "SLIDING_WINDOW": ("sliding-window", "pool", "SlidingWindowPool"),
        "MAMBA_STATE": ("mamba-state", "pool", "MambaStatePool"),
        "HISPARSE": ("hisparse", "pool", "HiSparsePool"),
        "PAGED": ("paged", "allocator", "PagedAllocator"),
    }
)

#: ``Capability`` member name -> (the other role, the Protocol's name): the torch-free twin of
#: ``contracts.spec.CAPABILITY_COMPANION_PROTOCOLS`` (the same test checks they agree).
CAPABILITY_COMPANION_NAMES: Mapping[str, tuple[str, str]] = MappingProxyType(
    {"SLIDING_WINDOW": ("allocator", "SWAAllocator")}
)

_HOOK = "kvcache_pool_specs"
_POOL_SPEC = "kvcache_core.contracts.spec.PoolSpec"
_CAPABILITY = "kvcache_core.contracts.spec.Capability"
#: Where ``hookimpl`` may be imported from (the public face, or its defining module).
_HOOKIMPL_SOURCES = frozenset(
    {("kvcache_core", "hookimpl"), ("kvcache_core.hookspecs", "hookimpl")}
)
#: Class decorators that return the class they are given (anything else may replace it).
_KEEPING_DECORATORS = frozenset({"dataclass", "final", "runtime_checkable", "total_ordering"})
#: ``PoolSpec`` keywords read here; any other (or a positional argument) means: import.
_KEYWORDS = frozenset(
    {"name", "pool_class", "allocator_class", "factory", "capabilities", "description"}
)


class _Unreadable(Exception):
    """The plugin cannot be read for certain: take the import path for it."""


@dataclass(frozen=True)
class StaticSpec:
    """What the source level needs of one ``PoolSpec``, read from source."""

    name: str
    pool_class: ClassSource
    allocator_class: ClassSource
    #: ``Capability`` values, e.g. ``("offload", "paged")``.
    capabilities: tuple[str, ...]


def _names_in(node: ast.AST) -> set[str]:
    return {n.id for n in ast.walk(node) if isinstance(n, ast.Name)}


def _bindings(module: ModuleSource, name: str) -> int:
    """How many module-level statements of ``module`` bind ``name`` (a ``global`` statement or
    a ``*`` import anywhere counts too: either may rebind it)."""
    count = 0
    for stmt in flatten_statements(module.tree.body, loops=True):
        if isinstance(stmt, (ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            count += stmt.name == name
        elif isinstance(stmt, (ast.Import, ast.ImportFrom)):
            count += sum(
                (a.asname or a.name.split(".")[0]) == name or a.name == "*" for a in stmt.names
            )
        elif isinstance(stmt, (ast.Assign, ast.AnnAssign, ast.AugAssign)):
            targets = stmt.targets if isinstance(stmt, ast.Assign) else [stmt.target]
            count += any(name in _names_in(t) for t in targets)
        elif isinstance(stmt, (ast.For, ast.AsyncFor)):
            count += name in _names_in(stmt.target)
        elif isinstance(stmt, (ast.With, ast.AsyncWith)):
            count += any(
                i.optional_vars is not None and name in _names_in(i.optional_vars)
                for i in stmt.items
            )
        elif isinstance(stmt, ast.Delete):
            count += any(name in _names_in(t) for t in stmt.targets)
        elif isinstance(stmt, ast.Try):
            count += any(h.name == name for h in stmt.handlers)
    for node in ast.walk(module.tree):
        count += (isinstance(node, ast.Global) and name in node.names) or (
            isinstance(node, ast.NamedExpr) and node.target.id == name
        )
    return count


def _class(index: SourceIndex, module: ModuleSource, expr: ast.expr) -> ClassSource:
    """The one top-level class statement ``expr`` (a name) denotes in ``module``."""
    if not isinstance(expr, ast.Name) or _bindings(module, expr.id) != 1:
        raise _Unreadable(f"{ast.unparse(expr)} is not a name bound once")
    found = index.resolve_name(module, expr.id)
    if not isinstance(found, ClassSource):
        raise _Unreadable(f"{expr.id} does not resolve to a class in source")
    home = found.module
    if found.node not in home.tree.body or _bindings(home, found.name) != 1:
        raise _Unreadable(f"{found.qualname} is not one top-level class statement")
    if {"__module__", "__qualname__"} & set(found.class_assignments) or any(
        k.arg != "metaclass" or ast.unparse(k.value) not in ("ABCMeta", "abc.ABCMeta")
        for k in found.node.keywords
    ):
        raise _Unreadable(f"{found.qualname} may not be the class its statement reads as")
    for decorator in found.node.decorator_list:
        target = decorator.func if isinstance(decorator, ast.Call) else decorator
        name = target.attr if isinstance(target, ast.Attribute) else getattr(target, "id", "")
        if name not in _KEEPING_DECORATORS:
            raise _Unreadable(f"{found.qualname} has decorator {ast.unparse(decorator)}")
    return found


def _is(index: SourceIndex, module: ModuleSource, expr: ast.expr, qualname: str) -> bool:
    if not isinstance(expr, ast.Name) or _bindings(module, expr.id) != 1:
        return False
    found = index.resolve_name(module, expr.id)
    return isinstance(found, ClassSource) and found.qualname == qualname


def _capabilities(index: SourceIndex, module: ModuleSource, expr: ast.expr | None) -> list[str]:
    if expr is None:
        return []
    if (
        isinstance(expr, ast.Call)
        and isinstance(expr.func, ast.Name)
        and expr.func.id == "frozenset"
        and _bindings(module, "frozenset") == 0
        and not expr.keywords
        and len(expr.args) <= 1
    ):
        if not expr.args:
            return []
        expr = expr.args[0]
    if not isinstance(expr, (ast.Set, ast.List, ast.Tuple)):
        raise _Unreadable(f"capabilities {ast.unparse(expr)} is not a literal")
    values: list[str] = []
    for element in expr.elts:
        if not (
            isinstance(element, ast.Attribute)
            and element.attr in CAPABILITY_PROTOCOL_NAMES
            and _is(index, module, element.value, _CAPABILITY)
        ):
            raise _Unreadable(f"capability {ast.unparse(element)} is not Capability.MEMBER")
        values.append(CAPABILITY_PROTOCOL_NAMES[element.attr][0])
    return values


def _factory(module: ModuleSource, expr: ast.expr) -> None:
    """A factory the import path would accept: a function defined once in the module."""
    if isinstance(expr, ast.Lambda):
        return
    if (
        isinstance(expr, ast.Name)
        and _bindings(module, expr.id) == 1
        and any(isinstance(s, ast.FunctionDef) and s.name == expr.id for s in module.tree.body)
    ):
        return
    raise _Unreadable(f"factory {ast.unparse(expr)} is not a function of the module")


def _spec(index: SourceIndex, module: ModuleSource, call: ast.expr) -> StaticSpec:
    if not (isinstance(call, ast.Call) and _is(index, module, call.func, _POOL_SPEC)):
        raise _Unreadable(f"{ast.unparse(call)} is not a PoolSpec(...) call")
    kwargs = {k.arg: k.value for k in call.keywords}
    if call.args or None in kwargs or not set(kwargs) <= _KEYWORDS:
        raise _Unreadable("PoolSpec(...) has arguments this reader does not take")
    if {"name", "pool_class", "allocator_class", "factory"} - set(kwargs):
        raise _Unreadable("PoolSpec(...) misses a required argument")
    name = kwargs["name"]
    if not (isinstance(name, ast.Constant) and isinstance(name.value, str)):
        raise _Unreadable("PoolSpec name is not a string literal")
    if not name.value or not name.value.replace("-", "").replace("_", "").isalnum():
        raise _Unreadable(f"PoolSpec name {name.value!r} is rejected at run time")
    description = kwargs.get("description")
    if description is not None and not (
        isinstance(description, ast.Constant) and isinstance(description.value, str)
    ):
        raise _Unreadable("PoolSpec description is not a string literal")
    _factory(module, kwargs["factory"])
    return StaticSpec(
        name=name.value,
        pool_class=_class(index, module, kwargs["pool_class"]),
        allocator_class=_class(index, module, kwargs["allocator_class"]),
        capabilities=tuple(sorted(set(_capabilities(index, module, kwargs.get("capabilities"))))),
    )


def _hook(module: ModuleSource) -> ast.FunctionDef:
    """The module's one ``@hookimpl def kvcache_pool_specs()``."""
    if module.star_imports or _bindings(module, _HOOK) != 1:
        raise _Unreadable(f"{_HOOK} is not bound once")
    hooks = [s for s in module.tree.body if isinstance(s, ast.FunctionDef) and s.name == _HOOK]
    ref = module.imports.get("hookimpl")
    if (
        len(hooks) != 1
        or ref is None
        or (ref.module, ref.attr) not in _HOOKIMPL_SOURCES
        or _bindings(module, "hookimpl") != 1
    ):
        raise _Unreadable(f"no top-level {_HOOK} with a plain @hookimpl")
    hook = hooks[0]
    if [ast.unparse(d) for d in hook.decorator_list] != ["hookimpl"]:
        raise _Unreadable(f"{_HOOK} is not decorated with a plain @hookimpl")
    args = hook.args
    if args.posonlyargs or args.args or args.vararg or args.kwonlyargs or args.kwarg:
        raise _Unreadable(f"{_HOOK} takes arguments")
    # Any other function marked as a hook (a specname= variant) would be called too.
    for stmt in ast.walk(module.tree):
        if (
            isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef))
            and stmt is not hook
            and any("hookimpl" in ast.unparse(d) for d in stmt.decorator_list)
        ):
            raise _Unreadable(f"{stmt.name} is marked as a hook too")
    return hook


def _returned(hook: ast.FunctionDef) -> list[ast.expr]:
    """The ``PoolSpec(...)`` expressions the hook returns: ``return [...]``, or a local list
    built by one assignment and returned."""
    body = list(hook.body)
    if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
        body = body[1:]  # the docstring
    value: ast.expr | None
    if len(body) == 1 and isinstance(body[0], ast.Return):  # noqa: SIM114 (two shapes)
        value = body[0].value
    elif (
        len(body) == 2
        and isinstance(body[0], ast.Assign)
        and len(body[0].targets) == 1
        and isinstance(body[0].targets[0], ast.Name)
        and isinstance(body[1], ast.Return)
        and isinstance(body[1].value, ast.Name)
        and body[1].value.id == body[0].targets[0].id
    ):
        value = body[0].value
    else:
        raise _Unreadable(f"{_HOOK} is not a plain `return [PoolSpec(...), ...]`")
    if not isinstance(value, (ast.List, ast.Tuple)) or any(
        isinstance(e, ast.Starred) for e in value.elts
    ):
        raise _Unreadable(f"{_HOOK} does not return a list literal")
    return list(value.elts)


def static_specs(
    ep: metadata.EntryPoint, index: SourceIndex | None = None
) -> list[StaticSpec] | str:
    """The specs of the plugin ``ep``, read from source; or why they cannot be (import it)."""
    # An index of its own: no root of a checked tree may shadow an installed module.
    index = index or SourceIndex()
    if ep.attr:
        return f"entry point {ep.value!r} names an attribute, not a module"
    module = index.module(ep.module)
    if module is None:
        why = index.errors.get(ep.module, "its file was not found")
        return f"cannot read module {ep.module}: {why}"
    try:
        return [_spec(index, module, call) for call in _returned(_hook(module))]
    except _Unreadable as exc:
        return str(exc)
    except RecursionError:
        return "resolution went too deep"


def static_spec_targets(spec: StaticSpec, plugin: str) -> list[ClassTarget]:
    """``plugins.spec_targets`` of a spec read from source: the same targets, field for field."""
    protocols = {"pool": ["KVPool"], "allocator": ["TokenAllocator"]}
    by_value = {value: (role, proto) for value, role, proto in CAPABILITY_PROTOCOL_NAMES.values()}
    companion = {
        CAPABILITY_PROTOCOL_NAMES[member][0]: entry
        for member, entry in CAPABILITY_COMPANION_NAMES.items()
    }
    for value in spec.capabilities:  # sorted by value, as sorting the str enum sorts
        entries = [by_value[value], *([companion[value]] if value in companion else [])]
        for role, proto in entries:
            if proto not in protocols[role]:
                protocols[role].append(proto)
    return [
        _target(spec.pool_class, protocols["pool"], plugin, spec.name),
        _target(spec.allocator_class, protocols["allocator"], plugin, spec.name),
    ]


def _target(cls: ClassSource, protocols: list[str], plugin: str, pool: str) -> ClassTarget:
    return ClassTarget(
        name=cls.qualname,
        class_name=cls.name,
        protocols=tuple(protocols),
        path=cls.path,
        module=cls.module.name,
        plugin=plugin,
        pool=pool,
        serves=((plugin, pool),),
    )


#: One plugin's pools, each ``(pool name, its targets)``, and its load errors.
PluginLoad = Callable[
    [metadata.EntryPoint], tuple[list[tuple[str, list[ClassTarget]]], list[CheckResult]]
]


def select_plugin_targets(
    available: Mapping[str, metadata.EntryPoint],
    names: Sequence[str] | None,
    load: PluginLoad,
) -> tuple[list[ClassTarget], list[CheckResult]]:
    """Targets of the named plugins or pools (all when ``names`` is None), and load errors.

    See ``plugins.plugin_targets``; ``load`` reads one plugin (importing it or not).
    """
    whole: set[str] = set(available) if names is None else {n for n in names if n in available}
    some_pools: dict[str, set[str]] = {}
    unknown = [n for n in names or () if n not in available]
    if unknown:
        # Pool names are only known once every plugin is loaded: do that only when needed.
        owner = {pool: ep.name for ep in available.values() for pool, _ in load(ep)[0]}
        missing = [n for n in unknown if n not in owner]
        if missing:
            known = f"; pools: {', '.join(sorted(owner))}" if owner else ""
            raise LookupError(
                f"no installed kvcache plugin named {', '.join(map(repr, missing))}; "
                f"installed: {', '.join(sorted(available)) or 'none'}{known}"
            )
        for pool in unknown:
            some_pools.setdefault(owner[pool], set()).add(pool)
    targets: list[ClassTarget] = []
    errors: list[CheckResult] = []
    for name, ep in available.items():
        if name not in whole and name not in some_pools:
            continue
        pools, failed = load(ep)
        errors += failed
        for pool, found in pools:
            if name in whole or pool in some_pools[name]:
                targets.extend(found)
    return targets, errors
