"""The behaviour level as the checker runs it: installed pools' specs through the battery.

Why only installed plugins: a check builds pools through the spec's own factory, and only a
plugin's ``PoolSpec`` says how to build one (config fields, allocator, capabilities). A bare
class (a path or ``module:Class`` target) has no factory, so it gets a SKIPPED result saying
so, which does not change the exit code: skipping is not a finding.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING

from ...contracts.spec import PoolSpec
from ..results.model import CheckResult, Outcome
from ..targets.plugins import plugin_specs
from ..targets.target import ClassTarget
from ._context import DEFAULT_TIMEOUT_S
from ._run import run_spec

if TYPE_CHECKING:
    from ..runner import LevelOptions

__all__ = ["NO_SPEC", "run", "run_level"]

NO_SPEC = (
    "needs an installed plugin's PoolSpec (the battery builds pools through the plugin's "
    "factory); check the plugin by name to run it"
)


def _pairs(targets: Sequence[ClassTarget]) -> list[tuple[str, str]]:
    pairs: list[tuple[str, str]] = []
    for t in targets:
        served = t.serves or (
            ((t.plugin, t.pool),) if t.plugin is not None and t.pool is not None else ()
        )
        pairs += served
    return list(dict.fromkeys(pairs))


def run(
    targets: Sequence[ClassTarget],
    *,
    expected_failures: Mapping[str, Mapping[str, str]] | None = None,
    timeout_s: float = DEFAULT_TIMEOUT_S,
    progress: Callable[[str], None] | None = None,
    only: Sequence[str] | None = None,
    **_: object,
) -> list[CheckResult]:
    """One result per (pool, check) for every pool the targets serve; SKIPPED for the rest.

    ``expected_failures`` maps a pool name to ``{check id: reason}`` (``[tool.kvcache]``), on
    top of what the spec itself declares. ``extra["pool_seconds"]`` on each pool's first result
    holds the wall time of that pool's whole battery (the text report shows it). ``only``
    (if given) names the only checks to run.
    """
    results: list[CheckResult] = [
        CheckResult(t.name, "behaviour", Outcome.SKIPPED, detail=NO_SPEC)
        for t in targets
        if not t.serves and (t.plugin is None or t.pool is None)
    ]
    specs: dict[str, dict[str, PoolSpec]] = {}
    pairs = list(_pairs(targets))
    for number, (plugin, pool) in enumerate(pairs, start=1):
        if progress is not None:
            progress(f"kvcache check: behaviour battery on pool {pool} ({number}/{len(pairs)})")
        if plugin not in specs:
            specs[plugin] = {s.name: s for s in plugin_specs(plugin)}
        spec = specs[plugin].get(pool)
        if spec is None:  # the plugin stopped declaring it between two loads: a load error
            results.append(
                CheckResult(
                    f"pool:{pool}",
                    "behaviour",
                    Outcome.ERROR,
                    detail=f"plugin {plugin!r} no longer returns a spec named {pool!r}",
                )
            )
            continue
        start = time.perf_counter()
        ran = run_spec(
            spec,
            only=only,
            expected_failures=(expected_failures or {}).get(pool),
            timeout_s=timeout_s,
        )
        took = time.perf_counter() - start
        if ran:
            ran[0].extra["pool_seconds"] = took
        results += ran
    return results


def run_level(targets: Sequence[ClassTarget], options: LevelOptions) -> list[CheckResult]:
    """The runner's entry: the project's expected failures, the progress line and the checks
    ``--select``/``--deselect`` leave."""
    return run(
        targets,
        expected_failures=options.expected_by_pool(),
        progress=options.progress,
        only=options.behaviour_checks,
    )
