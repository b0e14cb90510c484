"""``kvcache check --store URL``: the store battery on a snapshot store plugin.

Each URL is opened with the installed store plugin its scheme names and every check of
[`kvcache_core.stores.battery`][kvcache_core.stores.battery] runs against it (the ``outage``
check is skipped: it needs a server the command may stop). Text or JSON (``--format json``).
Exit codes: 0 every check passed or was skipped, 1 a check failed, 2 a URL no store opens.
"""

from __future__ import annotations

import argparse
import json
import sys

__all__ = ["run"]


def run(args: argparse.Namespace) -> int:
    """Run the battery on every ``--store`` URL and report."""
    from ..errors import StoreError
    from ..stores import discover_stores
    from ..stores.battery import run_store_battery

    registry = discover_stores()
    for url in args.store:
        try:
            registry.spec_for(url)
        except StoreError as exc:
            print(f"kvcache check: error: --store {url}: {exc}", file=sys.stderr)
            return 2
    results = [r for url in args.store for r in run_store_battery(url, registry=registry)]
    failed = [r for r in results if r.status == "failed"]
    if args.format == "json":
        doc = {
            "stores": args.store,
            "results": [
                {"check": r.check, "url": r.url, "status": r.status, "message": r.message}
                for r in results
            ],
            "ok": not failed,
        }
        text = json.dumps(doc, indent=2) + "\n"
    else:
        lines = [
            f"{r.status.upper():<8} store/{r.check} [{r.url}]"
            + (f": {r.message}" if r.message else "")
            for r in results
        ]
        lines.append(f"{len(failed)} failed, {len(results) - len(failed)} passed or skipped")
        text = "\n".join(lines) + "\n"
    if args.output:
        with open(args.output, "w", encoding="utf-8") as f:
            f.write(text)
    else:
        sys.stdout.write(text)
    return 1 if failed else 0
