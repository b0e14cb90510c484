"""Run behaviour checks in isolation: one check's exception or hang fails that check only.

Each check runs in a fresh `CheckContext` on a worker thread joined with a timeout; a
check still running after it is reported as failed (a hang is a bug an engine would meet as a
stalled decode step) and left behind on its daemon thread. Expected failures are declared per
check with a reason; one that passes is reported too, so the list cannot rot.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterable, Mapping

from ...contracts.spec import PoolSpec
from ...plugin_loader import summarise_exception
from ..results.model import CheckResult, Finding, Outcome
from ._check import BATTERY, BehaviourCheck, BehaviourFailure
from ._context import DEFAULT_TIMEOUT_S, CheckContext, config_source, default_config
from ._report import end_in_assert, subject_location

__all__ = ["DEFAULT_TIMEOUT_S", "run_check", "run_spec", "select_checks"]


def select_checks(spec: PoolSpec, only: Iterable[str] | None = None) -> list[BehaviourCheck]:
    """The checks that apply to ``spec``'s declared capabilities (optionally only some ids)."""
    from . import checks  # noqa: F401  (registers the battery on first use)

    wanted = set(only) if only is not None else None
    if wanted is not None:
        unknown = wanted - set(BATTERY)
        if unknown:
            raise KeyError(
                f"unknown behaviour check(s) {sorted(unknown)}; known: {sorted(BATTERY)}"
            )
    return [
        c
        for c in BATTERY.values()
        if c.applies_to(spec.capabilities) and (wanted is None or c.id in wanted)
    ]


def _call(check: BehaviourCheck, context: CheckContext) -> BaseException | None:
    """Run the check on a daemon thread; return what it raised, or TimeoutError on a hang."""
    outcome: list[BaseException | None] = []

    def target() -> None:
        try:
            check.function(context)
        except BaseException as exc:  # a pool under test may raise anything
            outcome.append(exc)
        else:
            outcome.append(None)

    worker = threading.Thread(target=target, name=f"kvcache {check.name}", daemon=True)
    worker.start()
    worker.join(context.timeout_s)
    if worker.is_alive() or not outcome:
        return TimeoutError(f"did not finish within {context.timeout_s:g} s (a hang?)")
    return outcome[0]


def _rerun(check: BehaviourCheck, spec: PoolSpec) -> str:
    """A snippet that runs the check itself, unthreaded, on the same config.

    For a check that crashed inside the pool (rather than raising ``BehaviourFailure`` with its
    own minimal steps): re-running it shows the whole traceback, down to the pool's line.
    """
    return "\n".join(
        [
            "import torch",
            "from kvcache_core import PoolConfig",
            "from kvcache_core.conformance.behaviour import BATTERY, CheckContext, select_checks",
            "from kvcache_core.conformance.targets.plugins import installed_spec",
            "",
            f"spec = installed_spec({spec.name!r})  # as the plugin declares it, even if rejected",
            "select_checks(spec)  # registers the battery",
            f"config = {config_source(default_config(spec))}",
            f"BATTERY[{check.id!r}].function(CheckContext(spec, config))  # raises",
        ]
    )


def _finding(check: BehaviourCheck, spec: PoolSpec, exc: BaseException) -> Finding:
    if isinstance(exc, BehaviourFailure):
        message, hint = exc.message, exc.hint or check.hint
        repro = exc.reproduction or _rerun(check, spec)
    else:
        message = f"raised {summarise_exception(exc)}"
        hint, repro = check.hint, _rerun(check, spec)
    return Finding(
        rule="behaviour-failed",
        message=f"{check.name}: {message}",
        target=f"pool:{spec.name}",
        hint=hint,
        reproduction=end_in_assert(repro, f"{check.name} on pool {spec.name!r}: {message}"),
        impl_location=subject_location(check, spec),
    )


def run_check(
    spec: PoolSpec,
    check: BehaviourCheck,
    *,
    expected_failures: Mapping[str, str] | None = None,
    timeout_s: float = DEFAULT_TIMEOUT_S,
    seed: int = 0,
) -> CheckResult:
    """One check on one pool spec, as a result of the checker's one model."""
    xfail = dict(spec.expected_failures)
    xfail.update(expected_failures or {})
    context = CheckContext(spec, default_config(spec), seed=seed, timeout_s=timeout_s)
    start = time.perf_counter()
    exc = _call(check, context)
    took = time.perf_counter() - start
    target = f"pool:{spec.name}"
    reason = xfail.get(check.id)
    if exc is None and reason is None:
        return CheckResult(target, check.name, Outcome.PASSED, duration_s=took)
    if exc is None:
        finding = Finding(
            rule="behaviour-unexpected-pass",
            message=f"{check.name} passed but is declared an expected failure ({reason})",
            target=target,
            hint=f"remove {check.id!r} from the pool's expected failures",
            impl_location=subject_location(check, spec),
        )
        return CheckResult(target, check.name, Outcome.FAILED, (finding,), duration_s=took)
    finding = _finding(check, spec, exc)
    if reason is not None:
        return CheckResult(
            target,
            check.name,
            Outcome.EXPECTED_FAILURE,
            detail=reason,
            duration_s=took,
            extra={"finding": finding},
        )
    return CheckResult(target, check.name, Outcome.FAILED, (finding,), duration_s=took)


def run_spec(
    spec: PoolSpec,
    *,
    only: Iterable[str] | None = None,
    expected_failures: Mapping[str, str] | None = None,
    timeout_s: float = DEFAULT_TIMEOUT_S,
) -> list[CheckResult]:
    """The whole battery (or the checks ``only`` names) on one pool spec."""
    return [
        run_check(spec, check, expected_failures=expected_failures, timeout_s=timeout_s)
        for check in select_checks(spec, only)
    ]
