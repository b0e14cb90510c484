"""Behaviour findings in every format: the reproduction snippet is always shown, and a pool's
battery time appears next to it in the text report."""

from __future__ import annotations

import json
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from kvcache_core.conformance.reporting.render import render
from kvcache_core.conformance.results.model import CheckResult, Finding, Outcome

REPRO = (
    "import torch\n"
    "pool, allocator = factory(config)\n"
    'assert torch.equal(pool.get_key_buffer(1)[rows], k), "100%: a,b"'
)


@pytest.fixture
def behaviour_results(project: Path) -> list[CheckResult]:
    finding = Finding(
        rule="behaviour-failed",
        message="behaviour/write-isolation: set_kv_buffer on layer 0 changed layer 1 key: slot 6",
        target="pool:leaky",
        hint="index only the written layer's buffers",
        reproduction=REPRO,
    )
    return [
        CheckResult(
            "pool:leaky",
            "behaviour/write-isolation",
            Outcome.FAILED,
            (finding,),
            duration_s=0.01,
            extra={"pool_seconds": 0.25},
        ),
        CheckResult("pool:leaky", "behaviour/write-readback", Outcome.PASSED, duration_s=0.01),
    ]


def test_text_shows_reproduction_as_an_indented_block_and_pool_time(
    behaviour_results: list[CheckResult],
) -> None:
    out = render(behaviour_results, "text")
    assert "pool:leaky  (behaviour checks: 0.25 s)\n" in out
    assert "  FAIL   behaviour/write-isolation  (1 finding)" in out
    block = "\n".join(f"             {line}" for line in REPRO.splitlines())
    assert "           reproduction:\n" + block + "\n" in out


def test_json_has_the_reproduction_field(behaviour_results: list[CheckResult]) -> None:
    document = json.loads(render(behaviour_results, "json"))
    finding = document["results"][0]["findings"][0]
    assert finding["reproduction"] == REPRO
    assert document["results"][0]["extra"]["pool_seconds"] == 0.25


def test_json_validates_against_the_schema(behaviour_results: list[CheckResult]) -> None:
    import jsonschema  # a dev dependency: missing is a failure, not a skip

    schema_path = Path(__file__).resolve().parents[2] / "docs" / "checker-json-schema.json"
    schema = json.loads(schema_path.read_text(encoding="utf-8"))
    jsonschema.validate(json.loads(render(behaviour_results, "json")), schema)


def test_junit_failure_body_holds_the_reproduction(behaviour_results: list[CheckResult]) -> None:
    root = ET.fromstring(render(behaviour_results, "junit").split("\n", 1)[1])
    (failure,) = root.iter("failure")
    assert failure.text is not None
    assert "reproduction:" in failure.text
    assert 'assert torch.equal(pool.get_key_buffer(1)[rows], k), "100%: a,b"' in failure.text


def test_sarif_message_and_properties_hold_the_reproduction(
    behaviour_results: list[CheckResult],
) -> None:
    log = json.loads(render(behaviour_results, "sarif"))
    (result,) = log["runs"][0]["results"]
    assert result["properties"]["reproduction"] == REPRO
    assert result["message"]["text"].endswith("Reproduction:\n" + REPRO)


def test_github_annotation_carries_the_escaped_reproduction(
    behaviour_results: list[CheckResult],
) -> None:
    (annotation,) = [
        line for line in render(behaviour_results, "github").splitlines() if line.startswith("::")
    ]
    assert annotation.startswith("::error ")
    message = annotation.split("::", 2)[2]
    assert "\n" not in message
    assert "Reproduction:%0Aimport torch%0Apool, allocator = factory(config)%0A" in message
    assert '"100%25: a,b"' in message  # % escaped as GitHub requires


def test_json_renders_an_expected_failures_finding_with_its_reproduction(
    behaviour_results: list[CheckResult],
) -> None:
    (finding,) = behaviour_results[0].findings
    xfail = CheckResult(
        "pool:leaky",
        "behaviour/write-isolation",
        Outcome.EXPECTED_FAILURE,
        detail="known leak, tracked in #8",
        extra={"finding": finding},
    )
    document = json.loads(render([xfail], "json"))
    assert document["results"][0]["extra"]["finding"]["reproduction"] == REPRO
    assert document["summary"]["findings"] == 0
