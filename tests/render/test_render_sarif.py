"""SARIF 2.1.0: validated against a structural subset of the schema (the official schema cannot
be downloaded here; tests/render/sarif-2.1.0-subset.schema.json states what it keeps), plus the
properties code scanning relies on, checked by hand."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import jsonschema
import pytest

from kvcache_core.conformance.reporting.render import render
from kvcache_core.conformance.results.model import CheckResult
from kvcache_core.conformance.results.rules import RULES

SUBSET = Path(__file__).resolve().parent / "sarif-2.1.0-subset.schema.json"


@pytest.fixture
def log(results: list[CheckResult]) -> Any:
    return json.loads(render(results, "sarif"))


def _run(log: Any) -> Any:
    assert len(log["runs"]) == 1
    return log["runs"][0]


def test_structure(log: Any) -> None:
    schema = json.loads(SUBSET.read_text())
    jsonschema.Draft202012Validator.check_schema(schema)
    jsonschema.Draft202012Validator(schema).validate(log)
    assert log["version"] == "2.1.0"


def test_rules_are_the_stable_ids(log: Any) -> None:
    run = _run(log)
    rules = run["tool"]["driver"]["rules"]
    assert [r["id"] for r in rules] == list(RULES)
    for result in run["results"]:
        assert rules[result["ruleIndex"]]["id"] == result["ruleId"]
    levels = {r["id"]: r["defaultConfiguration"]["level"] for r in rules}
    assert levels["type-error"] == "error" and levels["annotation-mismatch"] == "warning"


def test_locations(log: Any, contract_file: Path) -> None:
    run = _run(log)
    results = run["results"]
    first = next(r for r in results if r["ruleId"] == "type-error")
    (where,) = first["locations"]
    assert where["physicalLocation"] == {
        "artifactLocation": {"uri": "pkg/pools.py", "uriBaseId": "%SRCROOT%"},
        "region": {"startLine": 40},
    }
    (related,) = first["relatedLocations"]
    assert related["physicalLocation"] == {
        "artifactLocation": {"uri": contract_file.as_uri()},
        "region": {"startLine": 71},
    }
    assert run["originalUriBaseIds"]["%SRCROOT%"]["uri"].endswith("/project/")
    missing = next(r for r in results if r["ruleId"] == "missing-method")
    assert "region" not in missing["locations"][0]["physicalLocation"]
    assert first["message"]["text"].endswith("Hint: match the contract: `def get_cpu_copy(...)`")
    assert first["properties"]["parameter"] == "mamba_indices"
    load = next(r for r in results if r["ruleId"] == "load-error")
    assert "locations" not in load


def test_expected_failure_is_suppressed_and_errors_are_notified(log: Any) -> None:
    run = _run(log)
    results = run["results"]
    xfail = next(r for r in results if r["ruleId"] == "renamed-parameter")
    assert xfail["suppressions"] == [
        {
            "kind": "external",
            "status": "accepted",
            "justification": "expected failure: known drift, tracked in #12",
        }
    ]
    assert all("suppressions" not in r for r in results if r is not xfail)
    (invocation,) = run["invocations"]
    assert invocation["executionSuccessful"] is False
    levels = [n["level"] for n in invocation["toolExecutionNotifications"]]
    assert levels == ["error", "note"]


def test_fingerprints_are_stable_and_distinct(results: list[CheckResult]) -> None:
    def prints(text: str) -> list[str]:
        return [
            r["partialFingerprints"]["kvcacheFinding/v1"] for r in _run(json.loads(text))["results"]
        ]

    once, again = prints(render(results, "sarif")), prints(render(results, "sarif"))
    assert once == again and len(set(once)) == len(once)
