"""Human-readable report: grouped by target, each finding with both locations and its hint
(and, for behaviour findings, the runnable reproduction as an indented block), a summary line
last (the line a CI log shows when it folds the rest). A pool's behaviour battery shows its
wall time next to the target, so a slow check is visible where it runs."""

from __future__ import annotations

from collections.abc import Sequence

from ...results.model import CheckResult, Finding, Outcome
from ._common import by_target, location_text, summarize

__all__ = ["render"]

_LABEL = {
    Outcome.PASSED: "PASS",
    Outcome.FAILED: "FAIL",
    Outcome.ERROR: "ERROR",
    Outcome.SKIPPED: "SKIP",
    Outcome.EXPECTED_FAILURE: "XFAIL",
}
_INDENT = " " * 9


def _finding_lines(finding: Finding) -> list[str]:
    where = finding.method or ""
    if finding.parameter:
        where += f"({finding.parameter})"
    head = f"{finding.severity}[{finding.rule}]"
    head += f" {where}: {finding.message}" if where else f" {finding.message}"
    first, *more = head.splitlines() or [""]
    lines = [f"{_INDENT}{first}", *(f"{_INDENT}  {line}" for line in more)]
    if len(finding.levels) > 1:
        lines.append(f"{_INDENT}  seen by:        {', '.join(finding.levels)}")
    impl = location_text(finding.impl_location)
    contract = location_text(finding.contract_location)
    if impl:
        lines.append(f"{_INDENT}  implementation: {impl}")
    if contract:
        lines.append(f"{_INDENT}  contract:       {contract}")
    for other in finding.related:
        lines.append(f"{_INDENT}  called at:      {location_text(other.location)}: {other.message}")
    if finding.hint:
        hint, *rest = finding.hint.splitlines()
        lines += [f"{_INDENT}  hint: {hint}", *(f"{_INDENT}        {line}" for line in rest)]
    if finding.reproduction:
        lines.append(f"{_INDENT}  reproduction:")
        lines += [f"{_INDENT}    {line}".rstrip() for line in finding.reproduction.splitlines()]
    return lines


def _result_lines(result: CheckResult) -> list[str]:
    head = f"  {_LABEL[result.outcome]:<6} {result.check}"
    count = len(result.findings)
    if count and result.outcome is not Outcome.PASSED:
        head += f"  ({count} finding{'' if count == 1 else 's'})"
    detail = result.detail.strip().splitlines()
    if detail:
        head += f"  {detail[0]}"
    lines = [head, *(f"{_INDENT}{d}" for d in detail[1:])]
    for finding in result.findings:
        lines += _finding_lines(finding)
    return lines


def render(results: Sequence[CheckResult]) -> str:
    lines: list[str] = []
    for target, group in by_target(results).items():
        seconds = [r.extra["pool_seconds"] for r in group if "pool_seconds" in r.extra]
        took = sum(s for s in seconds if isinstance(s, (int, float)))
        lines.append(f"{target}  (behaviour checks: {took:.2f} s)" if seconds else target)
        for result in group:
            lines += _result_lines(result)
        lines.append("")
    lines.append(summarize(results).line())
    return "\n".join(lines) + "\n"
