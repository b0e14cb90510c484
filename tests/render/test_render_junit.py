"""JUnit XML parses, has one testcase per (target, check), and maps every outcome."""

from __future__ import annotations

import xml.etree.ElementTree as ET

from kvcache_core.conformance.behaviour.level import NO_SPEC
from kvcache_core.conformance.reporting.render import render
from kvcache_core.conformance.results.model import CheckResult


def _root(results: list[CheckResult]) -> ET.Element:
    out = render(results, "junit")
    assert out.startswith("<?xml")
    return ET.fromstring(out)


def test_suites_and_counts(results: list[CheckResult]) -> None:
    root = _root(results)
    assert root.tag == "testsuites"
    assert {k: root.get(k) for k in ("tests", "failures", "errors", "skipped")} == {
        "tests": "7",
        "failures": "1",
        "errors": "2",
        "skipped": "2",
    }
    suites = root.findall("testsuite")
    assert [s.get("name") for s in suites] == [
        "pkg.pools.GoodPool",
        "pkg.pools.DriftPool",
        "plugin:broken",
    ]
    cases = [(c.get("classname"), c.get("name")) for c in root.iter("testcase")]
    assert cases == [(r.target, r.check) for r in results]


def _case(root: ET.Element, target: str, check: str) -> ET.Element:
    return next(
        c for c in root.iter("testcase") if (c.get("classname"), c.get("name")) == (target, check)
    )


def test_outcomes(results: list[CheckResult]) -> None:
    root = _root(results)
    passed = _case(root, "pkg.pools.GoodPool", "types:KVPool")
    assert list(passed) == []
    warned = _case(root, "pkg.pools.GoodPool", "signature:KVPool")
    assert [e.tag for e in warned] == ["system-out"]
    failed = _case(root, "pkg.pools.DriftPool", "types:OffloadablePool")
    (failure,) = failed.findall("failure")
    assert failure.get("type") == "type-error"
    assert (failure.get("message") or "").startswith("2 findings: `get_cpu_copy` does not match")
    text = failure.text or ""
    assert "implementation: pkg/pools.py:40" in text
    assert "contract:" in text and ":71" in text
    assert "hint: match the contract" in text
    xfail = _case(root, "pkg.pools.DriftPool", "source:KVPool").find("skipped")
    assert xfail is not None and xfail.get("type") == "expected-failure"
    assert "renamed-parameter" in (xfail.text or "")
    error = _case(root, "plugin:broken", "types:KVPool").find("error")
    assert error is not None and "something broke" in (error.text or "")
    skipped = _case(root, "plugin:broken", "behaviour").find("skipped")
    assert skipped is not None and skipped.get("message") == NO_SPEC.splitlines()[0]


def test_text_that_xml_cannot_carry_is_replaced(results: list[CheckResult]) -> None:
    failure = _case(_root(results), "pkg.pools.DriftPool", "types:OffloadablePool").find("failure")
    assert failure is not None
    assert '<&> "100%"' in (failure.text or "")  # escaped on the way out, intact on the way in
    assert "\x07" not in (failure.text or "") and "\ufffd bell" in (failure.text or "")
