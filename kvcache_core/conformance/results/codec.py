"""Check results as JSON text and back, exactly: how a result crosses a process boundary
(``--kvcache-report`` under pytest-xdist sends each battery result from a worker to the
process that writes the report as an attribute of the test report).

Why not pickle: the receiving side would run whatever a report attribute of that name
contains; this codec only ever builds ``CheckResult``, ``Finding``, ``Location`` and plain
JSON values, and refuses anything else with ``ValueError``.
"""

from __future__ import annotations

import json
from typing import Any

from .model import CheckResult, Finding, Location, Outcome
from .rules import Severity

__all__ = ["result_from_json", "result_to_json"]

_FINDING_TAG = "kvcache.finding"


def _location(loc: Location | None) -> object:
    return None if loc is None else {"path": loc.path, "line": loc.line}


def _finding(f: Finding) -> dict[str, Any]:
    return {
        "rule": f.rule,
        "message": f.message,
        "target": f.target,
        "method": f.method,
        "parameter": f.parameter,
        "hint": f.hint,
        "contract_location": _location(f.contract_location),
        "impl_location": _location(f.impl_location),
        "severity": None if f.severity is None else f.severity.value,
        "reproduction": f.reproduction,
        "levels": list(f.levels),
    }


def _plain(value: object) -> object:
    """``extra``'s values: JSON values, with a Finding tagged (``extra["finding"]``)."""
    if isinstance(value, Finding):
        return {_FINDING_TAG: _finding(value)}
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if isinstance(value, dict) and all(isinstance(k, str) for k in value):
        return {k: _plain(v) for k, v in value.items()}
    raise ValueError(f"a {type(value).__name__} in a check result's extra is not JSON")


def result_to_json(result: CheckResult) -> str:
    """``result`` as JSON text that ``result_from_json`` turns back into an equal result.

    :raises ValueError: ``result.extra`` holds something other than JSON values and findings.
    """
    return json.dumps(
        {
            "target": result.target,
            "check": result.check,
            "outcome": result.outcome.value,
            "findings": [_finding(f) for f in result.findings],
            "detail": result.detail,
            "duration_s": result.duration_s,
            "extra": _plain(result.extra),
        }
    )


def _str(doc: dict[str, Any], key: str, *, optional: bool = False) -> Any:
    value = doc.get(key)
    if value is None and optional:
        return None
    if not isinstance(value, str):
        raise ValueError(f"{key!r} is not a string")
    return value


def _read_location(value: object) -> Location | None:
    if value is None:
        return None
    if not isinstance(value, dict) or not isinstance(value.get("path"), str):
        raise ValueError("a location is not {path, line}")
    line = value.get("line")
    if line is not None and (type(line) is not int):
        raise ValueError("a location's line is not an integer")
    return Location(value["path"], line)


def _read_finding(doc: object) -> Finding:
    if not isinstance(doc, dict):
        raise ValueError("a finding is not an object")
    levels = doc.get("levels", [])
    if not isinstance(levels, list) or not all(isinstance(v, str) for v in levels):
        raise ValueError("a finding's levels are not strings")
    severity = doc.get("severity")
    return Finding(
        rule=_str(doc, "rule"),
        message=_str(doc, "message"),
        target=_str(doc, "target"),
        method=_str(doc, "method", optional=True),
        parameter=_str(doc, "parameter", optional=True),
        hint=_str(doc, "hint"),
        contract_location=_read_location(doc.get("contract_location")),
        impl_location=_read_location(doc.get("impl_location")),
        severity=None if severity is None else Severity(severity),
        reproduction=_str(doc, "reproduction"),
        levels=tuple(levels),
    )


def _read_plain(value: object) -> object:
    if isinstance(value, dict):
        if set(value) == {_FINDING_TAG}:
            return _read_finding(value[_FINDING_TAG])
        return {k: _read_plain(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_read_plain(v) for v in value]
    return value


def result_from_json(text: str) -> CheckResult:
    """The result ``result_to_json`` wrote.

    :raises ValueError: ``text`` is not such a document (not JSON, a field of the wrong type,
        an unknown outcome, severity or rule id).
    """
    doc = json.loads(text)
    if not isinstance(doc, dict):
        raise ValueError("a check result is a JSON object")
    findings = doc.get("findings")
    extra = doc.get("extra")
    duration = doc.get("duration_s")
    if not isinstance(findings, list) or not isinstance(extra, dict):
        raise ValueError("findings or extra missing")
    if isinstance(duration, bool) or not isinstance(duration, (int, float)):
        raise ValueError("duration_s is not a number")
    read = _read_plain(extra)
    assert isinstance(read, dict)
    return CheckResult(
        target=_str(doc, "target"),
        check=_str(doc, "check"),
        outcome=Outcome(_str(doc, "outcome")),
        findings=tuple(_read_finding(f) for f in findings),
        detail=_str(doc, "detail"),
        duration_s=float(duration),
        extra=read,
    )
