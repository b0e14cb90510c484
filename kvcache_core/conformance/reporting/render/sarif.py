"""SARIF 2.1.0, as GitHub code scanning and other SARIF viewers read it.

Rule ids are the checker's stable ids (``tool.driver.rules``, in ``rules.py`` order, so a
``ruleIndex`` never moves for an existing rule). A finding's location is the implementation's
file:line; the contract's file:line is a ``relatedLocation``, and so is each call site a
drift finding names. Paths under the working directory are relative to ``%SRCROOT%``
(declared in ``originalUriBaseIds``), others absolute ``file:`` URIs. An expected failure
is reported with an accepted external suppression, so viewers show it as dismissed; checks
that could not run become ``toolExecutionNotifications``.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Sequence
from pathlib import Path
from urllib.parse import quote

from ...results.model import CheckResult, Finding, Location, Outcome
from ...results.rules import RULES, Severity
from ._common import tool_version

__all__ = ["SARIF_SCHEMA", "render", "to_log"]

SARIF_SCHEMA = "https://json.schemastore.org/sarif-2.1.0.json"
_SRCROOT = "%SRCROOT%"
_LEVEL = {Severity.ERROR: "error", Severity.WARNING: "warning", Severity.NOTE: "note"}
_RULE_INDEX = {rule_id: number for number, rule_id in enumerate(RULES)}


def _artifact(path: str, base: Path) -> dict[str, object]:
    absolute = Path(os.path.abspath(path))
    try:
        relative = absolute.relative_to(base)
    except ValueError:
        return {"uri": absolute.as_uri()}
    return {"uri": quote(relative.as_posix()), "uriBaseId": _SRCROOT}


def _physical(location: Location, base: Path) -> dict[str, object]:
    physical: dict[str, object] = {"artifactLocation": _artifact(location.path, base)}
    if location.line is not None and location.line >= 1:
        physical["region"] = {"startLine": location.line}
    return physical


def _rules() -> list[dict[str, object]]:
    return [
        {
            "id": rule.id,
            "name": "".join(word.capitalize() for word in rule.id.split("-")),
            "shortDescription": {"text": rule.summary},
            "defaultConfiguration": {"level": _LEVEL[rule.severity]},
        }
        for rule in RULES.values()
    ]


def _fingerprint(result: CheckResult, finding: Finding) -> str:
    """Stable across runs while the finding is the same, whatever line it moves to."""
    key = "\0".join(
        [finding.rule, result.target, result.check, finding.method or "", finding.parameter or ""]
    )
    return hashlib.sha256(key.encode()).hexdigest()[:32]


def _result(result: CheckResult, finding: Finding, base: Path) -> dict[str, object]:
    text = finding.message + (f"\nHint: {finding.hint}" if finding.hint else "")
    if finding.reproduction:
        text += f"\nReproduction:\n{finding.reproduction}"
    entry: dict[str, object] = {
        "ruleId": finding.rule,
        "ruleIndex": _RULE_INDEX[finding.rule],
        "level": _LEVEL[finding.severity or Severity.ERROR],
        "message": {"text": text},
        "partialFingerprints": {"kvcacheFinding/v1": _fingerprint(result, finding)},
        "properties": {
            "target": result.target,
            "check": result.check,
            "outcome": str(result.outcome),
            "method": finding.method,
            "parameter": finding.parameter,
            "levels": list(finding.levels),
            **({"reproduction": finding.reproduction} if finding.reproduction else {}),
        },
    }
    primary = finding.impl_location or finding.contract_location
    if primary is not None:
        entry["locations"] = [{"physicalLocation": _physical(primary, base)}]
    related: list[dict[str, object]] = []
    if finding.contract_location is not None and finding.impl_location is not None:
        what = f"{finding.method}" if finding.method else "the contract"
        related.append(
            {
                "id": 1,
                "message": {"text": f"contract: {what}"},
                "physicalLocation": _physical(finding.contract_location, base),
            }
        )
    for other in finding.related:  # the call sites that break (kvcache drift)
        related.append(
            {
                "id": len(related) + 1,
                "message": {"text": other.message},
                "physicalLocation": _physical(other.location, base),
            }
        )
    if related:
        entry["relatedLocations"] = related
    if result.outcome is Outcome.EXPECTED_FAILURE:
        why = "expected failure" + (f": {result.detail}" if result.detail else "")
        entry["suppressions"] = [{"kind": "external", "status": "accepted", "justification": why}]
    return entry


def _notifications(results: Sequence[CheckResult]) -> list[dict[str, object]]:
    notes: list[dict[str, object]] = []
    for result in results:
        if result.outcome is Outcome.ERROR and not result.findings:
            level = "error"
        elif result.outcome is Outcome.SKIPPED:
            level = "note"
        else:
            continue
        detail = result.detail.strip() or str(result.outcome)
        notes.append(
            {
                "level": level,
                "message": {"text": f"{result.target} {result.check}: {detail}"},
                "properties": {"target": result.target, "check": result.check},
            }
        )
    return notes


def to_log(results: Sequence[CheckResult], base: str | None = None) -> dict[str, object]:
    """The SARIF log as Python data; ``base`` is ``%SRCROOT%`` (default: the working dir)."""
    root = Path(os.path.abspath(base or os.getcwd()))
    notifications = _notifications(results)
    successful = not any(n["level"] == "error" for n in notifications)
    return {
        "$schema": SARIF_SCHEMA,
        "version": "2.1.0",
        "runs": [
            {
                "tool": {
                    "driver": {
                        "name": "kvcache",
                        "version": tool_version(),
                        "rules": _rules(),
                    }
                },
                "originalUriBaseIds": {_SRCROOT: {"uri": root.as_uri() + "/"}},
                "invocations": [
                    {
                        "executionSuccessful": successful,
                        "toolExecutionNotifications": notifications,
                    }
                ],
                "results": [_result(r, f, root) for r in results for f in r.findings],
            }
        ],
    }


def render(results: Sequence[CheckResult]) -> str:
    return json.dumps(to_log(results), indent=2) + "\n"
