"""The text report: grouped by target, both locations and the hint, summary last."""

from __future__ import annotations

from pathlib import Path

from kvcache_core.conformance.behaviour.level import NO_SPEC
from kvcache_core.conformance.reporting.render import render
from kvcache_core.conformance.results.model import CheckResult


def test_grouped_by_target_in_order(results: list[CheckResult]) -> None:
    out = render(results, "text")
    headers = [line for line in out.splitlines() if line and not line.startswith(" ")]
    assert headers[:3] == ["pkg.pools.GoodPool", "pkg.pools.DriftPool", "plugin:broken"]


def test_findings_show_both_locations_and_hint(
    results: list[CheckResult], contract_file: Path
) -> None:
    out = render(results, "text")
    assert "  FAIL   types:OffloadablePool  (2 findings)" in out
    assert "error[type-error] get_cpu_copy(mamba_indices): `get_cpu_copy` does not match" in out
    assert "implementation: pkg/pools.py:40" in out  # relative to the working directory
    assert f"contract:       {contract_file}:71" in out  # outside it: as given
    assert "hint: match the contract: `def get_cpu_copy(...)`" in out
    assert "implementation: pkg/pools.py\n" in out  # no line known


def test_every_outcome_is_labelled(results: list[CheckResult]) -> None:
    out = render(results, "text")
    assert "  PASS   types:KVPool" in out
    assert "warning[annotation-mismatch] get_key_buffer(layer_id)" in out  # on a passing check
    assert "  XFAIL  source:KVPool  (1 finding)  known drift, tracked in #12" in out
    assert "  ERROR  types:KVPool  mypy could not check (exit status 2):" in out
    assert "\n         something broke\n" in out
    assert f"  SKIP   behaviour  {NO_SPEC}" in out


def test_summary_line(results: list[CheckResult]) -> None:
    last = render(results, "text").splitlines()[-1]
    assert last == (
        "7 checks on 3 targets: 2 passed, 1 failed, 2 errors, 1 skipped, 1 expected failure; "
        "5 findings (4 errors, 1 warning)"
    )
