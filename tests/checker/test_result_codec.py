"""Check results cross processes as JSON, never pickle: every result the checker makes comes
back equal, and a report attribute holding a pickle (which ran code when read) is refused."""

from __future__ import annotations

import base64
import pickle
from pathlib import Path
from types import SimpleNamespace

import pytest

from kvcache_core.conformance.results.codec import result_from_json, result_to_json
from kvcache_core.conformance.results.model import CheckResult, Finding, Location, Outcome
from kvcache_core.conformance.results.rules import Severity

FINDING = Finding(
    rule="behaviour-failed",
    message="read back different rows ✓",
    target="pool:mha",
    method="load_cpu_copy",
    parameter="indices",
    hint="see the reproduction",
    contract_location=Location("kvcache_core/contracts/pool.py", 10),
    impl_location=Location("plugin.py"),
    reproduction="pool.load_cpu_copy(snap, idx)",
    levels=("source", "types"),
)

RESULTS = [
    CheckResult("pool:mha", "behaviour/round-trip", Outcome.PASSED, duration_s=0.25),
    CheckResult(
        "pool:mha",
        "behaviour/x",
        Outcome.FAILED,
        (FINDING, Finding(rule="store-check-failed", message="m", target="store:memory:")),
        detail="two lines\nof detail",
        extra={"pool_seconds": 1.5, "suppressed": [{"rule": "r", "reason": "why", "by": "x"}]},
    ),
    CheckResult(
        "pool:swa",
        "behaviour/y",
        Outcome.EXPECTED_FAILURE,
        detail="declared",
        extra={"finding": FINDING, "merged": [{"rule": "r", "method": None}]},
    ),
    CheckResult("pool:z", "types", Outcome.SKIPPED, detail="no mypy", extra={"mypy_seconds": 3}),
]


@pytest.mark.parametrize("result", RESULTS, ids=lambda r: r.check)
def test_every_result_round_trips(result: CheckResult) -> None:
    back = result_from_json(result_to_json(result))
    assert back == result and back.extra == result.extra
    assert all(f.severity in Severity for f in back.findings)


@pytest.mark.parametrize(
    "text",
    [
        "not json",
        "[]",
        '{"target": 1}',
        result_to_json(RESULTS[0]).replace('"passed"', '"exploded"'),
        result_to_json(RESULTS[1]).replace('"behaviour-failed"', '"no-such-rule"'),
    ],
)
def test_what_is_not_a_result_is_refused(text: str) -> None:
    with pytest.raises(ValueError):
        result_from_json(text)


class _Marker:
    def __init__(self, path: Path) -> None:
        self.path = path

    def __reduce__(self) -> tuple[object, ...]:
        return (Path.touch, (self.path,))  # what unpickling it runs


def test_a_pickled_report_attribute_is_never_unpickled(tmp_path: Path) -> None:
    """A test report carrying a pickle under the plugin's attribute name (from any plugin or
    worker): the report writer used to ``pickle.loads`` it, running its code."""
    from kvcache_core import pytest_plugin

    marker = tmp_path / "ran"
    payload = base64.b64encode(pickle.dumps(_Marker(marker))).decode("ascii")
    writer = pytest_plugin._ReportWriter(SimpleNamespace(), [])  # type: ignore[arg-type]
    report = SimpleNamespace(when="call", nodeid="t", kvcache_conformance_result=payload)
    with pytest.warns(pytest.PytestWarning, match="unreadable"):
        writer.pytest_runtest_logreport(report)  # type: ignore[arg-type]
    assert not marker.exists()
    assert writer.results == {}
    report.kvcache_conformance_result = result_to_json(RESULTS[1])
    writer.pytest_runtest_logreport(report)  # type: ignore[arg-type]
    assert writer.results == {"t": RESULTS[1]}
