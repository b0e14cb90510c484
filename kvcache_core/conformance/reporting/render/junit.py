"""JUnit XML: one ``<testsuite>`` per target, one ``<testcase>`` per (target, check).

FAILED becomes ``<failure>``, ERROR ``<error>``, SKIPPED ``<skipped>``; an expected failure is a
``<skipped type="expected-failure">`` (JUnit has no such outcome; pytest reports xfail the same
way), so CI dashboards neither fail on it nor count it as a pass. Findings of a passing check
(warnings) go to ``<system-out>``.
"""

from __future__ import annotations

import re
import xml.etree.ElementTree as ET
from collections.abc import Sequence

from ...results.model import CheckResult, Finding, Outcome
from ._common import by_target, location_text

__all__ = ["render"]

#: Characters XML 1.0 cannot carry at all (escaping does not help).
_NOT_XML = re.compile("[\x00-\x08\x0b\x0c\x0e-\x1f\ufffe\uffff]")


def _clean(text: str) -> str:
    return _NOT_XML.sub("\ufffd", text)


def _finding_text(finding: Finding) -> str:
    where = f"{finding.method}" if finding.method else ""
    if finding.parameter:
        where += f"({finding.parameter})"
    head = f"{finding.severity}[{finding.rule}]" + (f" {where}:" if where else "")
    lines = [f"{head} {finding.message}"]
    if len(finding.levels) > 1:
        lines.append(f"  seen by: {', '.join(finding.levels)}")
    impl = location_text(finding.impl_location)
    contract = location_text(finding.contract_location)
    if impl:
        lines.append(f"  implementation: {impl}")
    if contract:
        lines.append(f"  contract: {contract}")
    for other in finding.related:
        lines.append(f"  called at: {location_text(other.location)}: {other.message}")
    if finding.hint:
        lines.append(f"  hint: {finding.hint}")
    if finding.reproduction:
        lines.append("  reproduction:")
        lines += [f"    {line}".rstrip() for line in finding.reproduction.splitlines()]
    return "\n".join(lines)


def _body(result: CheckResult) -> str:
    parts = [result.detail.strip()] if result.detail.strip() else []
    parts += [_finding_text(f) for f in result.findings]
    return _clean("\n\n".join(parts))


def _first_line(result: CheckResult) -> str:
    if result.findings:
        count = len(result.findings)
        first = result.findings[0].message.splitlines()[0] if result.findings[0].message else ""
        return _clean(f"{count} finding{'' if count == 1 else 's'}: {first}")
    detail = result.detail.strip().splitlines()
    return _clean(detail[0] if detail else str(result.outcome))


def _testcase(suite: ET.Element, result: CheckResult) -> None:
    case = ET.SubElement(
        suite,
        "testcase",
        classname=_clean(result.target),
        name=_clean(result.check),
        time=f"{result.duration_s:.3f}",
    )
    message = _first_line(result)
    kind = result.findings[0].rule if result.findings else str(result.outcome)
    if result.outcome is Outcome.FAILED:
        ET.SubElement(case, "failure", message=message, type=kind).text = _body(result)
    elif result.outcome is Outcome.ERROR:
        ET.SubElement(case, "error", message=message, type=kind).text = _body(result)
    elif result.outcome is Outcome.SKIPPED:
        ET.SubElement(case, "skipped", message=message).text = _body(result) or None
    elif result.outcome is Outcome.EXPECTED_FAILURE:
        skipped = ET.SubElement(
            case, "skipped", message=f"expected failure: {message}", type="expected-failure"
        )
        skipped.text = _body(result) or None
    elif result.findings:
        ET.SubElement(case, "system-out").text = _body(result)


def _counts(results: Sequence[CheckResult]) -> dict[str, str]:
    return {
        "tests": str(len(results)),
        "failures": str(sum(r.outcome is Outcome.FAILED for r in results)),
        "errors": str(sum(r.outcome is Outcome.ERROR for r in results)),
        "skipped": str(
            sum(r.outcome in (Outcome.SKIPPED, Outcome.EXPECTED_FAILURE) for r in results)
        ),
        "time": f"{sum(r.duration_s for r in results):.3f}",
    }


def render(results: Sequence[CheckResult]) -> str:
    root = ET.Element("testsuites", {"name": "kvcache check", **_counts(results)})
    for target, group in by_target(results).items():
        suite = ET.SubElement(root, "testsuite", {"name": _clean(target), **_counts(group)})
        for result in group:
            _testcase(suite, result)
    ET.indent(root)
    return ET.tostring(root, encoding="unicode", xml_declaration=True) + "\n"
