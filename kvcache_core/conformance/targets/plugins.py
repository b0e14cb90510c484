"""Installed plugins as check targets: every pool and allocator class of every spec.

Discovery would drop a drifted spec (that is its job); the checker must see it to say what is
wrong. So this loads each entry point in isolation with the one plugin loader
(``kvcache_core.plugin_loader``, which discovery uses too) and keeps every spec whose signatures
can be compared, valid or not. A plugin that fails to import or register, and a spec that is
junk before any comparison (not a PoolSpec, a contract version this kvcache does not know, a
pool or allocator "class" that is not a class: ``spec_shape_problem``, which discovery rejects
for the same reason), becomes a load-error result, never an exception.

For the source level, ``source_plugin_targets`` reads each plugin from source where it can
(``plugin_source``) and imports only the others: this module imports neither torch nor pluggy
until a plugin is actually imported.
"""

from __future__ import annotations

import inspect
from collections.abc import Sequence
from importlib import metadata
from typing import TYPE_CHECKING

from ...plugin_loader import POOL_ENTRY_POINT_GROUP, describe_value, entry_points, load_plugins
from ..members.sources import SourceIndex
from ..results.model import CheckResult, Finding, Outcome
from . import plugin_source
from .plugin_source import select_plugin_targets, static_spec_targets
from .target import ClassTarget

if TYPE_CHECKING:  # the contract imports torch: only the import path needs it
    from ...contracts.spec import PoolSpec

__all__ = [
    "entry_point_names",
    "installed_spec",
    "plugin_pools",
    "plugin_specs",
    "plugin_targets",
    "source_plugin_targets",
    "spec_shape_problem",
    "spec_targets",
]


def _pool_entry_points() -> list[metadata.EntryPoint]:
    return entry_points(POOL_ENTRY_POINT_GROUP)


def entry_point_names() -> list[str]:
    """The names of the installed pool plugins' entry points, sorted."""
    return [ep.name for ep in _pool_entry_points()]


def spec_shape_problem(spec: object) -> str | None:
    """Why ``spec`` cannot even be validated (not a spec, unknown contract, no classes), or
    None. Discovery rejects such a spec; the checker's loader reports it as a load error with
    this same reason (one check, so the two never disagree on what is junk)."""
    from ...contracts.spec import CONTRACT_VERSION, PoolSpec

    if isinstance(spec, type):
        if issubclass(spec, PoolSpec):
            return "hook returned the class PoolSpec, not a PoolSpec: call it, PoolSpec(name=...)"
        return f"hook returned the class {spec.__qualname__}, expected a PoolSpec instance"
    if not isinstance(spec, PoolSpec):
        return f"hook returned {describe_value(spec)}, expected PoolSpec"
    version = spec.contract_version
    if not isinstance(version, int) or isinstance(version, bool):
        return f"contract_version must be an int, got {describe_value(version)}"
    if version > CONTRACT_VERSION:
        return (
            f"built for contract {version}; this kvcache knows up to {CONTRACT_VERSION}: "
            "upgrade kvcache"
        )
    if version < 1:
        return f"built for contract {version}, which does not exist (contracts start at 1)"
    for role in ("pool_class", "allocator_class"):
        cls = getattr(spec, role)
        if not isinstance(cls, type):
            return f"{role} is {describe_value(cls)}, not a class"
    return None


def _load_failed(plugin: str, reason: str) -> CheckResult:
    finding = Finding(
        rule="load-error",
        message=f"plugin {plugin!r}: {reason}",
        target=f"plugin:{plugin}",
        hint="fix the plugin so that it imports and its kvcache_pool_specs() hook returns "
        "a list of PoolSpec",
    )
    return CheckResult(f"plugin:{plugin}", "load", Outcome.ERROR, (finding,), detail=reason)


def _class_target(cls: type, protocols: list[str], plugin: str, pool: str) -> ClassTarget:
    try:
        path = inspect.getsourcefile(cls)
    except (OSError, TypeError):
        path = None
    return ClassTarget(
        name=f"{cls.__module__}.{cls.__qualname__}",
        class_name=cls.__qualname__,
        protocols=tuple(protocols),
        path=path,
        module=cls.__module__,
        plugin=plugin,
        pool=pool,
        serves=((plugin, pool),),
    )


def spec_targets(spec: PoolSpec, plugin: str) -> list[ClassTarget]:
    """The pool class and the allocator class of ``spec``, with the Protocols it declares."""
    from ...contracts.spec import declared_protocols

    protocols = declared_protocols(spec.capabilities)
    pool = [proto.__name__ for proto in protocols["pool"]]
    allocator = [proto.__name__ for proto in protocols["allocator"]]
    return [
        _class_target(spec.pool_class, pool, plugin, spec.name),
        _class_target(spec.allocator_class, allocator, plugin, spec.name),
    ]


def _load_specs(ep: metadata.EntryPoint) -> tuple[list[PoolSpec], list[CheckResult]]:
    """Import one entry point and call its hook alone: its specs, and load errors."""
    from ...contracts.spec import PoolSpec

    loads = load_plugins([ep], hook="kvcache_pool_specs", bare=PoolSpec)
    if loads.rejected:
        return [], [_load_failed(ep.name, reason) for _info, reason in loads.rejected]
    good: list[PoolSpec] = []
    errors: list[CheckResult] = []
    for _info, specs in loads.loaded:
        for spec in specs:
            problem = spec_shape_problem(spec)
            if problem is None:
                assert isinstance(spec, PoolSpec)
                good.append(spec)
            elif isinstance(spec, PoolSpec):
                errors.append(_load_failed(ep.name, f"pool {spec.name!r}: {problem}"))
            else:
                errors.append(_load_failed(ep.name, problem))
    return good, errors


def plugin_specs(plugin: str) -> list[PoolSpec]:
    """The valid specs of the installed plugin ``plugin`` (load errors were reported already).

    The behaviour level needs the spec objects (their factories), not only the classes that
    ``plugin_targets`` turns into targets; importing a plugin again is free (``sys.modules``).
    """
    available = {ep.name: ep for ep in _pool_entry_points()}
    if plugin not in available:
        return []
    return _load_specs(available[plugin])[0]


def installed_spec(name: str) -> PoolSpec:
    """The spec of pool ``name`` as an installed plugin returns it, *without* discovery's
    validation: what a behaviour finding's reproduction builds its pool from.

    Why not ``discover().create(name)``: discovery refuses a drifted or under-declared plugin,
    and that is exactly the plugin whose behaviour findings its author needs to reproduce.

    :raises LookupError: No installed plugin declares a pool of that name.
    """
    for ep in _pool_entry_points():
        for spec in _load_specs(ep)[0]:
            if spec.name == name:
                return spec
    raise LookupError(f"no installed plugin declares a pool named {name!r}")


def plugin_pools(
    ep: metadata.EntryPoint,
) -> tuple[list[tuple[str, list[ClassTarget]]], list[CheckResult]]:
    """Import the plugin ``ep``: each valid spec's pool name with its targets, and load errors."""
    specs, errors = _load_specs(ep)
    return [(spec.name, spec_targets(spec, ep.name)) for spec in specs], errors


def plugin_targets(
    names: Sequence[str] | None = None,
) -> tuple[list[ClassTarget], list[CheckResult]]:
    """Targets of the named installed plugins (all when ``names`` is None), and load errors.

    A name may also be a pool name that an installed plugin declares (``kvcache check swa``
    where the plugin is called something else): then only that pool's classes are targets. A
    plugin name wins over a pool name. Raises ``LookupError`` naming the installed plugins and
    their pools when a name is neither. Every plugin is imported (the source level reads them
    instead where it can: ``source_plugin_targets``).
    """
    return select_plugin_targets({ep.name: ep for ep in _pool_entry_points()}, names, plugin_pools)


def source_plugin_targets(
    names: Sequence[str] | None = None,
    *,
    fallbacks: list[tuple[str, str]] | None = None,
) -> tuple[list[ClassTarget], list[CheckResult]]:
    """``plugin_targets`` for the source level: each plugin read from source when it can be
    (``plugin_source.static_specs``), imported otherwise (``fallbacks``, if given, collects
    ``(plugin, why)``)."""
    index = SourceIndex()
    cache: dict[str, tuple[list[tuple[str, list[ClassTarget]]], list[CheckResult]]] = {}

    def load(
        ep: metadata.EntryPoint,
    ) -> tuple[list[tuple[str, list[ClassTarget]]], list[CheckResult]]:
        if ep.name in cache:
            return cache[ep.name]
        specs = plugin_source.static_specs(ep, index)
        if isinstance(specs, str):
            if fallbacks is not None:
                fallbacks.append((ep.name, specs))
            cache[ep.name] = plugin_pools(ep)  # imports the plugin (and torch): only when needed
        else:
            cache[ep.name] = ([(s.name, static_spec_targets(s, ep.name)) for s in specs], [])
        return cache[ep.name]

    return select_plugin_targets({ep.name: ep for ep in _pool_entry_points()}, names, load)
