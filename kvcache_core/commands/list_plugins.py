"""``kvcache list``: every discovered plugin, accepted or rejected, and why."""

from __future__ import annotations

import argparse
import json
from typing import Any

from ..contracts.spec import CONTRACT_VERSION
from ..discovery import Registry, discover


def register(sub: Any) -> None:
    parser: argparse.ArgumentParser = sub.add_parser(
        "list", help="list discovered pool plugins and whether they were accepted"
    )
    parser.add_argument("--format", choices=("text", "json"), default="text")
    parser.set_defaults(run=run)


def rows(registry: Registry) -> list[dict[str, object]]:
    """One row per pool (accepted or rejected) and per plugin rejected or skipped as a whole."""
    out: list[dict[str, object]] = []
    for name in registry.names():
        entry = registry.accepted[name]
        out.append(
            {
                "pool": name,
                "plugin": entry.plugin.name,
                "distribution": entry.plugin.distribution,
                "version": entry.plugin.version,
                "contract_version": entry.spec.contract_version,
                "capabilities": sorted(str(c) for c in entry.spec.capabilities),
                "status": "accepted",
                "reason": None,
                "description": entry.spec.description,
            }
        )
    for rej in registry.rejected:
        out.append(
            {
                "pool": rej.pool,
                "plugin": rej.plugin.name,
                "distribution": rej.plugin.distribution,
                "version": rej.plugin.version,
                "contract_version": None,
                "capabilities": [],
                "status": "rejected",
                "reason": rej.reason,
                "findings": [
                    {"rule": f.rule, "method": f.method, "parameter": f.parameter, "hint": f.hint}
                    for f in rej.findings
                ],
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


def run(args: argparse.Namespace) -> int:
    registry = discover()
    table = rows(registry)
    if args.format == "json":
        print(json.dumps({"contract_version": CONTRACT_VERSION, "plugins": table}, indent=2))
    else:
        print(
            f"kvcache contract {CONTRACT_VERSION}: {len(registry.accepted)} pool(s) accepted, "
            f"{len(registry.rejected)} rejected, {len(registry.skipped)} skipped"
        )
        for row in table:
            dist = f"{row['distribution']} {row['version']}" if row["distribution"] else "-"
            caps = ",".join(row["capabilities"]) or "-"  # type: ignore[arg-type]
            contract = row["contract_version"] or "-"
            print(
                f"  {row['status']:<8} {row['pool'] or '-':<10} plugin={row['plugin']} "
                f"dist={dist} contract={contract} capabilities={caps}"
            )
            if row["reason"]:
                print(f"           reason: {row['reason']}")
    return 1 if registry.rejected else 0
