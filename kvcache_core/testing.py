"""The behaviour battery inside a pool author's own pytest suite.

Two functions are the whole API, because a parametrized test is how pytest users already
spell "one test per case", and it composes with their fixtures, marks and ``-k``:

    import pytest
    from kvcache_core.testing import check_conformance, conformance_cases

    @pytest.mark.parametrize(("spec", "check_id"), conformance_cases("int8-mha"))
    def test_conformance(spec, check_id):
        check_conformance(spec, check_id)

* [`conformance_cases`][kvcache_core.testing.conformance_cases] turns pools (names of
  installed pools or plugins, or ``PoolSpec`` objects not installed at all) into
  ``pytest.param(spec, check_id)`` cases, one per check that applies, with readable ids
  (``int8-mha-behaviour/write-forms-agree``). A declared expected failure becomes a *strict*
  ``xfail`` mark with its reason, so it shows as xfailed, and a check that starts passing
  fails the run until the declaration is removed.
* [`check_conformance`][kvcache_core.testing.check_conformance] runs one check and raises
  [`ConformanceFailure`][kvcache_core.testing.ConformanceFailure] (an ``AssertionError``) whose
  text is the finding: message, hint and a runnable reproduction.
  It knows nothing of expected failures: the marks say what is expected, the function only
  says what happened.
* [`conformance_report`][kvcache_core.testing.conformance_report] runs the battery on pools and
  returns the report ``kvcache check`` would print for those results, in any of its formats,
  through the checker's one report pipeline
  ([`report`][kvcache_core.conformance.reporting.report.report]);
  [`case_result`][kvcache_core.testing.case_result] is one case's result in that report.

``pytest --kvcache-conformance`` (``kvcache_core.pytest_plugin``) builds the same cases without
a test module. Importing this module imports torch; the plugin imports it only when asked.
"""

from __future__ import annotations

import dataclasses
import os
import textwrap
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from .conformance.behaviour import BATTERY, DEFAULT_TIMEOUT_S, run_check, select_checks
from .conformance.reporting.report import Report, report
from .conformance.results.expected import (
    ExpectedFailure,
    expected_failures_for,
    load_expected_failures,
    validate_expected_failures,
)
from .conformance.results.model import CheckResult, Finding, Outcome
from .conformance.results.suppressions import find_pyproject, load_pyproject
from .conformance.targets.resolve import UsageError
from .contracts.spec import PoolSpec
from .discovery import Registry, discover

if TYPE_CHECKING:
    import pytest
    from _pytest.mark.structures import ParameterSet

__all__ = [
    "ConformanceCase",
    "ConformanceFailure",
    "case_result",
    "check_conformance",
    "conformance_cases",
    "conformance_report",
    "format_finding",
    "plan_conformance",
    "raise_for",
    "with_pool_seconds",
]


def format_finding(finding: Finding) -> str:
    """A finding as a test failure should read: what, then what to do, then how to see it."""
    lines = [f"[{finding.rule}] {finding.target}: {finding.message}"]
    if finding.hint:
        lines += ["", f"hint: {finding.hint}"]
    if finding.reproduction:
        lines += ["", "reproduction:", textwrap.indent(finding.reproduction, "    ")]
    return "\n".join(lines)


class ConformanceFailure(AssertionError):
    """A behaviour check failed; ``str()`` is the finding, ready to read in a test report.

    An ``AssertionError`` so that it reads as a failed test (not an error in the test), and so
    that ``xfail(raises=AssertionError)`` accepts exactly this and nothing else.
    """

    def __init__(self, finding: Finding | None, fallback: str = "") -> None:
        super().__init__(format_finding(finding) if finding is not None else fallback)
        self.finding = finding
        """The finding itself (None when the check could not produce one), for reporters
        that want its fields rather than its text."""


def check_conformance(
    spec: PoolSpec | str, check_id: str, *, timeout_s: float = DEFAULT_TIMEOUT_S
) -> None:
    """Run behaviour check ``check_id`` on ``spec`` (or on the installed pool of that name).

    Returns when the pool behaves; raises
    [`ConformanceFailure`][kvcache_core.testing.ConformanceFailure] with the finding when it
    does not (a hang past ``timeout_s`` counts as a failure). Expected failures declared on the
    spec are ignored here: see [`conformance_cases`][kvcache_core.testing.conformance_cases] for
    how they are honoured.
    """
    if isinstance(spec, str):
        spec = discover().spec(spec)  # UnknownPoolError names the accepted pools
    checks = select_checks(spec, [check_id])  # KeyError naming the known ids
    if not checks:
        raise ValueError(
            f"behaviour check {check_id!r} does not apply to pool {spec.name!r} "
            f"(capabilities: {', '.join(sorted(map(str, spec.capabilities))) or 'none'})"
        )
    bare = dataclasses.replace(spec, expected_failures={})
    result = run_check(bare, checks[0], timeout_s=timeout_s)
    if result.outcome is Outcome.PASSED:
        return
    finding = result.findings[0] if result.findings else None
    raise ConformanceFailure(finding, f"{checks[0].name} on pool {spec.name!r}: {result.detail}")


@dataclass(frozen=True)
class ConformanceCase:
    """One (pool, check) to run; or, with ``spec`` None, a problem found before running any
    (``check`` is ``discovery``: the plugin was rejected; or ``expected-failures``: the spec
    declares one the battery cannot honour), described by ``rejection``."""

    pool: str
    """The pool's name (or the plugin's, for a rejected plugin)."""
    check: str
    """The behaviour check's id, or the kind of problem when ``spec`` is None."""
    spec: PoolSpec | None
    """The spec the check runs on; None when there is nothing to run."""
    expected: ExpectedFailure | None = None
    """The declared expected failure of this check on this pool, if any (an xfail mark)."""
    rejection: str = ""
    """Why there is nothing to run, when ``spec`` is None."""

    @property
    def id(self) -> str:
        """The test id: ``<pool>-behaviour/<check-id>``, or ``<name>-<problem>``."""
        if self.spec is None:
            return f"{self.pool}-{self.check}"
        return f"{self.pool}-behaviour/{self.check}"


def _cases(spec: PoolSpec, configured: Sequence[ExpectedFailure]) -> list[ConformanceCase]:
    """The spec's cases. An expected failure the spec itself declares for a check this kvcache
    does not run (a typo, or a check of a newer kvcache) fails one case of that pool, not the
    whole run: the plugin is someone else's code. The project's own entries are validated
    before this, where a mistake is a usage error."""
    broken: list[ConformanceCase] = []
    try:
        expected = expected_failures_for(spec, configured)
    except UsageError as exc:
        bare = dataclasses.replace(spec, expected_failures={})
        expected = expected_failures_for(bare, configured)
        broken = [ConformanceCase(spec.name, "expected-failures", None, rejection=str(exc))]
    cases = [
        ConformanceCase(spec.name, check.id, spec, expected.get(check.id))
        for check in select_checks(spec)
    ]
    return cases + broken


def _pyproject_path(pyproject: str | os.PathLike[str] | bool) -> str | None:
    """True: the nearest ``pyproject.toml`` above the current directory; False: none."""
    if pyproject is False:
        return None
    if pyproject is True:
        return find_pyproject(os.getcwd())
    path = os.fspath(pyproject)
    if not os.path.isfile(path):
        raise UsageError(f"{path}: no such file")
    return path


def _configured(pyproject: str | os.PathLike[str] | bool) -> list[ExpectedFailure]:
    return load_expected_failures(_pyproject_path(pyproject))


def plan_conformance(
    names: Sequence[str] | None = None,
    *,
    configured: Sequence[ExpectedFailure] = (),
    registry: Registry | None = None,
    include_rejected: bool = True,
) -> list[ConformanceCase]:
    """Every case for the installed pools (or those ``names`` select), in a stable order.

    A name selects a pool, or every pool of a plugin (entry-point name). An unknown name is a
    ``UsageError`` listing what is installed. Pools discovery refused become cases with
    ``rejection`` set (with ``include_rejected``), so a plugin that fails to load fails the run
    instead of vanishing from it. Sorted by pool name, checks in battery order: every pytest-xdist
    worker computes the same list.
    """
    registry = registry if registry is not None else discover()
    accepted = {name: registry.accepted[name].spec for name in registry.names()}
    validate_expected_failures(configured, accepted)
    rejected = {(r.pool or r.plugin.name): r for r in registry.rejected}
    if names is None:
        pools, refused = sorted(accepted), sorted(rejected)
    else:
        pools, refused = [], []
        for name in names:
            hits = [p for p, a in registry.accepted.items() if name in (p, a.plugin.name)]
            misses = [k for k, r in rejected.items() if name in (k, r.plugin.name)]
            if not hits and not misses:
                plugins = sorted({a.plugin.name for a in registry.accepted.values()})
                raise UsageError(
                    f"no installed kvcache pool or plugin is named {name!r}; pools: "
                    f"{', '.join(sorted(accepted)) or 'none'}; plugins: "
                    f"{', '.join(plugins) or 'none'}"
                )
            pools += hits
            refused += misses
        pools, refused = sorted(set(pools)), sorted(set(refused))
    cases = [case for pool in pools for case in _cases(accepted[pool], configured)]
    if include_rejected:
        for name in refused:
            why = f"discovery rejected {rejected[name]}"
            cases.append(ConformanceCase(name, "discovery", None, rejection=why))
    return cases


def conformance_cases(
    *pools: str | PoolSpec,
    pyproject: str | os.PathLike[str] | bool = True,
) -> list[ParameterSet]:
    """``pytest.param(spec, check_id)`` for every check that applies to each pool.

    ``pools`` are installed pool or plugin names, or ``PoolSpec`` objects (a pool under
    development, not installed); none means every installed pool. ``pyproject`` says where
    ``[tool.kvcache.expected-failures]`` is read: True (default) the nearest ``pyproject.toml``
    above the current directory, a path, or False for none. Each expected failure (there or on
    the spec) becomes ``xfail(strict=True, raises=AssertionError)`` with its reason. An unknown
    name, or a pool that discovery rejected, is a ``UsageError`` saying why.
    """
    import pytest

    configured = _configured(pyproject)
    named = any(isinstance(p, str) for p in pools)
    cases = _plan(pools, configured, include_rejected=named)
    refused = [c.rejection for c in cases if c.spec is None]
    if refused:
        raise UsageError("; ".join(refused))
    return [
        pytest.param(case.spec, case.check, id=case.id, marks=_marks(case.expected))
        for case in cases
    ]


def _plan(
    pools: Sequence[str | PoolSpec],
    configured: Sequence[ExpectedFailure],
    *,
    include_rejected: bool,
) -> list[ConformanceCase]:
    """The cases of ``pools`` as the public entry points read them: names are installed pools
    (none at all: every installed pool), specs run as given; each with its expected failures."""
    names = [p for p in pools if isinstance(p, str)]
    direct = {p.name: p for p in pools if isinstance(p, PoolSpec)}
    cases: list[ConformanceCase] = []
    if names or not pools:
        installed = [e for e in configured if e.pool not in direct]
        cases = plan_conformance(
            names or None, configured=installed, include_rejected=include_rejected
        )
    for name, spec in direct.items():
        cases += _cases(spec, [e for e in configured if e.pool == name])
    return cases


def _marks(expected: ExpectedFailure | None) -> list[pytest.MarkDecorator]:
    import pytest

    if expected is None:
        return []
    return [pytest.mark.xfail(reason=expected.describe(), strict=True, raises=AssertionError)]


def case_result(case: ConformanceCase, *, timeout_s: float = DEFAULT_TIMEOUT_S) -> CheckResult:
    """Run ``case`` and return its result as ``kvcache check`` reports it.

    An expected failure that fails is ``EXPECTED_FAILURE`` (with the reason the project or the
    spec gives, as the behaviour level shows it); one that passes is ``FAILED`` with a
    ``behaviour-unexpected-pass`` finding; a case with nothing to run (``spec`` None) is an
    ``ERROR`` saying why. [`raise_for`][kvcache_core.testing.raise_for] turns the result into
    what a test should do.
    """
    if case.spec is None:
        return CheckResult(f"pool:{case.pool}", case.check, Outcome.ERROR, detail=case.rejection)
    declared: dict[str, str] = {}
    if case.expected is not None and case.expected.origin != f"PoolSpec {case.spec.name!r}":
        # The project's declaration, worded as the behaviour level words it; the spec's own
        # declarations are read from the spec by the battery itself.
        declared[case.check] = case.expected.describe()
    check = BATTERY[case.check]
    return run_check(case.spec, check, expected_failures=declared, timeout_s=timeout_s)


def raise_for(case: ConformanceCase, result: CheckResult) -> None:
    """Do what a test of ``case`` does with ``result``: return when the pool did what the case
    expects of it, raise [`ConformanceFailure`][kvcache_core.testing.ConformanceFailure] with
    the finding when the check failed.

    A declared expected failure raises too (its ``xfail`` mark turns that into *xfailed*), and
    one that unexpectedly passed returns (the strict mark turns that into a failure). So a test
    raises exactly when [`check_conformance`][kvcache_core.testing.check_conformance] would.
    """
    if case.spec is None:
        hint = (
            f"run `kvcache list` and `kvcache check {case.pool}` for every finding"
            if case.check == "discovery"
            else "fix the pool's PoolSpec.expected_failures"
        )
        raise ConformanceFailure(None, f"{case.rejection}\n\nhint: {hint}")
    if result.outcome is Outcome.EXPECTED_FAILURE:
        finding = result.extra.get("finding")
        raise ConformanceFailure(finding if isinstance(finding, Finding) else None, result.detail)
    if result.outcome is Outcome.PASSED or any(
        f.rule == "behaviour-unexpected-pass" for f in result.findings
    ):
        return
    finding = result.findings[0] if result.findings else None
    raise ConformanceFailure(finding, f"{result.check} on pool {case.pool!r}: {result.detail}")


def with_pool_seconds(results: Sequence[CheckResult]) -> list[CheckResult]:
    """``results`` with each pool's battery wall time on its first result, as the behaviour
    level reports it (the text report shows it beside the pool)."""
    out = list(results)
    first: dict[str, int] = {}
    total: dict[str, float] = {}
    for i, result in enumerate(out):
        if result.target.startswith("pool:") and result.outcome is not Outcome.ERROR:
            first.setdefault(result.target, i)
            total[result.target] = total.get(result.target, 0.0) + (result.duration_s or 0.0)
    for target, i in first.items():
        extra = {**out[i].extra, "pool_seconds": total[target]}
        out[i] = dataclasses.replace(out[i], extra=extra)
    return out


def conformance_report(
    *pools: str | PoolSpec,
    format: str = "text",
    pyproject: str | os.PathLike[str] | bool = True,
    timeout_s: float = DEFAULT_TIMEOUT_S,
) -> Report:
    """The behaviour battery on ``pools`` as one report, in any ``kvcache check --format``.

    ``pools`` and ``pyproject`` are read as
    [`conformance_cases`][kvcache_core.testing.conformance_cases] reads them (none: every
    installed pool); the project's ``[tool.kvcache]`` suppressions apply as well. Every case
    runs ([`case_result`][kvcache_core.testing.case_result]) and the results go through the
    checker's one report pipeline, so the report reads as ``kvcache check`` prints the same
    results, and ``exit_code`` is the command's. A pool discovery rejected is an ``ERROR``
    result (exit code 2), not an exception: a report says what went wrong.
    """
    path = _pyproject_path(pyproject)
    cases = _plan(pools, load_expected_failures(path), include_rejected=True)
    results = with_pool_seconds([case_result(case, timeout_s=timeout_s) for case in cases])
    return report(results, format, suppressions=load_pyproject(path) if path else [])
