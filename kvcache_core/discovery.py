"""``discover()``: what an engine calls at start-up to get only validated pools.

Each entry point in the ``kvcache.pools`` group is loaded in isolation: an exception while
importing a plugin, while registering it with pluggy or while calling its hook rejects *that*
plugin (with a one-line traceback summary) and the others still load. Every spec is then
validated with the checker's signature level, the same comparison ``kvcache check`` runs.

The checker's body rules (``not-implemented``, ``parameter-not-forwarded``,
``writeloc-not-unwrapped``) are source findings: they do not reject a pool, they are warnings on
the accepted pool (``AcceptedPool.warnings``, ``Registry.warnings(name)``), computed from the
methods' own lines the first time they are asked for; ``discover(strict=True)`` computes them
at once and rejects a pool that has any.
"""

from __future__ import annotations

import inspect
import os
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from functools import cached_property
from types import ModuleType
from typing import Any

from .conformance.members.methods import BODY_RULES, contract_methods
from .conformance.results.model import Finding, Location
from .conformance.results.rules import Severity
from .conformance.signature.level import signature_findings
from .conformance.targets.plugins import spec_shape_problem
from .contracts.pool import KVPool
from .contracts.spec import PoolConfig, PoolSpec, declared_protocols
from .errors import PluginRejectedError, UnknownPoolError
from .plugin_loader import (
    POOL_ENTRY_POINT_GROUP,
    PluginInfo,
    entry_points,
    load_plugins,
    skip_policy,
    summarise_exception,
)

__all__ = [
    "AcceptedPool",
    "PluginInfo",
    "Registry",
    "Rejection",
    "discover",
    "spec_shape_problem",
    "validate_spec",
]

ENV_ALLOW = "KVCACHE_PLUGINS"
ENV_DENY = "KVCACHE_DISABLE_PLUGINS"
ENV_NO_AUTOLOAD = "KVCACHE_DISABLE_PLUGIN_AUTOLOAD"


@dataclass(frozen=True)
class AcceptedPool:
    """A validated pool, with the source findings (warnings) discovery does not reject for."""

    spec: PoolSpec
    plugin: PluginInfo

    @cached_property
    def source_findings(self) -> tuple[Finding, ...]:
        """Body-rule warnings, then notes on methods whose source could not be analysed.

        Computed on first access (reading only the methods the rules need), then kept.
        """
        return _source_findings(self.spec)

    @property
    def warnings(self) -> tuple[Finding, ...]:
        """What ``kvcache check`` would report from the methods' bodies, as warnings."""
        return tuple(f for f in self.source_findings if f.severity is Severity.WARNING)

    @property
    def notes(self) -> tuple[Finding, ...]:
        """Methods whose bodies could not be analysed (no source file, unparsable source)."""
        return tuple(f for f in self.source_findings if f.severity is Severity.NOTE)


@dataclass(frozen=True)
class Rejection:
    """A plugin (or one pool of a plugin) that discovery refused, and why.

    Kept in [`Registry.rejected`][kvcache_core.Registry] rather than raised, so one broken
    plugin never stops an engine from starting with the others; ``str()`` is the one-line
    report ``kvcache list`` prints.

    :param plugin: The entry point (name, target, distribution and version).
    :param reason: Why, in one line: an import error's summary, contract drift, a duplicate name.
    :param pool: The pool's name when one pool of the plugin was refused; None for the plugin.
    :param findings: The checker's findings when the reason is contract drift.
    :param spec: The spec, when the plugin returned one.
    """

    plugin: PluginInfo
    """The entry point (name, target, distribution and version)."""
    reason: str
    """Why, in one line: an import error's summary, contract drift, a duplicate name."""
    pool: str | None = None
    """The pool's name when one pool of the plugin was refused; None for the plugin."""
    findings: tuple[Finding, ...] = ()
    """The checker's findings when the reason is contract drift."""
    spec: PoolSpec | None = None
    """The spec, when the plugin returned one (for its declared contract and capabilities)."""

    def __str__(self) -> str:
        """One line: which plugin (and pool) and why, as ``kvcache list`` prints it."""
        what = (
            f"pool {self.pool!r} of plugin {self.plugin}" if self.pool else f"plugin {self.plugin}"
        )
        return f"{what}: {self.reason}"


@dataclass
class Registry:
    """What [`discover`][kvcache_core.discover] found: accepted pools by name, rejected plugins
    with reasons, plugins skipped by policy.

    An engine builds pools only through ``create``, so it only ever gets a pool whose classes
    passed validation; ``rejected`` and ``skipped`` are there to report, not to use.

    :param accepted: Validated pools by pool name, each with its spec and plugin.
    :param rejected: Every [`Rejection`][kvcache_core.Rejection], in discovery order.
    :param skipped: Plugins not loaded because of the allow/deny lists or autoload, with why.
    """

    accepted: dict[str, AcceptedPool] = field(default_factory=dict)
    """Validated pools by pool name, each with its spec and plugin."""
    rejected: list[Rejection] = field(default_factory=list)
    """Every [`Rejection`][kvcache_core.Rejection], in discovery order."""
    skipped: list[tuple[PluginInfo, str]] = field(default_factory=list)
    """Plugins not loaded because of the allow/deny lists or autoload, with why."""

    def names(self) -> list[str]:
        """The accepted pools' names, sorted."""
        return sorted(self.accepted)

    def warnings(self, name: str) -> tuple[Finding, ...]:
        """Body-rule warnings on the accepted pool ``name`` (what ``kvcache check`` reports from
        its methods' bodies); computed on first use. Raises like ``spec``."""
        if name not in self.accepted:
            self.spec(name)  # raises UnknownPoolError with the reason
        return self.accepted[name].warnings

    def spec(self, name: str) -> PoolSpec:
        """The accepted spec of pool ``name``.

        :raises UnknownPoolError: No accepted pool has that name; the message lists the
            accepted ones and, when the pool was rejected, why.
        """
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
        """Build the pool ``name`` and its allocator from ``config``: ``(pool, allocator)``.

        :raises UnknownPoolError: As ``spec``.
        :raises TypeError: The factory returned something that is not a
            [`KVPool`][kvcache_core.KVPool] (caught here, not at the first write).
        """
        spec = self.spec(name)
        pool, allocator = spec.factory(config)
        if not isinstance(pool, KVPool):
            raise TypeError(
                f"factory of pool {name!r} returned {type(pool).__name__}, which lacks "
                "KVPool members (size, page_size, dtype, device, layer_num, buffers, ...)"
            )
        return pool, allocator


def _class_checks(spec: PoolSpec) -> list[tuple[type, type, set[str]]]:
    """(class, Protocol, methods) to check for ``spec``: each method of each class once."""
    classes = {"pool": spec.pool_class, "allocator": spec.allocator_class}
    checks = [
        (classes[role], proto)
        for role, protos in declared_protocols(spec.capabilities).items()
        for proto in protos
    ]
    # Capability Protocols extend KVPool: check each method of each class once.
    done: dict[type, set[str]] = {}
    out: list[tuple[type, type, set[str]]] = []
    for cls, proto in checks:
        todo = set(contract_methods(proto)) - done.setdefault(cls, set())
        done[cls] |= todo
        if todo:
            out.append((cls, proto, todo))
    return out


def validate_spec(spec: object) -> tuple[Finding, ...] | str:
    """Fast checks of one spec: its type, contract version, and class signatures.

    Returns the error findings (empty when valid), or a reason string when the spec is not
    even a ``PoolSpec`` of a compatible contract version, or when validating it raised. The
    body rules are not run here (see `AcceptedPool.warnings`).
    """
    try:
        problem = spec_shape_problem(spec)
        if problem is not None:
            return problem
        assert isinstance(spec, PoolSpec)
        findings: list[Finding] = []
        for cls, proto, methods in _class_checks(spec):
            findings.extend(
                f for f in signature_findings(cls, proto, methods=methods) if f.is_error
            )
        return tuple(findings)
    except Exception as exc:  # a class odd enough to break the comparison rejects its spec only
        return f"validating the spec raised {summarise_exception(exc)}"


def _class_name(cls: type) -> str:
    return f"{cls.__module__}.{cls.__qualname__}"


def _source_findings(spec: PoolSpec) -> tuple[Finding, ...]:
    """The checker's body rules on an accepted spec: warnings, then notes. Never raises."""
    warnings: list[Finding] = []
    notes: list[Finding] = []

    def note(cls: type, why: str) -> None:
        notes.append(
            Finding(
                rule="load-error",
                severity=Severity.NOTE,
                message=f"body rules (not-implemented, parameter-not-forwarded, "
                f"writeloc-not-unwrapped) not checked for {why}",
                target=_class_name(cls),
                hint="run `kvcache check` on the plugin's source files (`--level source`)",
                impl_location=_where(cls),
            )
        )

    for cls, proto, methods in _class_checks(spec):
        unread: list[str] = []
        try:
            found = signature_findings(cls, proto, methods=methods, body_checks=True, unread=unread)
        except Exception as exc:
            note(cls, f"{cls.__qualname__}: {summarise_exception(exc)}")
            continue
        warnings += [replace(f, severity=Severity.WARNING) for f in found if f.rule in BODY_RULES]
        for why in unread:
            note(cls, why)
    return (*warnings, *notes)


def _where(cls: type) -> Location | None:
    try:
        path = inspect.getsourcefile(cls)
    except (OSError, TypeError):
        return None
    return Location(path) if path else None


def discover(
    *,
    strict: bool = False,
    allow: Sequence[str] | None = None,
    deny: Sequence[str] | None = None,
    autoload: bool | None = None,
    plugins: Sequence[ModuleType | object] = (),
    group: str = POOL_ENTRY_POINT_GROUP,
) -> Registry:
    """Load, validate and register every kvcache pool plugin: what an engine calls at start-up.

    Each entry point of the ``kvcache.pools`` group is loaded in isolation, and each spec's
    classes are checked against the contract with the checker's signature level. Whatever a
    plugin does wrong (an import error, a drifted signature, a duplicate pool name) rejects
    that plugin only, with the reason in [`Registry.rejected`][kvcache_core.Registry]: the
    engine starts with the others instead of crashing at the first retraction.

    :param strict: Raise instead of isolating: every rejection, and every pool with a body-rule
        warning, fails discovery (for CI and for engines that would rather not start).
    :param allow: Entry-point (plugin) names to load, all others skipped; default
        ``$KVCACHE_PLUGINS`` (comma-separated), or all when unset.
    :param deny: Entry-point names to skip; default ``$KVCACHE_DISABLE_PLUGINS``.
    :param autoload: False loads only the entry points named in the allow list; default off
        when ``$KVCACHE_DISABLE_PLUGIN_AUTOLOAD=1``, else on.
    :param plugins: Extra plugin objects (modules) registered directly, e.g. in tests.
    :param group: The entry-point group to read.
    :returns: The [`Registry`][kvcache_core.Registry].
    :raises PluginRejectedError: With ``strict``, listing every rejection.
    """
    if autoload is None:
        autoload = os.environ.get(ENV_NO_AUTOLOAD, "") not in ("1", "true", "yes")
    skip = skip_policy(allow, deny, env_allow=ENV_ALLOW, env_deny=ENV_DENY, autoload=autoload)
    loads = load_plugins(
        entry_points(group), hook="kvcache_pool_specs", skip=skip, plugins=plugins, bare=PoolSpec
    )
    registry = Registry(skipped=loads.skipped)
    registry.rejected += [Rejection(info, reason) for info, reason in loads.rejected]

    providers: dict[str, list[tuple[PluginInfo, PoolSpec]]] = {}
    for info, specs in loads.loaded:
        for spec in specs:
            verdict = validate_spec(spec)
            valid = spec if isinstance(spec, PoolSpec) else None
            pool_name = valid.name if valid is not None else None
            if isinstance(verdict, str):
                registry.rejected.append(Rejection(info, verdict, pool_name, spec=valid))
            elif verdict:
                registry.rejected.append(
                    Rejection(
                        info, f"contract drift: {_summary(verdict)}", pool_name, verdict, valid
                    )
                )
            else:
                assert valid is not None
                providers.setdefault(valid.name, []).append((info, valid))

    for pool_name, offers in providers.items():
        if len(offers) == 1:
            info, spec = offers[0]
            registry.accepted[pool_name] = AcceptedPool(spec, info)
            continue
        owners = ", ".join(
            f"{i.name} from {i.distribution or 'no distribution'}" for i, _ in offers
        )
        for info, spec in offers:
            registry.rejected.append(
                Rejection(
                    info,
                    f"duplicate pool name {pool_name!r}, provided by: {owners}",
                    pool_name,
                    spec=spec,
                )
            )

    if strict:
        rejected = list(registry.rejected)
        for pool_name in registry.names():
            entry = registry.accepted[pool_name]
            if entry.warnings:
                rejected.append(
                    Rejection(
                        entry.plugin,
                        f"source findings (strict): {_summary(entry.warnings)}",
                        pool_name,
                        entry.warnings,
                        entry.spec,
                    )
                )
        if rejected:
            raise PluginRejectedError(list(rejected))
    return registry


def _summary(findings: Sequence[Finding]) -> str:
    text = "; ".join(str(f) for f in findings[:3])
    return text + (f" (+{len(findings) - 3} more)" if len(findings) > 3 else "")
