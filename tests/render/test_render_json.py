"""The JSON output validates against docs/checker-json-schema.json and carries the whole model."""

from __future__ import annotations

import json
from pathlib import Path

import jsonschema
import pytest

from kvcache_core.conformance.reporting.render import render
from kvcache_core.conformance.results.model import CheckResult

SCHEMA_PATH = Path(__file__).resolve().parents[2] / "docs" / "checker-json-schema.json"


@pytest.fixture(scope="module")
def validator() -> jsonschema.protocols.Validator:
    schema = json.loads(SCHEMA_PATH.read_text())
    cls = jsonschema.validators.validator_for(schema)
    cls.check_schema(schema)
    return cls(schema)


def test_validates_against_the_documented_schema(
    results: list[CheckResult], validator: jsonschema.protocols.Validator
) -> None:
    document = json.loads(render(results, "json"))
    validator.validate(document)
    validator.validate(json.loads(render([], "json")))


def test_schema_rejects_what_it_should(
    results: list[CheckResult], validator: jsonschema.protocols.Validator
) -> None:
    document = json.loads(render(results, "json"))
    document["results"][2]["outcome"] = "maybe"
    with pytest.raises(jsonschema.ValidationError):
        validator.validate(document)
    document = json.loads(render(results, "json"))
    document["schema_version"] = 2
    with pytest.raises(jsonschema.ValidationError):
        validator.validate(document)


def test_carries_the_whole_model(results: list[CheckResult]) -> None:
    document = json.loads(render(results, "json"))
    assert document["schema_version"] == 1
    assert document["tool"]["name"] == "kvcache"
    assert document["summary"]["outcomes"] == {
        "passed": 2,
        "failed": 1,
        "error": 2,
        "skipped": 1,
        "expected-failure": 1,
    }
    assert document["summary"]["severities"] == {"error": 4, "warning": 1, "note": 0}
    drift = document["results"][2]
    assert (drift["target"], drift["check"], drift["outcome"]) == (
        "pkg.pools.DriftPool",
        "types:OffloadablePool",
        "failed",
    )
    first = drift["findings"][0]
    assert first["parameter"] == "mamba_indices"
    assert first["impl_location"]["line"] == 40  # paths are kept as the model has them
    assert first["contract_location"]["line"] == 71
    assert drift["findings"][1]["impl_location"]["line"] is None
    assert document["results"][4]["findings"][0]["impl_location"] is None


def test_extra_is_plain_json(results: list[CheckResult]) -> None:
    extra = json.loads(render(results, "json"))["results"][6]["extra"]
    assert extra["nested"] == {"values": [1, 2.5, None]}
    assert extra["why"].startswith("<object object")
