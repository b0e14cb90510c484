"""Store-battery results as the checker's standard results, so ``kvcache check --store URL``
reports in every format ``kvcache check`` has (text, JSON, JUnit, SARIF, GitHub annotations).

Why convert rather than render on our own: CI reads one report shape from ``kvcache check``,
whatever was checked, and every renderer already knows it. A store check is one
``CheckResult`` of the checker's model: target ``store:<URL>``, check
``store/<check-id>``; a failure carries one ``store-check-failed`` finding located at the store
class (so SARIF and GitHub annotations point at the plugin's code), a skip its reason.
"""

from __future__ import annotations

import inspect
from collections.abc import Sequence

from ..conformance.results.model import CheckResult, Finding, Location, Outcome
from .battery import StoreCheckResult
from .discovery import StoreRegistry

__all__ = ["STORE_RULE", "store_check_results"]

STORE_RULE = "store-check-failed"
"""The rule id of every store-battery failure (one rule: the check id tells them apart)."""

_OUTCOMES = {"passed": Outcome.PASSED, "failed": Outcome.FAILED, "skipped": Outcome.SKIPPED}


def _class_location(cls: type) -> Location | None:
    """Where ``cls`` is defined, or None when its source cannot be found (a C class, a class
    made at run time)."""
    try:
        path = inspect.getsourcefile(cls)
        _, line = inspect.getsourcelines(cls)
    except (OSError, TypeError):
        return None
    return None if path is None else Location(path, line or None)


def store_check_results(
    results: Sequence[StoreCheckResult], registry: StoreRegistry | None = None
) -> list[CheckResult]:
    """``results`` (from [`run_store_battery`][kvcache_core.stores.battery.run_store_battery])
    as standard check results, in order.

    :param registry: Where the stores were found; a failure is then located at the store class
        of the plugin that opened its URL (without one, or for a URL it does not open, the
        finding has no location).
    :raises ValueError: A result's status is not ``passed``, ``failed`` or ``skipped``.
    """
    out: list[CheckResult] = []
    for result in results:
        if result.status not in _OUTCOMES:
            raise ValueError(f"unknown store check status {result.status!r} ({result})")
        target = f"store:{result.url}"
        check = f"store/{result.check}"
        outcome = _OUTCOMES[result.status]
        if outcome is not Outcome.FAILED:
            detail = result.message if outcome is Outcome.SKIPPED else ""
            seconds = result.seconds
            out.append(CheckResult(target, check, outcome, detail=detail, duration_s=seconds))
            continue
        location = None
        if registry is not None:
            try:
                location = _class_location(registry.spec_for(result.url).store_class)
            except Exception:  # a URL no store opens: the finding still says what failed
                location = None
        finding = Finding(
            rule=STORE_RULE,
            message=f"{check} on {result.url}: {result.message}",
            target=target,
            hint=(f"rerun it alone with `pytest --kvcache-store '{result.url}' -k {result.check}`"),
            impl_location=location,
        )
        out.append(CheckResult(target, check, outcome, (finding,), duration_s=result.seconds))
    return out
