"""Loading plugins by entry point, each in isolation: what pool discovery, store discovery and
the checker share.

Why one module: the three once had a loader each, with slightly different answers to the same
questions (which distribution ships a plugin, how an exception is summarised, what a hook that
returns junk is told). Here each question has one answer:

- the entry-point groups are named once (`POOL_ENTRY_POINT_GROUP`, `STORE_ENTRY_POINT_GROUP`);
- an exception becomes one line, with where it was raised (`summarise_exception`);
- `load_plugins` imports each entry point alone, registers it with a pluggy ``PluginManager``,
  calls its hook alone and returns what every plugin's hook returned, plus each refused plugin
  with a one-line reason. Whatever a plugin does wrong (even ``sys.exit()`` at import) refuses
  that plugin only.

What the results *mean* (a ``PoolSpec``, a ``StoreSpec``) is the caller's business: this module
imports neither torch nor (until a plugin is loaded) pluggy, so store workers and the checker's
source level can use it for free.
"""

from __future__ import annotations

import os
import traceback
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from importlib import metadata
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # pluggy is imported when a plugin is loaded, not with this module
    import pluggy

__all__ = [
    "POOL_ENTRY_POINT_GROUP",
    "STORE_ENTRY_POINT_GROUP",
    "LoadReport",
    "PluginInfo",
    "describe_value",
    "entry_points",
    "load_plugins",
    "names_from_env",
    "plugin_info",
    "skip_policy",
    "summarise_exception",
]

POOL_ENTRY_POINT_GROUP = "kvcache.pools"
"""The entry-point group every pool plugin registers under (hook ``kvcache_pool_specs``)."""

STORE_ENTRY_POINT_GROUP = "kvcache.stores"
"""The entry-point group every snapshot-store plugin registers under (hook
``kvcache_store_specs``)."""


def summarise_exception(exc: BaseException) -> str:
    """``Type: message at file:line``: one line saying what was raised and where (the
    innermost frame), for a rejection reason or a load error."""
    frames = traceback.extract_tb(exc.__traceback__)
    where = f" at {frames[-1].filename}:{frames[-1].lineno}" if frames else ""
    return f"{type(exc).__name__}: {exc}{where}"


def describe_value(value: object) -> str:
    """``int 5``, ``NoneType None``: a value's type and a short repr, for a reason."""
    text = repr(value)
    if len(text) > 60:
        text = text[:57] + "..."
    return f"{type(value).__name__} {text}"


def names_from_env(var: str) -> set[str] | None:
    """The comma-separated names in ``$var`` (blanks dropped); None when it is unset."""
    raw = os.environ.get(var)
    if raw is None:
        return None
    return {n.strip() for n in raw.split(",") if n.strip()}


def skip_policy(
    allow: Iterable[str] | None,
    deny: Iterable[str] | None,
    *,
    env_allow: str,
    env_deny: str,
    autoload: bool = True,
) -> Callable[[str], str | None]:
    """The ``skip`` of `load_plugins` that pool and store discovery both apply: ``deny``
    first, then ``allow`` (each defaulting to the comma-separated names in its environment
    variable; no allow list means every name), then ``autoload`` (off: only names allowed
    explicitly load)."""
    allowed = set(allow) if allow is not None else names_from_env(env_allow)
    denied = set(deny) if deny is not None else (names_from_env(env_deny) or set())

    def skip(name: str) -> str | None:
        if name in denied:
            return "disabled by deny list"
        if allowed is not None and name not in allowed:
            return "not in allow list"
        if not autoload and allowed is None:
            return "autoload disabled"
        return None

    return skip


@dataclass(frozen=True)
class PluginInfo:
    """One entry point: its name, what it points at, and the distribution that ships it."""

    name: str
    """The entry point's name (for a plugin object passed directly: its ``__name__``)."""
    value: str
    """What it points at (``module:attr``), so a failed import can be traced to its target."""
    distribution: str | None = None
    """The installed distribution that ships it; None for a plugin object passed directly."""
    version: str | None = None
    """That distribution's version."""

    def __str__(self) -> str:
        """The name and distribution, as rejection messages name the plugin."""
        dist = f"{self.distribution} {self.version}" if self.distribution else "no distribution"
        return f"{self.name} ({dist})"


@dataclass
class LoadReport:
    """What `load_plugins` found, in load order."""

    loaded: list[tuple[PluginInfo, list[object]]] = field(default_factory=list)
    """Each plugin whose hook ran, with everything its hook returned (not yet validated)."""
    rejected: list[tuple[PluginInfo, str]] = field(default_factory=list)
    """Each plugin that failed to import, register or answer its hook, with why in one line:
    import failures first, then hook failures."""
    skipped: list[tuple[PluginInfo, str]] = field(default_factory=list)
    """Each entry point the ``skip`` policy passed over, with its reason."""


def entry_points(group: str) -> list[metadata.EntryPoint]:
    """The installed entry points of ``group``, sorted by name (so every report is in the
    same order on every machine)."""
    return sorted(metadata.entry_points(group=group), key=lambda ep: ep.name)


def _owner(
    ep: metadata.EntryPoint, cache: dict[object, tuple[str, str] | None]
) -> tuple[str, str] | None:
    """(name, version) of the distribution that ships ``ep``; None if unknown or unreadable."""
    dist = getattr(ep, "dist", None)
    if dist is None:
        return None
    key = getattr(dist, "_path", dist)
    if key not in cache:
        try:
            meta = dist.metadata
            cache[key] = (meta["Name"], meta["Version"])
        except Exception:  # broken METADATA: the plugin still loads, just unattributed
            cache[key] = None
    return cache[key]


def plugin_info(
    ep: metadata.EntryPoint, cache: dict[object, tuple[str, str] | None] | None = None
) -> PluginInfo:
    """The `PluginInfo` of ``ep`` (``cache`` keeps
    one METADATA parse per distribution across calls)."""
    return PluginInfo(ep.name, ep.value, *(_owner(ep, {} if cache is None else cache) or ()))


def _call_hook(
    pm: pluggy.PluginManager, info: PluginInfo, obj: object, hook: str, bare: type | None
) -> tuple[list[object], str | None]:
    """Register one plugin object and call its hook alone; what it returned, or why not.

    Never raises (``KeyboardInterrupt`` aside): whatever a plugin does, even ``sys.exit()``,
    refuses that plugin only.
    """
    try:
        pm.register(obj, name=info.name)
    except KeyboardInterrupt:
        raise
    except BaseException as exc:  # pluggy's validation of the hookimpl, or a bad object
        return [], f"could not register with pluggy: {summarise_exception(exc)}"
    impls = [i for i in getattr(pm.hook, hook).get_hookimpls() if i.plugin_name == info.name]
    if not impls:
        if callable(getattr(obj, hook, None)):
            return [], f"defines {hook}() without the @hookimpl marker"
        return [], f"implements no {hook}() hook"
    results: list[object] = []
    for impl in impls:
        try:
            result = impl.function()
        except KeyboardInterrupt:
            raise
        except BaseException as exc:
            return [], f"{hook}() raised {summarise_exception(exc)}"
        if bare is not None and isinstance(result, bare):
            name = getattr(result, "name", None)
            return [], (
                f"{hook}() returned a bare {bare.__name__} ({name!r}), expected a list of "
                f"{bare.__name__}: return [spec]"
            )
        if not isinstance(result, (list, tuple)):
            return [], f"{hook}() returned {describe_value(result)}, expected a list"
        results.extend(result)
    return results, None


def load_plugins(
    eps: Iterable[metadata.EntryPoint],
    *,
    hook: str,
    skip: Callable[[str], str | None] | None = None,
    plugins: Sequence[object] = (),
    bare: type | None = None,
) -> LoadReport:
    """Import each entry point alone, register it with one pluggy ``PluginManager`` of
    kvcache's hooks, call its ``hook`` alone; never raises for a plugin's fault.

    :param eps: The entry points to load (usually ``entry_points(group)``).
    :param hook: The hook to call: ``kvcache_pool_specs`` or ``kvcache_store_specs``.
    :param skip: Called with each entry point's name before it is imported: a reason to pass
        over it (an allow or deny list), or None to load it.
    :param plugins: Plugin objects (modules) registered directly, after the entry points.
    :param bare: The spec type a hook might return unwrapped, to be told to return a list.
    :returns: The `LoadReport`.
    """
    import pluggy

    from . import hookspecs

    report = LoadReport()
    candidates: list[tuple[PluginInfo, object]] = []
    dists: dict[object, tuple[str, str] | None] = {}  # one METADATA parse per distribution
    for ep in eps:
        info = plugin_info(ep, dists)
        why = skip(ep.name) if skip is not None else None
        if why is not None:
            report.skipped.append((info, why))
            continue
        try:
            candidates.append((info, ep.load()))
        except KeyboardInterrupt:
            raise
        except BaseException as exc:  # a plugin's import may raise anything, even SystemExit
            report.rejected.append((info, f"import failed: {summarise_exception(exc)}"))
    for obj in plugins:
        name = getattr(obj, "__name__", type(obj).__name__)
        candidates.append((PluginInfo(name, name), obj))

    pm = pluggy.PluginManager(hookspecs.PROJECT_NAME)
    pm.add_hookspecs(hookspecs)
    for info, obj in candidates:
        results, reason = _call_hook(pm, info, obj, hook, bare)
        if reason is None:
            report.loaded.append((info, results))
        else:
            report.rejected.append((info, reason))
    return report
