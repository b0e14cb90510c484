"""``kvcache check --store URL``: the store battery on a snapshot store plugin.

Each URL is opened with the installed store plugin its scheme names and every check of
[`kvcache_core.stores.battery`][kvcache_core.stores.battery] runs against it (the ``outage``
check is skipped: it needs a server the command may stop). The results are the checker's
standard results (target ``store:URL``, check ``store/<id>``, rule ``store-check-failed``), so
every ``--format`` works and ``[tool.kvcache]`` suppressions apply as for pools. ``--select``
and ``--deselect`` take store check ids (``overwrite`` or ``store/overwrite``); a check not
selected does not run, and ``store-check-failed`` stands for every check.
Exit codes: 0 every check passed or was skipped, 1 a check failed, 2 a URL no store opens.
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence

__all__ = ["run", "selected_store_checks"]

_PREFIX = "store/"


def selected_store_checks(
    select: Sequence[str] | None, deselect: Sequence[str] | None
) -> list[str]:
    """The store checks ``--select``/``--deselect`` leave, in battery order.

    :raises UsageError: An id that is neither a store check nor ``store-check-failed`` (so a
        typo cannot silently run nothing), or a ``--select`` that names nothing.
    """
    from ..conformance.results.usage import UsageError
    from ..stores.battery import STORE_CHECKS
    from ..stores.report import STORE_RULE

    def ids(values: Sequence[str] | None) -> list[str]:
        names = (n.strip() for v in values or () for n in v.split(","))
        return [n.removeprefix(_PREFIX) for n in names if n]

    chosen, removed = ids(select), ids(deselect)
    if select is not None and not chosen:
        raise UsageError("--select names no store check")
    unknown = [n for n in [*chosen, *removed] if n not in STORE_CHECKS and n != STORE_RULE]
    if unknown:
        raise UsageError(
            f"unknown store check id {', '.join(map(repr, unknown))}; store checks: "
            f"{', '.join(STORE_CHECKS)} (or the rule {STORE_RULE} for all of them)"
        )
    every = select is None or STORE_RULE in chosen
    return [
        c
        for c in STORE_CHECKS
        if (every or c in chosen) and c not in removed and STORE_RULE not in removed
    ]


def run(args: argparse.Namespace) -> int:
    """Run the battery on every ``--store`` URL and report in ``args.format``."""
    from ..conformance.results.usage import UsageError
    from ..errors import StoreError
    from ..stores import discover_stores
    from ..stores.battery import run_store_battery
    from ..stores.redact import redact_text, redact_url
    from ..stores.report import STORE_RULE, store_check_results
    from ._output import finish, load_config, usage_error

    registry = discover_stores()
    for url in args.store:
        try:
            registry.spec_for(url)
        except StoreError as exc:
            return usage_error("check", redact_text(f"--store {redact_url(url)}: {exc}", url))
    try:
        checks = selected_store_checks(args.select, args.deselect)
        configured = load_config(args)
    except UsageError as exc:
        return usage_error("check", str(exc))
    battery = [  # (run_store_battery takes an empty ``checks`` for every check)
        r
        for url in args.store
        if checks
        for r in run_store_battery(url, checks=checks, registry=registry)
    ]
    results = store_check_results(battery, registry)
    return finish(args, results, configured=configured, scanned=(), active_rules={STORE_RULE})
