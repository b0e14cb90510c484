"""The report pipeline, written once: suppress, merge, render, exit code.

Why a library function and not the CLI's tail: `kvcache check`, `kvcache drift`,
[`kvcache_core.testing`][kvcache_core.testing] and the pytest plugin all end in a report, and
a report that depends on who asked for it is two reports. Every one of them calls
[`report`][kvcache_core.conformance.reporting.report.report], so the same results give the
same bytes in every format, and the output formats and exit codes are defined here and nowhere
else.
"""

from __future__ import annotations

import importlib
import os
from collections.abc import Callable, Collection, Iterable, Sequence
from dataclasses import dataclass
from typing import cast

from ..results.merge import merge_levels
from ..results.model import CheckResult, Outcome
from ..results.rules import Severity
from ..results.suppressions import Suppression, apply_suppressions, scan_inline
from ..results.usage import UsageError

__all__ = [
    "EXIT_ERROR",
    "EXIT_FINDINGS",
    "EXIT_OK",
    "FORMATS",
    "Report",
    "exit_code",
    "report",
]

FORMATS: tuple[str, ...] = ("text", "json", "junit", "sarif", "github")
"""The output formats, in the order the CLI lists them (``--format``); ``render`` has one
renderer for each."""

EXIT_OK = 0
"""Exit code of a clean run: every check ran, no error finding."""
EXIT_FINDINGS = 1
"""Exit code of a run with error findings (or, for ``kvcache list``, rejected plugins)."""
EXIT_ERROR = 2
"""Exit code of a usage or internal error, or of a check that could not run."""

_RENDER_MODULE = "kvcache_core.conformance.reporting.render"

Render = Callable[[Sequence[CheckResult], str], str]


@dataclass(frozen=True)
class Report:
    """A finished report: what to show, what it means for CI, and what it was made of."""

    text: str
    """The rendered report, exactly as ``kvcache check --output FILE`` writes it."""
    exit_code: int
    """[`EXIT_OK`][kvcache_core.conformance.reporting.report.EXIT_OK],
    [`EXIT_FINDINGS`][kvcache_core.conformance.reporting.report.EXIT_FINDINGS] or
    [`EXIT_ERROR`][kvcache_core.conformance.reporting.report.EXIT_ERROR]."""
    results: tuple[CheckResult, ...]
    """The results after suppressions and merging: what the text shows."""


def exit_code(results: Sequence[CheckResult]) -> int:
    """2 when a check could not run (ERROR without an error finding), 1 on error findings."""
    if any(
        r.outcome is Outcome.ERROR and not any(f.severity is Severity.ERROR for f in r.findings)
        for r in results
    ):
        return EXIT_ERROR
    if any(f.severity is Severity.ERROR for r in results for f in r.findings):
        return EXIT_FINDINGS
    return EXIT_OK


def _renderer() -> Render:
    """The renderers, loaded by name: a kvcache built without them still checks, and says so."""
    try:
        module = importlib.import_module(_RENDER_MODULE)
    except ModuleNotFoundError as exc:
        if exc.name != _RENDER_MODULE:
            raise
        raise UsageError(
            f"output renderers are not available in this kvcache ({_RENDER_MODULE} is missing)"
        ) from None
    render = getattr(module, "render", None)
    if not callable(render):
        raise UsageError(f"{_RENDER_MODULE} has no render()")
    return cast(Render, render)


def _paths(results: Sequence[CheckResult], extra: Iterable[str]) -> set[str]:
    """The Python files whose inline ``# kvcache: ignore[...]`` comments may apply."""
    paths = {p for p in extra if p}
    for result in results:
        for finding in result.findings:
            if finding.impl_location is not None:
                paths.add(finding.impl_location.path)
    return {p for p in paths if p.endswith(".py") and os.path.isfile(p)}


def report(
    results: Sequence[CheckResult],
    format: str = "text",
    *,
    suppressions: Sequence[Suppression] = (),
    scanned: Iterable[str] = (),
    active_rules: Collection[str] | None = None,
) -> Report:
    """Turn check results into the report ``kvcache check --format FORMAT`` prints.

    In order: the ``suppressions`` (from ``[tool.kvcache]``, read by
    ``kvcache_core.conformance.results.suppressions.load_pyproject``) and the
    inline ``# kvcache: ignore[...]`` comments of ``scanned`` files and of every file a finding
    points at are applied; findings several levels reported are merged into one; the results
    are rendered in ``format`` (one of
    [`FORMATS`][kvcache_core.conformance.reporting.report.FORMATS]); the exit code is computed
    from what is left. ``active_rules`` are the rules the checks that ran can report (None:
    all), so that an unused suppression of a rule that could not fire is not reported.

    Raises ``UsageError`` (``kvcache_core.conformance.results.usage``) for an unknown format
    or a bad inline suppression, before anything is rendered.
    """
    if format not in FORMATS:
        raise UsageError(f"unknown format {format!r}; formats: {', '.join(FORMATS)}")
    render = _renderer()
    everything = [*suppressions, *scan_inline(_paths(results, scanned))]
    # Suppressions first, then one finding per drift (see results/merge.py for why).
    final = merge_levels(apply_suppressions(results, everything, active_rules=active_rules))
    return Report(render(final, format), exit_code(final), tuple(final))
