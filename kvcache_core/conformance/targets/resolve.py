"""Turn what a user typed after ``kvcache check`` into class targets.

A target is one of:

* a path: anything containing ``/``, ending in ``.py``, or naming an existing directory
  (``.`` included): every top-level class defined in its files is a target;
* ``module:Class`` (``pkg.mod:Outer.Inner`` works for the runtime level);
* otherwise the name of an installed plugin (an entry point of ``kvcache.pools``), or of a
  pool that an installed plugin declares (its ``PoolSpec.name``).

Paths and ``module:Class`` are checked against ``--against`` when given, else against what
``infer`` says the class claims; plugins always against what their spec declares, because that
is what an engine relies on (``--against`` adds Protocols to a plugin's classes, by role; it
never replaces the declared ones). Nothing here imports a target: plugins are imported (discovery
would import them too), files and modules are only located and parsed. When only the source
level runs, a plugin whose hook is a plain list of ``PoolSpec(...)`` is read instead of imported
(``plugin_source``), with the same targets.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import replace

from ..members.infer import infer_protocols
from ..members.methods import PROTOCOL_ORDER
from ..members.sources import ClassSource, SourceIndex, module_name_for, python_files
from ..results.model import CheckResult, unparsable_file
from ..results.usage import UsageError
from .target import ClassTarget

__all__ = ["UsageError", "is_path", "parse_protocols", "resolve_targets"]


def is_path(text: str) -> bool:
    return "/" in text or text.endswith(".py") or text in (".", "..") or os.path.isdir(text)


def parse_protocols(values: Sequence[str] | None) -> tuple[str, ...] | None:
    """``--against KVPool,OffloadablePool`` (repeatable) -> names, validated."""
    if not values:
        return None
    names = [n.strip() for v in values for n in v.split(",") if n.strip()]
    unknown = [n for n in names if n not in PROTOCOL_ORDER]
    if unknown:
        raise UsageError(
            f"unknown protocol {', '.join(map(repr, unknown))}; known: {', '.join(PROTOCOL_ORDER)}"
        )
    return tuple(dict.fromkeys(names))


def _class_target(
    cls: ClassSource, protocols: tuple[str, ...], *, module: str | None = None
) -> ClassTarget:
    return ClassTarget(
        name=cls.qualname,
        class_name=cls.name,
        protocols=protocols,
        path=cls.path,
        module=module or cls.module.name,
    )


def _parse_error(path: str, exc: Exception) -> CheckResult:
    return unparsable_file(path, exc, "source")


def _from_path(
    spec: str, against: tuple[str, ...] | None, index: SourceIndex
) -> tuple[list[ClassTarget], list[CheckResult]]:
    if not os.path.exists(spec):
        raise UsageError(f"no such file or directory: {spec}")
    files = python_files(spec)
    # Every import root first: inference below resolves bases across all the given files.
    for path in files:
        index.add_root(module_name_for(path)[1])
    targets: list[ClassTarget] = []
    errors: list[CheckResult] = []
    for path in files:
        try:
            module = index.load_file(path)
        except (OSError, SyntaxError, UnicodeDecodeError, ValueError) as exc:
            errors.append(_parse_error(path, exc))
            continue
        for cls in module.classes.values():
            protocols = against if against is not None else infer_protocols(index, cls)
            if protocols and not cls.is_protocol:
                targets.append(_class_target(cls, protocols))
    return targets, errors


def _from_class(spec: str, against: tuple[str, ...] | None, index: SourceIndex) -> ClassTarget:
    module_name, _, class_name = spec.partition(":")
    if not module_name or not class_name:
        raise UsageError(f"{spec!r}: expected module:Class")
    module = index.module(module_name)
    cls = module.classes.get(class_name) if module is not None else None
    if cls is not None:
        protocols = against if against is not None else infer_protocols(index, cls)
        if not protocols:
            raise UsageError(
                f"{spec}: cannot tell which protocols {class_name} should satisfy "
                "(it defines no contract method); pass --against PROTOCOL"
            )
        return _class_target(cls, protocols, module=module_name)
    if against is None:
        raise UsageError(
            f"{spec}: no source found to infer its protocols from; pass --against PROTOCOL"
        )
    return ClassTarget(
        name=f"{module_name}.{class_name}",
        class_name=class_name,
        protocols=against,
        path=module.path if module is not None and "." not in class_name else None,
        module=module_name,
    )


def _merge(targets: list[ClassTarget]) -> list[ClassTarget]:
    """One target per class: the same allocator class serves several specs."""
    merged: dict[str, ClassTarget] = {}
    for t in targets:
        known = merged.get(t.name)
        if known is None:
            merged[t.name] = t
        else:
            protocols = tuple(dict.fromkeys(known.protocols + t.protocols))
            merged[t.name] = ClassTarget(
                known.name,
                known.class_name,
                protocols,
                known.path,
                known.module,
                known.plugin,
                known.pool,
                tuple(dict.fromkeys(known.serves + t.serves)),
            )
    return list(merged.values())


def resolve_targets(
    specs: Sequence[str],
    *,
    against: tuple[str, ...] | None,
    index: SourceIndex,
    read_plugins: bool = False,
) -> tuple[list[ClassTarget], list[CheckResult]]:
    """Targets named by ``specs`` (all installed plugins when empty), and load errors.

    With ``read_plugins`` (only the source level runs), plugins are read from source where
    their hook allows it (``plugin_source``) and imported only where it does not.
    """
    targets: list[ClassTarget] = []
    errors: list[CheckResult] = []
    plugins: list[str] = []
    for spec in specs:
        if is_path(spec):
            found, failed = _from_path(spec, against, index)
            targets += found
            errors += failed
        elif ":" in spec:
            targets.append(_from_class(spec, against, index))
        else:
            plugins.append(spec)
    if plugins or not specs:
        # Here, not at module level: plugins are imported to read their specs (and they import
        # torch); path and module:Class targets are only read, so they never pay for it, and
        # neither does a plugin the source level can read (``plugin_source``).
        try:
            if read_plugins:
                from .plugins import source_plugin_targets

                found, failed = source_plugin_targets(plugins or None)
            else:
                from .plugins import plugin_targets

                found, failed = plugin_targets(plugins or None)
        except LookupError as exc:
            raise UsageError(str(exc)) from None
        if against is not None:
            found = [_also_against(t, against) for t in found]
        targets += found
        errors += failed
    return _merge(targets), errors


#: Protocols an allocator class is held to; every other contract Protocol is a pool's.
_ALLOCATOR_PROTOCOLS = frozenset(
    {"TokenAllocator", "PagedAllocator", "SWAAllocator", "MambaSlotAllocator"}
)


def _also_against(target: ClassTarget, against: tuple[str, ...]) -> ClassTarget:
    """A plugin's class checked against ``--against`` *as well as* what its spec declares.

    Each Protocol goes to the class of its role (allocator Protocols to the allocator class,
    the others to the pool class): the spec's declaration is what discovery holds the plugin
    to, so it is never dropped; ``--against`` asks for more (a capability the author means to
    declare next, say).
    """
    allocator = "TokenAllocator" in target.protocols
    extra = [p for p in against if (p in _ALLOCATOR_PROTOCOLS) == allocator]
    protocols = tuple(dict.fromkeys([*target.protocols, *extra]))
    return replace(target, protocols=protocols) if protocols != target.protocols else target
