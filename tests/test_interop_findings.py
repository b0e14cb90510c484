"""``make interop``'s table check, without sglang: finding ids, the "Coming from sglang" table
parser, and the comparison that fails the run on a difference the table does not list.

The interop run itself needs sglang (a download), so CI holds its logic to stand-in results of
the checker's own model instead.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

from kvcache_core.conformance.results.model import CheckResult, Finding, Outcome

ROOT = Path(__file__).resolve().parents[1]


def _findings_module():
    name = "kvcache_interop_findings"
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, ROOT / "interop" / "findings.py")
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
    return sys.modules[name]


findings = _findings_module()

TABLE = """
## Coming from sglang

| id | sglang | kvcache | test |
|---|---|---|---|
| `double-free` | twice | once | `tests/x.py::test_a` |
| `renamed-parameter:free(indices)` `behaviour/kv-size-bytes` | a | b | `tests/x.py::test_b` |

### `make interop`: the differential run

| `not-a-row-of-the-table` | x | y | z |
"""


def _result(check: str, *found: Finding) -> CheckResult:
    return CheckResult("t", check, Outcome.FAILED, tuple(found))


def test_ids_of_static_and_behaviour_findings() -> None:
    renamed = Finding("renamed-parameter", "m", "pkg.Alloc", method="free", parameter="indices")
    attr = Finding("missing-attribute", "m", "pkg.Pool", parameter="swa_layer_ids")
    member = Finding("type-error", "m", "pkg.Pool", method="device")
    failed = Finding("behaviour-failed", "m", "pool:sglang-mha")
    ids = findings.result_ids(
        [
            _result("source:TokenAllocator", renamed),
            _result("source:SlidingWindowPool", attr),
            _result("types:KVPool", member),
            _result("behaviour/kv-size-bytes", failed),
        ]
    )
    assert set(ids) == {
        "renamed-parameter:free(indices)",
        "missing-attribute:swa_layer_ids",
        "type-error:device",
        "behaviour/kv-size-bytes",
    }
    assert ids["type-error:device"].startswith("t: m")


def test_the_parser_reads_every_id_of_the_first_column_and_stops_at_the_next_heading() -> None:
    assert findings.documented_ids(TABLE) == {
        "double-free",
        "renamed-parameter:free(indices)",
        "behaviour/kv-size-bytes",
    }


def test_the_real_table_holds_probe_and_checker_ids() -> None:
    ids = findings.documented_ids()
    checker = {i for i in ids if findings.is_checker_id(i)}
    probes = ids - checker
    assert {"double-free", "scales-in-place", "snapshot-type"} <= probes
    assert {
        "renamed-parameter:set_kv_buffer(loc)",
        "renamed-parameter:load_cpu_copy(snapshot)",
        "renamed-parameter:free(indices)",
        "type-error:device",
        "missing-attribute:swa_layer_ids",
        "behaviour/kv-size-bytes",
        "behaviour/write-forms-agree",
        "behaviour/allocator-state-machine",
        "behaviour/bad-reload-rejected",
    } <= checker
    assert not set(findings.KNOWN_FALSE_POSITIVES) & ids  # a false positive is not a difference


def test_an_undocumented_finding_fails_and_a_documented_one_does_not() -> None:
    documented = findings.documented_ids(TABLE)
    observed = {
        "renamed-parameter:free(indices)": "t: renamed",
        "behaviour/kv-size-bytes": "t: tuple",
        "type-error:device": "t: `device` does not match",
    }
    comparison = findings.Comparison(observed, documented, false_positives={})
    assert not comparison.ok
    assert list(comparison.undocumented) == ["type-error:device"]
    report = comparison.report(unseen_from=documented)
    assert any(line.startswith("UNDOCUMENTED type-error:device: t: `device`") for line in report)
    assert any("not observed: double-free" in line for line in report)
    del observed["type-error:device"]
    assert findings.Comparison(observed, documented, false_positives={}).ok


def test_a_row_removed_from_the_table_fails_the_run() -> None:
    without = TABLE.replace("| `renamed-parameter:free(indices)` `behaviour/kv-size-bytes` |", "|")
    observed = {"renamed-parameter:free(indices)": "t: renamed"}
    assert findings.Comparison(observed, findings.documented_ids(TABLE), false_positives={}).ok
    assert not findings.Comparison(observed, findings.documented_ids(without), {}).ok


def test_known_false_positives_pass_and_say_when_they_are_gone() -> None:
    fp = {"behaviour/allocator-forwards-offload": "binds by name"}
    seen = findings.Comparison({"behaviour/allocator-forwards-offload": "t"}, set(), fp)
    assert seen.ok and seen.stale_false_positives == []
    assert any(line.startswith("known false positive") for line in seen.report())
    gone = findings.Comparison({}, set(), fp)
    assert gone.stale_false_positives == ["behaviour/allocator-forwards-offload"]
    assert any("no longer reported" in line for line in gone.report())
