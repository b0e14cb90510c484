"""``kvcache list``: every discovered plugin, accepted or rejected, and why: pool plugins
first, then snapshot-store plugins (the ``kvcache.stores`` group) with the URL schemes each
opens."""

from __future__ import annotations

import argparse
import json
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from ..conformance.reporting.render.jsonout import finding_to_json as finding_json
from ..contracts.history import CONTRACT_VERSION

if TYPE_CHECKING:  # both import torch: only `run` needs them
    from ..contracts.spec import PoolSpec
    from ..discovery import Registry
    from ..stores.discovery import StoreRegistry


def register(sub: Any) -> None:
    parser: argparse.ArgumentParser = sub.add_parser(
        "list",
        help="list discovered pool and snapshot-store plugins and whether they were accepted",
    )
    parser.add_argument("--format", choices=("text", "json"), default="text")
    parser.set_defaults(run=run)


def _spec_fields(spec: PoolSpec | None) -> dict[str, object]:
    if spec is None:
        return {"contract_version": None, "capabilities": []}
    return {
        "contract_version": spec.contract_version,
        "capabilities": sorted(str(c) for c in spec.capabilities),
    }


def rows(registry: Registry) -> list[dict[str, object]]:
    """One row per pool (accepted or rejected) and per plugin rejected or skipped as a whole.

    Accepted pools carry their source findings: ``warnings`` (the checker's body rules) and
    ``notes`` (methods whose source could not be analysed).
    """
    out: list[dict[str, object]] = []
    for name in registry.names():
        entry = registry.accepted[name]
        out.append(
            {
                "pool": name,
                "plugin": entry.plugin.name,
                "distribution": entry.plugin.distribution,
                "version": entry.plugin.version,
                **_spec_fields(entry.spec),
                "status": "accepted",
                "reason": None,
                "description": entry.spec.description,
                "warnings": [finding_json(f) for f in entry.warnings],
                "notes": [finding_json(f) for f in entry.notes],
            }
        )
    for rej in registry.rejected:
        out.append(
            {
                "pool": rej.pool,
                "plugin": rej.plugin.name,
                "distribution": rej.plugin.distribution,
                "version": rej.plugin.version,
                **_spec_fields(rej.spec),
                "status": "rejected",
                "reason": rej.reason,
                "findings": [finding_json(f) for f in rej.findings],
            }
        )
    for info, why in registry.skipped:
        out.append(
            {
                "pool": None,
                "plugin": info.name,
                "distribution": info.distribution,
                "version": info.version,
                "contract_version": None,
                "capabilities": [],
                "status": "skipped",
                "reason": why,
            }
        )
    return out


def _dist_version(distribution: str | None) -> str | None:
    if distribution is None:
        return None
    from importlib import metadata

    try:
        return metadata.version(distribution)
    except metadata.PackageNotFoundError:
        return None


def store_rows(registry: StoreRegistry) -> list[dict[str, object]]:
    """One row per snapshot store (accepted or rejected) and per store plugin rejected or
    skipped as a whole; accepted stores carry their URL schemes and what the battery needs to
    know of them (``shared``, ``supports_ttl``, ``example_url``)."""
    out: list[dict[str, object]] = []
    for name in registry.names():
        entry = registry.accepted[name]
        spec = entry.spec
        out.append(
            {
                "store": name,
                "plugin": entry.plugin.name,
                "distribution": entry.plugin.distribution,
                "version": _dist_version(entry.plugin.distribution),
                "schemes": list(spec.schemes),
                "status": "accepted",
                "reason": None,
                "description": spec.description,
                "shared": spec.shared,
                "supports_ttl": spec.supports_ttl,
                "example_url": spec.example_url,
            }
        )
    for rej in registry.rejected:
        out.append(
            {
                "store": rej.store,
                "plugin": rej.plugin.name,
                "distribution": rej.plugin.distribution,
                "version": _dist_version(rej.plugin.distribution),
                "schemes": [],
                "status": "rejected",
                "reason": rej.reason,
            }
        )
    for info, why in registry.skipped:
        out.append(
            {
                "store": None,
                "plugin": info.name,
                "distribution": info.distribution,
                "version": _dist_version(info.distribution),
                "schemes": [],
                "status": "skipped",
                "reason": why,
            }
        )
    return out


def _line(kind: str, finding: dict[str, object]) -> str:
    where = finding.get("impl_location")
    at = ""
    if isinstance(where, dict):
        line = where.get("line")
        at = f" ({where['path']}{'' if line is None else f':{line}'})"
    return f"           {kind}: [{finding['rule']}] {finding['message']}{at}"


def run(args: argparse.Namespace) -> int:
    from ..discovery import discover
    from ..stores.discovery import discover_stores

    registry = discover()
    table = rows(registry)
    stores = discover_stores()
    store_table = store_rows(stores)
    if args.format == "json":
        print(
            json.dumps(
                {"contract_version": CONTRACT_VERSION, "plugins": table, "stores": store_table},
                indent=2,
            )
        )
    else:
        warned = sum(1 for row in table if row.get("warnings"))
        print(
            f"kvcache contract {CONTRACT_VERSION}: {len(registry.accepted)} pool(s) accepted "
            f"({warned} with warnings), {len(registry.rejected)} rejected, "
            f"{len(registry.skipped)} skipped"
        )
        width = _name_width(row["pool"] for row in table)
        for row in table:
            dist = f"{row['distribution']} {row['version']}" if row["distribution"] else "-"
            caps = ",".join(row["capabilities"]) or "-"  # type: ignore[arg-type]
            contract = row["contract_version"] or "-"
            print(
                f"  {row['status']:<8} {row['pool'] or '-':<{width}} plugin={row['plugin']} "
                f"dist={dist} contract={contract} capabilities={caps}"
            )
            if row["reason"]:
                print(f"           reason: {row['reason']}")
            for kind in ("warning", "note"):
                for finding in row.get(f"{kind}s", ()):  # type: ignore[attr-defined]
                    print(_line(kind, finding))
        _print_stores(stores, store_table)
    return 1 if registry.rejected or stores.rejected else 0


def _name_width(names: Iterable[object]) -> int:
    """The name column's width: 10, or the longest name (``redis-cluster``) so columns align."""
    return max([10, *(len(str(name or "-")) for name in names)])


def _print_stores(stores: StoreRegistry, table: list[dict[str, object]]) -> None:
    print(
        f"snapshot stores: {len(stores.accepted)} accepted, {len(stores.rejected)} rejected, "
        f"{len(stores.skipped)} skipped"
    )
    width = _name_width(row["store"] for row in table)
    for row in table:
        dist = f"{row['distribution']} {row['version'] or '?'}" if row["distribution"] else "-"
        schemes = ",".join(f"{s}:" for s in row["schemes"]) or "-"  # type: ignore[attr-defined]
        print(
            f"  {row['status']:<8} {row['store'] or '-':<{width}} plugin={row['plugin']} "
            f"dist={dist} schemes={schemes}"
        )
        if row["reason"]:
            print(f"           reason: {row['reason']}")
