"""Behaviour failures never merge with each other: a pool failing five checks gets five
findings, each with its own message and reproduction, in every output format (the merge of
findings across levels must not treat two behaviour checks as two levels)."""

from __future__ import annotations

import argparse
import json
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from kvcache_core.commands._output import finish
from kvcache_core.conformance.behaviour import run_spec
from kvcache_core.conformance.results.model import CheckResult

from .five_failures import FIVE_CHECKS, FIVE_FAILURES


@pytest.fixture(scope="module")
def results() -> list[CheckResult]:
    return run_spec(FIVE_FAILURES)


def _render(results: list[CheckResult], fmt: str, tmp_path: Path) -> str:
    out = tmp_path / f"report.{fmt}"
    args = argparse.Namespace(format=fmt, output=str(out))
    assert finish(args, results, configured=[], scanned=[]) == 1
    return out.read_text(encoding="utf-8")


def _messages(results: list[CheckResult]) -> dict[str, tuple[str, str]]:
    """check id -> (message, reproduction) of its one finding."""
    out: dict[str, tuple[str, str]] = {}
    for r in results:
        for f in r.findings:
            out[r.check.removeprefix("behaviour/")] = (f.message, f.reproduction)
    return out


def test_the_pool_fails_exactly_five_checks(results: list[CheckResult]) -> None:
    found = _messages(results)
    assert set(found) == FIVE_CHECKS
    assert len({m for m, _ in found.values()}) == 5  # five different messages
    assert len({r for _, r in found.values()}) == 5  # and five different reproductions


def test_json_keeps_five_findings(results: list[CheckResult], tmp_path: Path) -> None:
    doc = json.loads(_render(results, "json", tmp_path))
    findings = [f for r in doc["results"] for f in r["findings"]]
    assert len(findings) == 5
    assert {f["message"] for f in findings} == {m for m, _ in _messages(results).values()}
    assert all(f["reproduction"].strip() for f in findings)
    assert len({f["reproduction"] for f in findings}) == 5
    assert not any(r.get("extra", {}).get("merged") for r in doc["results"])


def test_text_shows_five_messages_and_no_merge_note(
    results: list[CheckResult], tmp_path: Path
) -> None:
    text = _render(results, "text", tmp_path)
    assert "reported under" not in text
    for message, _ in _messages(results).values():
        assert message.splitlines()[0][:60] in text
    assert text.count("reproduction:") == 5
    assert "5 findings" in text


def test_junit_has_five_failures_each_with_a_reproduction(
    results: list[CheckResult], tmp_path: Path
) -> None:
    root = ET.fromstring(_render(results, "junit", tmp_path).split("\n", 1)[1])
    failures = list(root.iter("failure"))
    assert len(failures) == 5
    assert all("reproduction:" in (f.text or "") for f in failures)


def test_sarif_has_five_results(results: list[CheckResult], tmp_path: Path) -> None:
    log = json.loads(_render(results, "sarif", tmp_path))
    found = [r for run in log["runs"] for r in run["results"]]
    assert len(found) == 5
    texts = {r["message"]["text"] for r in found}
    assert len(texts) == 5


def test_github_has_five_annotations(results: list[CheckResult], tmp_path: Path) -> None:
    lines = [
        line
        for line in _render(results, "github", tmp_path).splitlines()
        if line.startswith("::error")
    ]
    assert len(lines) == 5
    assert len(set(lines)) == 5
