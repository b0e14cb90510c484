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

from .conformance.behaviour import DEFAULT_TIMEOUT_S, run_check, select_checks
from .conformance.results.expected import (
    ExpectedFailure,
    expected_failures_for,
    load_expected_failures,
    validate_expected_failures,
)
from .conformance.results.model import Finding, Outcome
from .conformance.results.suppressions import find_pyproject
from .conformance.targets.resolve import UsageError
from .contracts.spec import PoolSpec
from .discovery import Registry, discover

if TYPE_CHECKING:
    import pytest
    from _pytest.mark.structures import ParameterSet

__all__ = [
    "ConformanceCase",
    "ConformanceFailure",
    "check_conformance",
    "conformance_cases",
    "format_finding",
    "plan_conformance",
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


def _configured(pyproject: str | os.PathLike[str] | bool) -> list[ExpectedFailure]:
    if pyproject is False:
        return []
    if pyproject is True:
        return load_expected_failures(find_pyproject(os.getcwd()))
    path = os.fspath(pyproject)
    if not os.path.isfile(path):
        raise UsageError(f"{path}: no such file")
    return load_expected_failures(path)


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
    names = [p for p in pools if isinstance(p, str)]
    direct = {p.name: p for p in pools if isinstance(p, PoolSpec)}
    cases: list[ConformanceCase] = []
    if names or not pools:
        installed = [e for e in configured if e.pool not in direct]
        cases = plan_conformance(names or None, configured=installed, include_rejected=bool(names))
        refused = [c.rejection for c in cases if c.spec is None]
        if refused:
            raise UsageError("; ".join(refused))
    for name, spec in direct.items():
        own = [e for e in configured if e.pool == name]
        cases += _cases(spec, own)
        refused = [c.rejection for c in cases if c.spec is None]
        if refused:
            raise UsageError("; ".join(refused))
    return [
        pytest.param(case.spec, case.check, id=case.id, marks=_marks(case.expected))
        for case in cases
    ]


def _marks(expected: ExpectedFailure | None) -> list[pytest.MarkDecorator]:
    import pytest

    if expected is None:
        return []
    return [pytest.mark.xfail(reason=expected.describe(), strict=True, raises=AssertionError)]
