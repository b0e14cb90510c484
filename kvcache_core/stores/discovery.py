"""``discover_stores()``: the snapshot stores installed by entry point, validated like pools.

Each entry point of the ``kvcache.stores`` group is loaded in isolation through pluggy (hook
``kvcache_store_specs``): a plugin that fails to import, raises from its hook, returns junk,
declares a class whose methods drift from [`SnapshotStore`][kvcache_core.stores.SnapshotStore]
or claims a name or URL scheme another plugin also claims is rejected with the reason, and the
others load. An engine then opens a store by URL through
[`StoreRegistry.open`][kvcache_core.stores.StoreRegistry.open], which picks the plugin by scheme.
"""

from __future__ import annotations

import inspect
from collections.abc import Sequence
from dataclasses import dataclass, field
from types import ModuleType

from ..errors import PluginRejectedError, StoreError
from ..plugin_loader import (
    STORE_ENTRY_POINT_GROUP,
    PluginInfo,
    entry_points,
    load_plugins,
    skip_policy,
)
from .spec import STORE_METHODS, SnapshotStore, StoreSpec

__all__ = [
    "AcceptedStore",
    "StoreRegistry",
    "StorePlugin",
    "StoreRejection",
    "discover_stores",
    "open_store",
    "store_drift",
]

ENV_ALLOW = "KVCACHE_STORES"
ENV_DENY = "KVCACHE_DISABLE_STORES"


@dataclass(frozen=True)
class StorePlugin:
    """One entry point of the ``kvcache.stores`` group (or a plugin object passed directly)."""

    name: str
    """The entry point's name, as rejections and ``kvcache list`` report it."""
    value: str
    """What it points at (``module:attr``), so a failed import can be traced to its target."""
    distribution: str | None = None
    """The installed distribution that ships it; None for a plugin object passed directly."""

    def __str__(self) -> str:
        """The name and distribution, as rejection messages name the plugin."""
        return f"{self.name} ({self.distribution or 'no distribution'})"


@dataclass(frozen=True)
class AcceptedStore:
    """A validated store kind and the plugin that provides it."""

    spec: StoreSpec
    """The validated spec: what [`StoreRegistry.open`][kvcache_core.stores.StoreRegistry.open]
    calls ``factory`` on."""
    plugin: StorePlugin
    """Where the store came from, for ``kvcache list`` and error reports."""


@dataclass(frozen=True)
class StoreRejection:
    """A store plugin (or one store of it) that discovery refused, and why, in one line.

    :param plugin: The entry point.
    :param reason: Why: an import error, a hook that raised, contract drift, a duplicate.
    :param store: The store's name when one store of the plugin was refused.
    """

    plugin: StorePlugin
    """The entry point."""
    reason: str
    """Why: an import error, a hook that raised, contract drift, a duplicate."""
    store: str | None = None
    """The store's name when one store of the plugin was refused; None for the plugin."""

    def __str__(self) -> str:
        """One line: which plugin (and store) and why, as ``kvcache list`` prints it."""
        what = (
            f"store {self.store!r} of plugin {self.plugin}"
            if self.store
            else f"plugin {self.plugin}"
        )
        return f"{what}: {self.reason}"


@dataclass
class StoreRegistry:
    """What [`discover_stores`][kvcache_core.stores.discover_stores] found.

    :param accepted: Validated stores by name.
    :param rejected: Every refusal, in discovery order.
    :param skipped: Plugins not loaded because of the allow or deny list, with why.
    """

    accepted: dict[str, AcceptedStore] = field(default_factory=dict)
    """Validated stores by name; the only ones ``open`` will build."""
    rejected: list[StoreRejection] = field(default_factory=list)
    """Every refusal, in discovery order, kept to report rather than raised so one broken
    plugin never stops the others from loading."""
    skipped: list[tuple[StorePlugin, str]] = field(default_factory=list)
    """Plugins not loaded because of the allow or deny list, with why."""

    def names(self) -> list[str]:
        """The accepted stores' names, sorted."""
        return sorted(self.accepted)

    def schemes(self) -> dict[str, str]:
        """URL scheme -> the accepted store that opens it."""
        return {s: n for n, a in self.accepted.items() for s in a.spec.schemes}

    def spec_for(self, url: str) -> StoreSpec:
        """The accepted spec that opens ``url`` (chosen by the scheme before the first ``:``).

        :raises StoreError: No accepted store opens that scheme; the message lists the schemes
            that are known and, when the store was rejected, why.
        """
        scheme = url.split(":", 1)[0] if ":" in url else ""
        owner = self.schemes().get(scheme)
        if owner is None:
            known = ", ".join(f"{s}:" for s in sorted(self.schemes())) or "none"
            why = next((f" ({r.reason})" for r in self.rejected if r.store == scheme), "")
            what = f"{scheme}:" if scheme else "a URL without a scheme"
            raise StoreError(f"no accepted snapshot store opens {what}{why}; known: {known}")
        return self.accepted[owner].spec

    def open(self, url: str) -> SnapshotStore:
        """Open the store ``url`` names (``memory:``, ``dir:PATH``, ``redis://HOST:PORT/DB``).

        :raises StoreError: Unknown scheme, a malformed URL, or a factory that returned
            something that is not a [`SnapshotStore`][kvcache_core.stores.SnapshotStore].
        """
        spec = self.spec_for(url)
        store = spec.factory(url)
        if not isinstance(store, SnapshotStore):
            raise StoreError(
                f"store {spec.name!r} returned a {type(store).__name__}, which lacks "
                f"SnapshotStore methods ({', '.join(STORE_METHODS)})"
            )
        return store


def store_drift(cls: object) -> str | None:
    """Why ``cls`` does not implement [`SnapshotStore`][kvcache_core.stores.SnapshotStore]
    (a missing method, a parameter missing or of another kind), or None when it does.

    The check is the one a caller needs: every call the Protocol allows must be accepted.
    Extra parameters are fine when they have defaults.
    """
    if not isinstance(cls, type):
        return f"store_class is {type(cls).__name__}, not a class"
    for name in STORE_METHODS:
        impl = getattr(cls, name, None)
        if not callable(impl):
            return f"{cls.__name__} has no method {name}()"
        want = inspect.signature(getattr(SnapshotStore, name))
        try:
            have = inspect.signature(impl)
        except (TypeError, ValueError):
            continue  # a builtin without a signature: nothing to compare
        params = dict(have.parameters)
        varargs = any(p.kind is p.VAR_POSITIONAL for p in params.values())
        varkw = any(p.kind is p.VAR_KEYWORD for p in params.values())
        for pname, param in want.parameters.items():
            if pname == "self":
                continue
            got = params.pop(pname, None)
            if got is None:
                if (param.kind is param.KEYWORD_ONLY and varkw) or (
                    param.kind is param.POSITIONAL_OR_KEYWORD and varargs and varkw
                ):
                    continue
                return f"{cls.__name__}.{name}() lacks parameter {pname!r}"
            if param.kind is param.KEYWORD_ONLY and got.kind not in (
                got.KEYWORD_ONLY,
                got.POSITIONAL_OR_KEYWORD,
            ):
                return f"{cls.__name__}.{name}() takes {pname!r} positionally only"
            if (
                param.kind is param.POSITIONAL_OR_KEYWORD
                and got.kind is not got.POSITIONAL_OR_KEYWORD
            ):
                return f"{cls.__name__}.{name}() takes {pname!r} as {got.kind.description}"
            if param.default is not param.empty and got.default is got.empty:
                return f"{cls.__name__}.{name}() makes {pname!r} required (it is optional)"
        params.pop("self", None)
        for extra in params.values():
            if (
                extra.kind not in (extra.VAR_POSITIONAL, extra.VAR_KEYWORD)
                and extra.default is extra.empty
            ):
                return f"{cls.__name__}.{name}() requires {extra.name!r}, which callers never pass"
    return None


def _spec_problem(spec: object) -> str | None:
    if not isinstance(spec, StoreSpec):
        return f"hook returned a {type(spec).__name__}, expected a StoreSpec"
    fields: dict[str, object] = vars(spec)  # plugins ignore annotations: check the values
    if not isinstance(fields["name"], str) or not fields["name"]:
        return "StoreSpec.name must be a non-empty string"
    schemes = fields["schemes"]
    if (
        not isinstance(schemes, tuple)
        or not schemes
        or not all(isinstance(s, str) and s for s in schemes)
    ):
        return "StoreSpec.schemes must be a non-empty tuple of non-empty strings"
    if not callable(fields["factory"]):
        return "StoreSpec.factory is not callable"
    drift = store_drift(spec.store_class)
    return f"contract drift: {drift}" if drift else None


def discover_stores(
    *,
    allow: Sequence[str] | None = None,
    deny: Sequence[str] | None = None,
    plugins: Sequence[ModuleType | object] = (),
    group: str = STORE_ENTRY_POINT_GROUP,
    strict: bool = False,
) -> StoreRegistry:
    """Load and validate every snapshot-store plugin; a broken one is rejected, never a crash.

    :param allow: Entry-point names to load, others skipped; default ``$KVCACHE_STORES``
        (comma-separated), or all when unset.
    :param deny: Entry-point names to skip; default ``$KVCACHE_DISABLE_STORES``.
    :param plugins: Extra plugin objects (modules) registered directly, e.g. in tests.
    :param group: The entry-point group to read.
    :param strict: Raise [`PluginRejectedError`][kvcache_core.PluginRejectedError] listing
        every rejection instead of isolating them.
    """
    skip = skip_policy(allow, deny, env_allow=ENV_ALLOW, env_deny=ENV_DENY)
    loads = load_plugins(
        entry_points(group), hook="kvcache_store_specs", skip=skip, plugins=plugins, bare=StoreSpec
    )

    def plugin(info: PluginInfo) -> StorePlugin:
        return StorePlugin(info.name, info.value, info.distribution)

    registry = StoreRegistry(skipped=[(plugin(info), why) for info, why in loads.skipped])
    registry.rejected += [StoreRejection(plugin(info), why) for info, why in loads.rejected]
    offers: list[tuple[StorePlugin, StoreSpec]] = []
    for loaded, specs in loads.loaded:
        info = plugin(loaded)
        for spec in specs:
            problem = _spec_problem(spec)
            if problem is not None:
                name = spec.name if isinstance(spec, StoreSpec) else None
                registry.rejected.append(StoreRejection(info, problem, name))
            else:
                assert isinstance(spec, StoreSpec)
                offers.append((info, spec))
    _accept_unique(registry, offers)
    if strict and registry.rejected:
        raise PluginRejectedError(list(registry.rejected))
    return registry


def _accept_unique(registry: StoreRegistry, offers: list[tuple[StorePlugin, StoreSpec]]) -> None:
    """Accept every offer whose name and schemes no other offer claims; reject all claimants."""
    claims: dict[str, list[StorePlugin]] = {}
    for info, spec in offers:
        for claim in {f"name {spec.name!r}", *(f"scheme {s}:" for s in spec.schemes)}:
            claims.setdefault(claim, []).append(info)
    for info, spec in offers:
        clash = sorted(
            c
            for c in {f"name {spec.name!r}", *(f"scheme {s}:" for s in spec.schemes)}
            if len(claims[c]) > 1
        )
        if clash:
            owners = ", ".join(str(p) for p in claims[clash[0]])
            registry.rejected.append(
                StoreRejection(info, f"duplicate {clash[0]}, claimed by: {owners}", spec.name)
            )
        else:
            registry.accepted[spec.name] = AcceptedStore(spec, info)


def open_store(url: str) -> SnapshotStore:
    """Discover the installed stores and open ``url`` with the one its scheme names."""
    return discover_stores().open(url)
