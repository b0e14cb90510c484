"""``pytest --kvcache-conformance[=NAME,...]``: the behaviour battery as pytest tests.

One test per (pool, check) of the installed plugins (all of them, or the pools and plugins
named), with ids like ``test_kvcache_conformance[mha-behaviour/write-forms-agree]``, so the
battery shows up where pool authors already look (their CI's test report), with ``-k``,
``-x``, ``-n`` and JUnit output for free. A failure shows the finding: message, hint and a
runnable reproduction. Expected failures (``PoolSpec.expected_failures`` or
``[tool.kvcache.expected-failures]`` in the project's ``pyproject.toml``) are strict xfails:
one that passes fails the run until its declaration is removed. A plugin that discovery
rejects becomes a failing ``test_kvcache_conformance[<name>-discovery]`` rather than vanishing.
``--kvcache-report=FORMAT:FILE`` (repeatable) also writes the battery's results as one report
in any ``kvcache check --format``, through the checker's one report pipeline
([`report`][kvcache_core.conformance.reporting.report.report]), so CI gets the SARIF or
GitHub annotations ``kvcache check`` would give for the same results, with or without ``-n``.

Why it imports nothing heavy at module level: pytest loads this module (entry point
``pytest11``) in *every* run in an environment where kvcache is installed, so without the
option it must cost nothing, no torch and no plugin discovery. Everything heavy happens inside
the hooks, and only when ``--kvcache-conformance`` is given.
"""

from __future__ import annotations

import os
import warnings
from typing import TYPE_CHECKING, Any

import pytest

if TYPE_CHECKING:
    from collections.abc import Generator, Sequence

    from _pytest._code.code import ExceptionInfo, TerminalRepr

    from .conformance.results.model import CheckResult
    from .conformance.results.suppressions import Suppression
    from .testing import ConformanceCase

__all__ = ["ConformanceItem"]

_OPTION = "kvcache_conformance"
_PLAN = pytest.StashKey["list[ConformanceCase]"]()
_REPORTS = pytest.StashKey["list[tuple[str, str]]"]()
#: The test report attribute a battery test's result travels under (from an xdist worker to
#: the process that writes the report). An attribute of its own, not ``user_properties``:
#: pytest writes those into the user's ``--junitxml`` file.
_RESULT = "kvcache_conformance_result"
#: The mark every battery test carries: ``-m kvcache_conformance`` runs only the battery.
MARK = "kvcache_conformance"
#: The mark every store-battery test (``--kvcache-store``) carries; registered here, where
#: pytest reads the plugin, so that a project without our ini file gets no unknown-mark warning.
STORE_MARK = "kvcache_store"


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("kvcache", "kvcache conformance battery")
    group.addoption(
        "--kvcache-conformance",
        dest=_OPTION,
        action="append",
        nargs="?",
        const="",
        default=None,
        metavar="NAME,...",
        help="add one test per (pool, behaviour check) of the installed kvcache plugins; "
        "=NAME,... limits it to those pools or plugins (write it with `=`, or after the paths)",
    )
    group.addoption(
        "--kvcache-report",
        dest="kvcache_report",
        action="append",
        default=None,
        metavar="FORMAT:FILE",
        help="also write the battery's results to FILE as one report in FORMAT (text, json, "
        "junit, sarif or github, as `kvcache check --format`); repeatable",
    )
    group.addoption(
        "--kvcache-store",
        dest="kvcache_store",
        action="append",
        default=None,
        metavar="URL",
        help="add one test per check of the snapshot-store battery on the store at URL "
        "(repeatable)",
    )


def _requested(config: pytest.Config) -> list[str] | None:
    """None: option absent; []: every pool; else the names asked for, in order, once each."""
    values: list[str] | None = config.getoption(_OPTION)
    if values is None:
        return None
    names = [n.strip() for v in values for n in v.split(",") if n.strip()]
    if any(not v.strip() for v in values):
        return []  # a bare --kvcache-conformance asks for everything
    return list(dict.fromkeys(names))


def _pyproject(config: pytest.Config) -> str | None:
    """The project's pyproject.toml: pytest's own, else the nearest one above the rootdir."""
    from .conformance.results.suppressions import find_pyproject

    inipath = config.inipath
    if inipath is not None and inipath.name == "pyproject.toml":
        return str(inipath)
    return find_pyproject(str(config.rootpath))


def _reports(config: pytest.Config) -> list[tuple[str, str]]:
    """``--kvcache-report FORMAT:FILE`` values as (format, file); a usage error when malformed."""
    values: list[str] | None = config.getoption("kvcache_report")
    if not values:
        return []
    from .conformance.reporting.report import FORMATS

    out: list[tuple[str, str]] = []
    for value in values:
        fmt, sep, path = value.partition(":")
        if not sep or not path or fmt not in FORMATS:
            raise pytest.UsageError(
                f"--kvcache-report {value!r}: expected FORMAT:FILE with FORMAT one of "
                f"{', '.join(FORMATS)}"
            )
        out.append((fmt, path))
    return out


@pytest.hookimpl(trylast=True)
def pytest_configure(config: pytest.Config) -> None:
    """Resolve the names and read the config up front, so a mistake is a usage error (exit 4)
    before anything runs, on the xdist controller and on every worker alike."""
    config.addinivalue_line(
        "markers", f"{MARK}: a kvcache behaviour check (added by --kvcache-conformance)"
    )
    config.addinivalue_line(
        "markers", f"{STORE_MARK}: a snapshot-store battery check (added by --kvcache-store)"
    )
    reports = _reports(config)
    if reports:
        from .conformance.results.suppressions import load_pyproject
        from .conformance.results.usage import UsageError

        path = _pyproject(config)
        try:  # read now: a bad suppression is a usage error before anything runs
            suppressions = load_pyproject(path) if path else []
        except UsageError as exc:
            raise pytest.UsageError(f"--kvcache-report: {exc}") from None
        config.stash[_REPORTS] = reports
        writer = _ReportWriter(config, suppressions)
        config.pluginmanager.register(writer, "kvcache-report-writer")
    names = _requested(config)
    if names is None:
        return
    from .conformance.results.expected import load_expected_failures
    from .conformance.targets.resolve import UsageError
    from .testing import plan_conformance

    try:
        configured = load_expected_failures(_pyproject(config))
        plan = plan_conformance(names or None, configured=configured)
    except UsageError as exc:
        message = f"--kvcache-conformance: {exc}"
        paths = [n for n in names if os.path.exists(n)]
        if paths:
            rest = [n for n in names if n not in paths]
            fixed = f"--kvcache-conformance={','.join(rest)}" if rest else "--kvcache-conformance"
            message += (
                f" ({paths[0]!r} is a path the option took as a name: write "
                f"`pytest {' '.join(paths)} {fixed}`)"
            )
        raise pytest.UsageError(message) from None
    config.stash[_PLAN] = plan


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(
    session: pytest.Session, config: pytest.Config, items: list[pytest.Item]
) -> None:
    """Append the battery before ``-k``/``-m``/``--deselect`` filter the items (``tryfirst``)."""
    stores: list[str] | None = config.getoption("kvcache_store")
    if stores:
        from .stores.pytest_items import store_items

        items.extend(store_items(session, stores, mark=STORE_MARK))
    plan = config.stash.get(_PLAN, None)
    if plan is None:
        return
    for case in plan:
        items.append(ConformanceItem.from_parent(session, case=case))


class ConformanceItem(pytest.Item):
    """One behaviour check on one pool (or one pool discovery refused), as a pytest test."""

    def __init__(self, *, case: ConformanceCase, **kwargs: Any) -> None:
        name = f"test_kvcache_conformance[{case.id}]"
        super().__init__(name=name, nodeid=name, **kwargs)
        self.case = case
        self.encoded_result: str | None = None
        """This run's result as JSON text, when ``--kvcache-report`` asks for it."""
        self.add_marker(MARK)
        if case.expected is not None:
            self.add_marker(
                pytest.mark.xfail(
                    reason=case.expected.describe(), strict=True, raises=AssertionError
                )
            )

    def runtest(self) -> None:
        from .testing import case_result, raise_for

        result = case_result(self.case)
        if self.config.stash.get(_REPORTS, None):
            # Encoded because the result must reach the process that writes the report, and
            # under pytest-xdist that is another process. JSON, never pickle: the reader builds
            # only results from it. ``pytest_runtest_makereport`` puts it on the call's report.
            from .conformance.results.codec import result_to_json

            self.encoded_result = result_to_json(result)
        raise_for(self.case, result)

    def repr_failure(
        self, excinfo: ExceptionInfo[BaseException], style: Any = None
    ) -> str | TerminalRepr:
        """The finding itself; a traceback through the harness would only hide it."""
        from .testing import ConformanceFailure

        if isinstance(excinfo.value, ConformanceFailure):
            return str(excinfo.value)
        return super().repr_failure(excinfo, style=style)

    def reportinfo(self) -> tuple[os.PathLike[str] | str, int | None, str]:
        return self.path, None, self.name


@pytest.hookimpl(wrapper=True, tryfirst=True)
def pytest_runtest_makereport(
    item: pytest.Item, call: pytest.CallInfo[None]
) -> Generator[None, pytest.TestReport, pytest.TestReport]:
    """Say what a strict XPASS of a battery test means and what to do about it; carry a
    battery test's result for ``--kvcache-report`` on its call report."""
    report = yield
    encoded = item.encoded_result if isinstance(item, ConformanceItem) else None
    if encoded is not None and report.when == "call":
        setattr(report, _RESULT, encoded)  # pytest-xdist sends a report's attributes along
    if (
        isinstance(item, ConformanceItem)
        and item.case.expected is not None
        and report.when == "call"
        and report.failed
        and call.excinfo is None
        and not item.config.option.runxfail
    ):
        expected = item.case.expected
        report.longrepr = (
            f"[XPASS(strict)] behaviour/{expected.check} passed on pool {expected.pool!r}, but "
            f"{expected.origin} declares it an expected failure ({expected.reason}). Remove that "
            "declaration: an expected failure must not outlive the bug it describes."
        )
    return report


class _ReportWriter:
    """Collects the battery's results as their test reports arrive and writes the
    ``--kvcache-report`` files when the session ends (in the main process only)."""

    def __init__(self, config: pytest.Config, suppressions: Sequence[Suppression]) -> None:
        self.config = config
        self.suppressions = suppressions
        self.results: dict[str, CheckResult] = {}

    @pytest.hookimpl
    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        if report.when != "call":
            return
        encoded = getattr(report, _RESULT, None)
        if isinstance(encoded, str):
            from .conformance.results.codec import result_from_json

            try:
                self.results[report.nodeid] = result_from_json(encoded)
            except (ValueError, TypeError, KeyError) as exc:  # not one of ours: say so, run on
                warnings.warn(
                    pytest.PytestWarning(
                        f"--kvcache-report: the result of {report.nodeid} is unreadable ({exc})"
                    ),
                    stacklevel=2,
                )

    @pytest.hookimpl(trylast=True)
    def pytest_sessionfinish(self, session: pytest.Session) -> None:
        if hasattr(self.config, "workerinput"):  # an xdist worker: the controller writes
            return
        from .conformance.reporting.report import report
        from .testing import with_pool_seconds

        plan = self.config.stash.get(_PLAN, [])
        order = {f"test_kvcache_conformance[{case.id}]": i for i, case in enumerate(plan)}
        ran = sorted(self.results.items(), key=lambda item: order.get(item[0], len(order)))
        results = with_pool_seconds([result for _, result in ran])
        for fmt, file in self.config.stash[_REPORTS]:
            text = report(results, fmt, suppressions=self.suppressions).text
            with open(file, "w", encoding="utf-8") as fh:
                fh.write(text)
