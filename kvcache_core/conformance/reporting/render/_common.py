"""What several renderers need: counts, display paths, a stable order of findings."""

from __future__ import annotations

import os
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

from ...results.model import CheckResult, Finding, Location, Outcome
from ...results.rules import Severity

__all__ = [
    "SEVERITY_ORDER",
    "Summary",
    "by_target",
    "display_path",
    "findings_of",
    "location_text",
    "summarize",
    "tool_version",
]

SEVERITY_ORDER = {Severity.ERROR: 0, Severity.WARNING: 1, Severity.NOTE: 2}


def tool_version() -> str:
    from .... import __version__

    return __version__


@dataclass(frozen=True)
class Summary:
    """Counts over a run: checks by outcome, targets, findings by severity."""

    targets: int
    checks: int
    outcomes: dict[Outcome, int]
    findings: int
    severities: dict[Severity, int]

    def line(self) -> str:
        """``12 checks on 3 targets: 9 passed, 1 failed, ...; 4 findings (3 errors, 1 warning)``."""
        outcomes = ", ".join(
            f"{self.outcomes[o]} {_OUTCOME_WORDS[o][self.outcomes[o] != 1]}" for o in Outcome
        )
        parts = [
            f"{n} {word}{'' if n == 1 else 's'}"
            for severity, word in ((Severity.ERROR, "error"), (Severity.WARNING, "warning"))
            for n in [self.severities[severity]]
        ]
        if self.severities[Severity.NOTE]:
            n = self.severities[Severity.NOTE]
            parts.append(f"{n} note{'' if n == 1 else 's'}")
        finding_word = "finding" if self.findings == 1 else "findings"
        return (
            f"{self.checks} check{'' if self.checks == 1 else 's'} on {self.targets} "
            f"target{'' if self.targets == 1 else 's'}: {outcomes}; "
            f"{self.findings} {finding_word} ({', '.join(parts)})"
        )


_OUTCOME_WORDS = {
    Outcome.PASSED: ("passed", "passed"),
    Outcome.FAILED: ("failed", "failed"),
    Outcome.ERROR: ("error", "errors"),
    Outcome.SKIPPED: ("skipped", "skipped"),
    Outcome.EXPECTED_FAILURE: ("expected failure", "expected failures"),
}


def summarize(results: Sequence[CheckResult]) -> Summary:
    outcomes = dict.fromkeys(Outcome, 0)
    severities = dict.fromkeys(Severity, 0)
    for result in results:
        outcomes[result.outcome] += 1
        for finding in result.findings:
            severities[finding.severity or Severity.ERROR] += 1
    return Summary(
        targets=len({r.target for r in results}),
        checks=len(results),
        outcomes=outcomes,
        findings=sum(severities.values()),
        severities=severities,
    )


def by_target(results: Sequence[CheckResult]) -> dict[str, list[CheckResult]]:
    """Results grouped by target, targets in order of first appearance."""
    groups: dict[str, list[CheckResult]] = {}
    for result in results:
        groups.setdefault(result.target, []).append(result)
    return groups


def findings_of(results: Sequence[CheckResult]) -> Iterator[tuple[CheckResult, Finding]]:
    """Every (result, finding), errors first, then warnings, then notes; stable otherwise."""
    pairs = [(r, f) for r in results for f in r.findings]
    pairs.sort(key=lambda pair: SEVERITY_ORDER[pair[1].severity or Severity.ERROR])
    yield from pairs


def display_path(path: str, base: str | None = None) -> str:
    """``path`` relative to ``base`` (default: the working directory) when it lies under it."""
    try:
        relative = Path(os.path.abspath(path)).relative_to(os.path.abspath(base or os.getcwd()))
    except ValueError:
        return path
    return relative.as_posix()


def location_text(location: Location | None) -> str | None:
    if location is None:
        return None
    path = display_path(location.path)
    return f"{path}:{location.line}" if location.line is not None else path
