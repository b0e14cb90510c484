"""GitHub Actions workflow commands: one ``::error``/``::warning``/``::notice`` annotation per
finding, pinned to the implementation's file and line.

GitHub shows at most 10 annotations of each kind per step (and 50 per job), silently dropping
the rest. So at most 10 findings are annotated, errors first, then warnings, then notes; when
there are more, one ``::notice`` says how many were left out, by rule, and where to see them all.
Notices have their own quota, so that summary is always shown. Expected failures are not
annotated. A plain summary line ends the output for the log.
"""

from __future__ import annotations

import os
from collections import Counter
from collections.abc import Sequence

from ...results.model import CheckResult, Finding, Outcome
from ...results.rules import Severity
from ._common import display_path, findings_of, location_text, summarize

__all__ = ["MAX_ANNOTATIONS", "render"]

MAX_ANNOTATIONS = 10
_COMMAND = {Severity.ERROR: "error", Severity.WARNING: "warning", Severity.NOTE: "notice"}


def _data(text: str) -> str:
    return text.replace("%", "%25").replace("\r", "%0D").replace("\n", "%0A")


def _property(text: str) -> str:
    return _data(text).replace(":", "%3A").replace(",", "%2C")


def _command(kind: str, message: str, **properties: str | int | None) -> str:
    props = ",".join(f"{k}={_property(str(v))}" for k, v in properties.items() if v is not None)
    return f"::{kind}{' ' + props if props else ''}::{_data(message)}"


def _annotation(result: CheckResult, finding: Finding) -> str:
    where = finding.impl_location or finding.contract_location
    base = os.environ.get("GITHUB_WORKSPACE")
    # the target once, then the method when there is one (a behaviour finding has none)
    subject = f"{result.target} {finding.method}" if finding.method else result.target
    seen = f"; seen by {', '.join(finding.levels)}" if len(finding.levels) > 1 else ""
    message = finding.message
    contract = location_text(finding.contract_location)
    if contract and finding.impl_location is not None:
        message += f"\nContract: {contract}"
    for other in finding.related:
        message += f"\nCalled at {location_text(other.location)}: {other.message}"
    if finding.hint:
        message += f"\nHint: {finding.hint}"
    if finding.reproduction:
        message += f"\nReproduction:\n{finding.reproduction}"
    return _command(
        _COMMAND[finding.severity or Severity.ERROR],
        message,
        file=display_path(where.path, base) if where else None,
        line=where.line if where else None,
        title=f"kvcache {finding.rule}: {subject} ({result.check}{seen})",
    )


def render(results: Sequence[CheckResult]) -> str:
    lines: list[str] = []
    annotated = 0
    left_out: Counter[str] = Counter()
    shown = [r for r in results if r.outcome is not Outcome.EXPECTED_FAILURE]
    for result in shown:
        if result.outcome is Outcome.ERROR and not result.findings:
            if annotated < MAX_ANNOTATIONS:
                detail = result.detail.strip() or "the check could not run"
                title = f"kvcache: {result.target} {result.check} could not run"
                lines.append(_command("error", detail, title=title))
                annotated += 1
            else:
                left_out["could not run"] += 1
    for result, finding in findings_of(shown):
        if annotated < MAX_ANNOTATIONS:
            lines.append(_annotation(result, finding))
            annotated += 1
        else:
            left_out[finding.rule] += 1
    if left_out:
        total = sum(left_out.values())
        which = ", ".join(f"{n} {rule}" for rule, n in sorted(left_out.items()))
        lines.append(
            _command(
                "notice",
                f"{total} more finding{'' if total == 1 else 's'} not annotated ({which}): "
                "GitHub shows only 10 annotations per kind and step. Run with --format text, "
                "or upload --format sarif to code scanning, to see them all.",
                title="kvcache check: more findings",
            )
        )
    lines.append(f"kvcache check: {summarize(results).line()}")
    return "\n".join(lines) + "\n"
