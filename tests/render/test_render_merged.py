"""One drift seen by three levels is one finding in every format, listing the levels."""

from __future__ import annotations

import json
import xml.etree.ElementTree as ET
from pathlib import Path

import jsonschema
import pytest

from kvcache_core.conformance.reporting.render import render
from kvcache_core.conformance.results.merge import merge_levels
from kvcache_core.conformance.results.model import CheckResult, Finding, Location, Outcome

SCHEMA_PATH = Path(__file__).resolve().parents[2] / "docs" / "checker-json-schema.json"
LEVELS = ["source", "signature", "types"]


@pytest.fixture
def merged(project: Path, contract_file: Path) -> list[CheckResult]:
    impl = Location(str(project / "pkg" / "pools.py"), 20)
    contract = Location(str(contract_file), 61)
    results = [
        CheckResult(
            "pkg.pools.DriftPool",
            f"{level}:OffloadablePool",
            Outcome.FAILED,
            (
                Finding(
                    rule="missing-parameter",
                    message=f"does not accept `mamba_indices` ({level})",
                    target="pkg.pools.DriftPool",
                    method="get_cpu_copy",
                    parameter="mamba_indices",
                    hint="add `mamba_indices: torch.Tensor | None = None`",
                    contract_location=contract,
                    impl_location=impl,
                ),
            ),
        )
        for level in LEVELS
    ]
    return merge_levels(results)


def test_text(merged: list[CheckResult]) -> None:
    text = render(merged, "text")
    assert text.count("error[missing-parameter]") == 1
    assert "seen by:        source, signature, types" in text
    assert "reported under source:OffloadablePool" in text
    assert text.rstrip().endswith("1 finding (1 error, 0 warnings)")


def test_json(merged: list[CheckResult]) -> None:
    document = json.loads(render(merged, "json"))
    schema = json.loads(SCHEMA_PATH.read_text())
    jsonschema.validators.validator_for(schema)(schema).validate(document)
    findings = [f for r in document["results"] for f in r["findings"]]
    assert [f["levels"] for f in findings] == [LEVELS]
    assert document["summary"]["findings"] == 1
    assert document["summary"]["outcomes"]["failed"] == 3
    assert document["results"][1]["extra"]["merged"] == [
        {
            "rule": "missing-parameter",
            "method": "get_cpu_copy",
            "parameter": "mamba_indices",
            "reported_under": "source:OffloadablePool",
        }
    ]


def test_sarif(merged: list[CheckResult]) -> None:
    log = json.loads(render(merged, "sarif"))
    (result,) = log["runs"][0]["results"]
    assert result["properties"]["levels"] == LEVELS
    assert result["properties"]["check"] == "source:OffloadablePool"


def test_junit(merged: list[CheckResult]) -> None:
    root = ET.fromstring(render(merged, "junit"))
    failures = root.findall(".//failure")
    assert len(failures) == 3  # each level's check did fail ...
    texts = [f.text or "" for f in failures]
    assert sum("error[missing-parameter]" in t for t in texts) == 1  # ... on one finding
    assert "seen by: source, signature, types" in texts[0]
    assert all("reported under source:OffloadablePool" in t for t in texts[1:])


def test_github(merged: list[CheckResult]) -> None:
    lines = render(merged, "github").splitlines()
    annotations = [line for line in lines if line.startswith("::error")]
    assert len(annotations) == 1
    assert "seen by source%2C signature%2C types" in annotations[0]
    assert lines[-1].endswith("1 finding (1 error, 0 warnings)")
