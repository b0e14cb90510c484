"""``discover()``: what an engine calls at start-up to get only validated pools.

Each entry point in the ``kvcache.pools`` group is loaded in isolation: an exception while
importing a plugin, while registering it with pluggy or while calling its hook rejects *that*
plugin (with a one-line traceback summary) and the others still load. Every spec is then
validated with the checker's signature level, the same comparison ``kvcache check`` runs.
"""

from __future__ import annotations

import os
import traceback
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from importlib import metadata
from types import ModuleType
from typing import Any

import pluggy

from . import hookspecs
from .conformance.methods import contract_methods
from .conformance.model import Finding
from .conformance.signature.level import signature_findings
from .contracts.pool import KVPool
from .contracts.spec import (
    BASE_PROTOCOLS,
    CAPABILITY_PROTOCOLS,
    CONTRACT_VERSION,
    PoolConfig,
    PoolSpec,
)
from .errors import PluginRejectedError, UnknownPoolError

__all__ = [
    "AcceptedPool",
    "PluginInfo",
    "Registry",
    "Rejection",
    "discover",
    "load_plugin_specs",
    "validate_spec",
]

ENV_ALLOW = "KVCACHE_PLUGINS"
ENV_DENY = "KVCACHE_DISABLE_PLUGINS"
ENV_NO_AUTOLOAD = "KVCACHE_DISABLE_PLUGIN_AUTOLOAD"


@dataclass(frozen=True)
class PluginInfo:
    """One entry point: its name, what it points at, and the distribution that ships it."""

    name: str
    value: str
    distribution: str | None = None
    version: str | None = None

    def __str__(self) -> str:
        dist = f"{self.distribution} {self.version}" if self.distribution else "no distribution"
        return f"{self.name} ({dist})"


@dataclass(frozen=True)
class AcceptedPool:
    spec: PoolSpec
    plugin: PluginInfo


@dataclass(frozen=True)
class Rejection:
    """A plugin (or one pool of a plugin) that discovery refused, and why."""

    plugin: PluginInfo
    reason: str
    pool: str | None = None
    findings: tuple[Finding, ...] = ()

    def __str__(self) -> str:
        what = (
            f"pool {self.pool!r} of plugin {self.plugin}" if self.pool else f"plugin {self.plugin}"
        )
        return f"{what}: {self.reason}"


@dataclass
class Registry:
    """Accepted pools by name, rejected plugins with reasons, plugins skipped by policy."""

    accepted: dict[str, AcceptedPool] = field(default_factory=dict)
    rejected: list[Rejection] = field(default_factory=list)
    skipped: list[tuple[PluginInfo, str]] = field(default_factory=list)

    def names(self) -> list[str]:
        return sorted(self.accepted)

    def spec(self, name: str) -> PoolSpec:
        try:
            return self.accepted[name].spec
        except KeyError:
            known = ", ".join(self.names()) or "none"
            why = next(
                (f" ({r.reason})" for r in self.rejected if name in (r.pool, r.plugin.name)), ""
            )
            raise UnknownPoolError(
                f"no accepted pool named {name!r}{why}; accepted: {known}"
            ) from None

    def create(self, name: str, config: PoolConfig) -> tuple[Any, Any]:
        """Build the pool ``name`` and its allocator from ``config``."""
        spec = self.spec(name)
        pool, allocator = spec.factory(config)
        if not isinstance(pool, KVPool):
            raise TypeError(
                f"factory of pool {name!r} returned {type(pool).__name__}, which lacks "
                "KVPool members (size, page_size, dtype, device, layer_num, buffers, ...)"
            )
        return pool, allocator


def _names_from_env(var: str) -> set[str] | None:
    raw = os.environ.get(var)
    if raw is None:
        return None
    return {n.strip() for n in raw.split(",") if n.strip()}


def _summarise(exc: BaseException) -> str:
    frames = traceback.extract_tb(exc.__traceback__)
    where = f" at {frames[-1].filename}:{frames[-1].lineno}" if frames else ""
    return f"{type(exc).__name__}: {exc}{where}"


def validate_spec(spec: object) -> tuple[Finding, ...] | str:
    """Fast checks of one spec: its type, contract version, and class signatures.

    Returns the error findings (empty when valid), or a reason string when the spec is not
    even a ``PoolSpec`` of a compatible contract version.
    """
    if not isinstance(spec, PoolSpec):
        return f"hook returned {type(spec).__name__}, expected PoolSpec"
    if spec.contract_version > CONTRACT_VERSION:
        return (
            f"declares contract {spec.contract_version}; this kvcache implements "
            f"contract {CONTRACT_VERSION} (upgrade kvcache)"
        )
    findings: list[Finding] = []
    checks: list[tuple[type, type]] = [
        (spec.pool_class, BASE_PROTOCOLS["pool"]),
        (spec.allocator_class, BASE_PROTOCOLS["allocator"]),
    ]
    for capability in sorted(spec.capabilities):
        role, proto = CAPABILITY_PROTOCOLS[capability]
        checks.append((spec.pool_class if role == "pool" else spec.allocator_class, proto))
    # Capability Protocols extend KVPool: check each method of each class once.
    done: dict[type, set[str]] = {}
    for cls, proto in checks:
        todo = set(contract_methods(proto)) - done.setdefault(cls, set())
        done[cls] |= todo
        findings.extend(f for f in signature_findings(cls, proto, methods=todo) if f.is_error)
    return tuple(findings)


def load_plugin_specs(
    pm: pluggy.PluginManager, info: PluginInfo, obj: object
) -> tuple[list[object], str | None]:
    """Register one plugin object and call its hook alone; return its specs or a reason."""
    try:
        pm.register(obj, name=info.name)
    except Exception as exc:  # pluggy validation of the hookimpl's signature, or a bad object
        return [], f"could not register with pluggy: {_summarise(exc)}"
    impls = [i for i in pm.hook.kvcache_pool_specs.get_hookimpls() if i.plugin_name == info.name]
    if not impls:
        return [], "implements no kvcache_pool_specs() hook"
    specs: list[object] = []
    for impl in impls:
        try:
            result = impl.function()
        except Exception as exc:
            return [], f"kvcache_pool_specs() raised {_summarise(exc)}"
        if not isinstance(result, (list, tuple)):
            return [], f"kvcache_pool_specs() returned {type(result).__name__}, expected a list"
        specs.extend(result)
    return specs, None


def _entry_points(group: str) -> Iterable[metadata.EntryPoint]:
    return metadata.entry_points(group=group)


def discover(
    *,
    strict: bool = False,
    allow: Sequence[str] | None = None,
    deny: Sequence[str] | None = None,
    autoload: bool | None = None,
    plugins: Sequence[ModuleType | object] = (),
    group: str = hookspecs.ENTRY_POINT_GROUP,
) -> Registry:
    """Load, validate and register every kvcache pool plugin.

    ``allow``/``deny`` name entry points (plugins); they default to ``$KVCACHE_PLUGINS`` and
    ``$KVCACHE_DISABLE_PLUGINS`` (comma-separated). With autoload off (argument, or
    ``$KVCACHE_DISABLE_PLUGIN_AUTOLOAD=1``) only entry points named in the allow list load.
    ``plugins`` are extra plugin objects (modules) registered directly, e.g. in tests.
    ``strict`` raises :class:`PluginRejectedError` listing every rejection.
    """
    allowed = set(allow) if allow is not None else _names_from_env(ENV_ALLOW)
    denied = set(deny) if deny is not None else (_names_from_env(ENV_DENY) or set())
    if autoload is None:
        autoload = os.environ.get(ENV_NO_AUTOLOAD, "") not in ("1", "true", "yes")

    registry = Registry()
    pm = pluggy.PluginManager(hookspecs.PROJECT_NAME)
    pm.add_hookspecs(hookspecs)
    candidates: list[tuple[PluginInfo, object]] = []

    dists: dict[object, tuple[str, str]] = {}  # one METADATA parse per distribution
    for ep in _entry_points(group):
        dist = getattr(ep, "dist", None)
        owner = None
        if dist is not None:
            key = getattr(dist, "_path", dist)
            if key not in dists:
                meta = dist.metadata
                dists[key] = (meta["Name"], meta["Version"])
            owner = dists[key]
        info = PluginInfo(ep.name, ep.value, *(owner or (None, None)))
        if ep.name in denied:
            registry.skipped.append((info, "disabled by deny list"))
            continue
        if allowed is not None and ep.name not in allowed:
            registry.skipped.append((info, "not in allow list"))
            continue
        if not autoload and (allowed is None or ep.name not in allowed):
            registry.skipped.append((info, "autoload disabled"))
            continue
        try:
            candidates.append((info, ep.load()))
        except Exception as exc:
            registry.rejected.append(Rejection(info, f"import failed: {_summarise(exc)}"))
    for obj in plugins:
        name = getattr(obj, "__name__", type(obj).__name__)
        candidates.append((PluginInfo(name, name), obj))

    providers: dict[str, list[tuple[PluginInfo, PoolSpec]]] = {}
    for info, obj in candidates:
        specs, reason = load_plugin_specs(pm, info, obj)
        if reason is not None:
            registry.rejected.append(Rejection(info, reason))
            continue
        for spec in specs:
            verdict = validate_spec(spec)
            pool_name = spec.name if isinstance(spec, PoolSpec) else None
            if isinstance(verdict, str):
                registry.rejected.append(Rejection(info, verdict, pool=pool_name))
            elif verdict:
                summary = "; ".join(str(f) for f in verdict[:3])
                more = f" (+{len(verdict) - 3} more)" if len(verdict) > 3 else ""
                registry.rejected.append(
                    Rejection(info, f"contract drift: {summary}{more}", pool_name, verdict)
                )
            else:
                assert isinstance(spec, PoolSpec)
                providers.setdefault(spec.name, []).append((info, spec))

    for pool_name, offers in providers.items():
        if len(offers) == 1:
            info, spec = offers[0]
            registry.accepted[pool_name] = AcceptedPool(spec, info)
            continue
        owners = ", ".join(
            f"{i.name} from {i.distribution or 'no distribution'}" for i, _ in offers
        )
        for info, _ in offers:
            registry.rejected.append(
                Rejection(
                    info, f"duplicate pool name {pool_name!r}, provided by: {owners}", pool_name
                )
            )

    if strict and registry.rejected:
        raise PluginRejectedError(list(registry.rejected))
    return registry
