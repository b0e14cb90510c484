"""The result model as JSON, versioned: docs/checker-json-schema.json describes it.

``schema_version`` changes only when a consumer would break (a field removed, renamed or
retyped); added fields keep it. ``extra`` is free-form per check and not part of the contract.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence

from ...results.model import CheckResult, Finding, Location
from ._common import summarize, tool_version

__all__ = ["SCHEMA_VERSION", "finding_to_json", "render", "to_document"]

SCHEMA_VERSION = 1


def _location(location: Location | None) -> dict[str, object] | None:
    return None if location is None else {"path": location.path, "line": location.line}


def finding_to_json(finding: Finding) -> dict[str, object]:
    return {
        "rule": finding.rule,
        "severity": str(finding.severity),
        "message": finding.message,
        "target": finding.target,
        "method": finding.method,
        "parameter": finding.parameter,
        "hint": finding.hint,
        "contract_location": _location(finding.contract_location),
        "impl_location": _location(finding.impl_location),
        "levels": list(finding.levels),
        "reproduction": finding.reproduction,
        "related": [
            {"path": r.location.path, "line": r.location.line, "message": r.message}
            for r in finding.related
        ],
    }


def _plain(value: object) -> object:
    """``value`` as JSON data: containers recursively, anything unknown as its ``str``."""
    if value is None or isinstance(value, (bool, int, str)):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else str(value)
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple, set, frozenset)):
        return [_plain(v) for v in value]
    if isinstance(value, Finding):  # an expected failure keeps its finding in ``extra``
        return finding_to_json(value)
    return str(value)


def _result(result: CheckResult) -> dict[str, object]:
    return {
        "target": result.target,
        "check": result.check,
        "outcome": str(result.outcome),
        "detail": result.detail,
        "duration_s": result.duration_s,
        "findings": [finding_to_json(f) for f in result.findings],
        "extra": _plain(result.extra),
    }


def to_document(results: Sequence[CheckResult]) -> dict[str, object]:
    """The JSON document as Python data (what ``render`` serialises)."""
    summary = summarize(results)
    return {
        "schema_version": SCHEMA_VERSION,
        "tool": {"name": "kvcache", "version": tool_version()},
        "summary": {
            "targets": summary.targets,
            "checks": summary.checks,
            "outcomes": {str(o): n for o, n in summary.outcomes.items()},
            "findings": summary.findings,
            "severities": {str(s): n for s, n in summary.severities.items()},
        },
        "results": [_result(r) for r in results],
    }


def render(results: Sequence[CheckResult]) -> str:
    return json.dumps(to_document(results), indent=2) + "\n"
