"""Findings that agree across levels are merged into one that lists the levels."""

from __future__ import annotations

from kvcache_core.conformance.reporting.render._common import summarize
from kvcache_core.conformance.results.merge import level_of, merge_levels
from kvcache_core.conformance.results.model import CheckResult, Finding, Location, Outcome


def _finding(parameter: str | None = "mamba_indices", rule: str = "missing-parameter", **kw):
    return Finding(
        rule=rule,
        message="m",
        target="pkg.Pool",
        method="get_cpu_copy",
        parameter=parameter,
        impl_location=Location("/x/pkg.py", 3),
        **kw,
    )


def test_level_of():
    assert level_of("source:KVPool") == "source"
    assert level_of("drift:overrides") == "drift"
    assert level_of("load") == "load"
    assert level_of("behaviour/write-isolation") == "behaviour"


def test_the_same_finding_from_three_levels_is_one():
    results = [
        CheckResult("pkg.Pool", f"{lv}:OffloadablePool", Outcome.FAILED, (_finding(),))
        for lv in ("source", "signature", "types")
    ]
    merged = merge_levels(results)
    assert [len(r.findings) for r in merged] == [1, 0, 0]
    (f,) = merged[0].findings
    assert (f.rule, f.method, f.parameter) == ("missing-parameter", "get_cpu_copy", "mamba_indices")
    assert f.levels == ("source", "signature", "types")
    assert [r.outcome for r in merged] == [Outcome.FAILED] * 3
    assert "reported under source:OffloadablePool" in merged[2].detail
    assert summarize(merged).findings == 1
    assert summarize(results).findings == 3


def test_findings_that_differ_are_kept_apart():
    results = [
        CheckResult(
            "pkg.Pool",
            "source:OffloadablePool",
            Outcome.FAILED,
            (_finding(), _finding("indices", rule="renamed-parameter")),
        ),
        CheckResult(
            "pkg.Pool",
            "signature:OffloadablePool",
            Outcome.FAILED,
            (_finding("indices"), _finding(rule="kwargs-hides-parameter")),
        ),
    ]
    merged = merge_levels(results)
    assert [len(r.findings) for r in merged] == [2, 2]
    assert all(f.levels == ("source",) for f in merged[0].findings)
    assert all(f.levels == ("signature",) for f in merged[1].findings)


def test_two_findings_of_one_level_with_the_same_key_both_stay():
    a = Finding("unresolved-base", "base A", "pkg.Pool", impl_location=Location("/x.py", 1))
    b = Finding("unresolved-base", "base B", "pkg.Pool", impl_location=Location("/x.py", 1))
    (result,) = merge_levels([CheckResult("pkg.Pool", "source:KVPool", Outcome.PASSED, (a, b))])
    assert [f.message for f in result.findings] == ["base A", "base B"]


def test_cli_reports_one_finding_per_drift(run_cli, tmp_path, isolated_modules):
    (tmp_path / "merged_narrow.py").write_text(
        "import torch\n"
        "\n"
        "\n"
        "class NarrowPool:\n"
        "    def get_cpu_copy(self, indices: torch.Tensor) -> object:\n"
        "        return None\n"
        "\n"
        "    def load_cpu_copy(self, snapshot: object, indices: torch.Tensor) -> None:\n"
        "        return None\n"
    )
    (tmp_path / "pyproject.toml").write_text("")
    run = run_cli(
        "check",
        "merged_narrow.py",
        "--against",
        "OffloadablePool",
        "--level",
        "source,signature",
        cwd=tmp_path,
    )
    assert run.code == 1, run.err
    found = sorted(
        (f.method, f.parameter, f.impl_location.line, f.levels)
        for f in run.findings("missing-parameter")
    )
    assert found == [
        ("get_cpu_copy", "mamba_indices", 5, ("source", "signature")),
        ("load_cpu_copy", "mamba_indices", 8, ("source", "signature")),
    ]


def test_mypy_seeing_the_same_parameter_drift_is_merged_into_the_precise_rule():
    results = [
        CheckResult("pkg.Pool", "source:OffloadablePool", Outcome.FAILED, (_finding(),)),
        CheckResult("pkg.Pool", "signature:OffloadablePool", Outcome.FAILED, (_finding(),)),
        CheckResult(
            "pkg.Pool", "types:OffloadablePool", Outcome.FAILED, (_finding(rule="type-error"),)
        ),
    ]
    merged = merge_levels(results)
    assert [len(r.findings) for r in merged] == [1, 0, 0]
    (f,) = merged[0].findings
    assert (f.rule, f.parameter, f.levels) == (
        "missing-parameter",
        "mamba_indices",
        ("source", "signature", "types"),
    )
    assert summarize(merged).findings == 1


def test_mypy_errors_stay_apart_from_warnings_and_from_parameterless_findings():
    warning = _finding(rule="annotation-mismatch")
    results = [
        CheckResult("pkg.Pool", "source:KVPool", Outcome.PASSED, (warning,)),
        CheckResult(
            "pkg.Pool",
            "types:KVPool",
            Outcome.FAILED,
            (_finding(rule="type-error"), _finding(None, rule="type-error")),
        ),
    ]
    merged = merge_levels(results)
    assert [[g.rule for g in r.findings] for r in merged] == [
        ["annotation-mismatch"],
        ["type-error", "type-error"],
    ]
