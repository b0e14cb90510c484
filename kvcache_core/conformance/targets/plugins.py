"""Installed plugins as check targets: every pool and allocator class of every spec.

Discovery would drop a drifted spec (that is its job); the checker must see it to say what is
wrong. So this loads each entry point in isolation, calls its hook through discovery's own
loader, and keeps every spec whose signatures can be compared, valid or not. A plugin that fails
to import or register, and a spec that discovery rejects before validating it (not a PoolSpec, a
contract version this kvcache does not know, a pool or allocator "class" that is not a class:
``discovery.spec_shape_problem``), becomes a load-error result, never an exception.
"""

from __future__ import annotations

import inspect
import traceback
from collections.abc import Sequence
from importlib import metadata

import pluggy

from ... import hookspecs
from ...contracts.spec import PoolSpec, declared_protocols
from ...discovery import PluginInfo, load_plugin_specs, spec_shape_problem
from ..results.model import CheckResult, Finding, Outcome
from .plugin_source import entry_points, select_plugin_targets
from .target import ClassTarget

__all__ = ["entry_point_names", "installed_spec", "plugin_pools", "plugin_targets"]


def entry_point_names() -> list[str]:
    return [ep.name for ep in entry_points()]


def _summarise(exc: BaseException) -> str:
    frames = traceback.extract_tb(exc.__traceback__)
    where = f" at {frames[-1].filename}:{frames[-1].lineno}" if frames else ""
    return f"{type(exc).__name__}: {exc}{where}"


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
    protocols = declared_protocols(spec.capabilities)
    pool = [proto.__name__ for proto in protocols["pool"]]
    allocator = [proto.__name__ for proto in protocols["allocator"]]
    return [
        _class_target(spec.pool_class, pool, plugin, spec.name),
        _class_target(spec.allocator_class, allocator, plugin, spec.name),
    ]


def _load_specs(ep: metadata.EntryPoint) -> tuple[list[PoolSpec], list[CheckResult]]:
    """Import one entry point and call its hook alone: its specs, and load errors."""
    dist = getattr(ep, "dist", None)
    info = PluginInfo(ep.name, ep.value, dist.metadata["Name"] if dist else None)
    try:
        obj = ep.load()
    except BaseException as exc:  # a plugin's import may raise anything, even SystemExit
        if isinstance(exc, KeyboardInterrupt):
            raise
        return [], [_load_failed(ep.name, f"import failed: {_summarise(exc)}")]
    pm = pluggy.PluginManager(hookspecs.PROJECT_NAME)
    pm.add_hookspecs(hookspecs)
    specs, reason = load_plugin_specs(pm, info, obj)
    if reason is not None:
        return [], [_load_failed(ep.name, reason)]
    good: list[PoolSpec] = []
    errors: list[CheckResult] = []
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
    available = {ep.name: ep for ep in entry_points()}
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
    for ep in entry_points():
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
    instead where it can: ``plugin_source.source_plugin_targets``).
    """
    return select_plugin_targets({ep.name: ep for ep in entry_points()}, names, plugin_pools)
