"""The report pipeline is one library function: ``kvcache check``, ``kvcache drift`` and a
library caller get the same bytes for the same results, in every format; and the levels are
one tuple the runner iterates.

"Same results" needs a still clock: every result carries its duration, so the clock is frozen
while both sides run.
"""

from __future__ import annotations

import dataclasses
import time
from pathlib import Path

import pytest

from kvcache_core import cli, conformance
from kvcache_core.conformance import runner
from kvcache_core.conformance.results.model import CheckResult, Finding, Location, Outcome
from kvcache_core.conformance.results.suppressions import Suppression
from kvcache_core.conformance.results.usage import UsageError
from kvcache_core.conformance.source.drift import DRIFT_RULES, run_drift
from kvcache_core.conformance.targets.target import ClassTarget

from ._corpus import CORPUS

DRIFTED = str(CORPUS / "swa_missing_mamba.py")


@pytest.fixture
def still_clock(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(time, "perf_counter", lambda: 0.0)


@pytest.mark.parametrize("fmt", conformance.FORMATS)
def test_kvcache_check_prints_what_the_library_reports(
    fmt: str, tmp_path: Path, still_clock: None, isolated_modules: None
) -> None:
    out = tmp_path / f"report.{fmt}"
    argv = ["check", DRIFTED, "--level", "source,signature", "--format", fmt]
    code = cli.main([*argv, "--output", str(out)])
    library = conformance.check([DRIFTED], levels=["source,signature"], format=fmt)
    assert out.read_text(encoding="utf-8") == library.text
    assert code == library.exit_code == conformance.EXIT_FINDINGS
    # The findings both levels saw are merged into one each, as the command always did.
    seen = [f.levels for r in library.results for f in r.findings]
    assert seen and all(levels == ("source", "signature") for levels in seen)


@pytest.mark.parametrize("fmt", conformance.FORMATS)
def test_kvcache_drift_prints_what_the_library_reports(
    fmt: str, tmp_path: Path, still_clock: None
) -> None:
    out = tmp_path / f"drift.{fmt}"
    code = cli.main(["drift", DRIFTED, "--format", fmt, "--output", str(out)])
    found = run_drift([DRIFTED], methods=["get_cpu_copy", "load_cpu_copy", "set_kv_buffer"])
    library = conformance.report(
        found.results, fmt, scanned=found.suppression_files, active_rules=DRIFT_RULES
    )
    assert out.read_text(encoding="utf-8") == library.text
    assert code == library.exit_code == conformance.EXIT_FINDINGS


def _finding() -> Finding:
    return Finding(
        rule="missing-parameter",
        message="does not accept `mamba_indices`",
        target="m.Pool",
        method="get_cpu_copy",
        parameter="mamba_indices",
        impl_location=Location("/nonexistent/m.py", 3),
    )


def test_report_suppresses_then_merges_then_decides_the_exit_code() -> None:
    results = [
        CheckResult("m.Pool", "source", Outcome.FAILED, (_finding(),)),
        CheckResult("m.Pool", "signature:KVPool", Outcome.FAILED, (_finding(),)),
    ]
    merged = conformance.report(results, "json")
    assert merged.exit_code == conformance.EXIT_FINDINGS
    assert [f.levels for r in merged.results for f in r.findings] == [("source", "signature")]
    accepted = Suppression(
        rule="missing-parameter",
        reason="tracked in #1",
        origin=Location("/nonexistent/pyproject.toml", 9),
        target="m.Pool",
    )
    quiet = conformance.report(results, "text", suppressions=[accepted])
    assert quiet.exit_code == conformance.EXIT_OK
    assert not [f for r in quiet.results for f in r.findings]
    assert "tracked in #1" not in quiet.text and "0 findings" in quiet.text
    could_not_run = CheckResult("m.Pool", "types", Outcome.ERROR, detail="mypy is missing")
    assert conformance.report([could_not_run], "text").exit_code == conformance.EXIT_ERROR
    with pytest.raises(UsageError, match="unknown format 'yaml'; formats: text, json"):
        conformance.report(results, "yaml")


def test_levels_are_one_tuple_the_runner_iterates(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Adding a level is adding one entry: ``--level``, the run and the rules it can report
    follow the tuple."""
    assert tuple(level.name for level in conformance.LEVELS) == runner.ALL_LEVELS
    (tmp_path / "kvfake_level.py").write_text(
        "from kvcache_core.conformance.results.model import CheckResult, Outcome\n"
        "def run_level(targets, options):\n"
        "    return [CheckResult(t.name, 'fake', Outcome.PASSED,\n"
        "                        detail=f'contract {options.contract_version}') for t in targets]\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    fake = runner.ModuleLevel(
        "fake",
        "nothing",
        "kvfake_level",
        imports_targets=False,
        own_rules=frozenset({"load-error"}),
    )
    monkeypatch.setattr(runner, "LEVELS", (*conformance.LEVELS, fake))
    assert runner.parse_levels(["fake,source"]) == ("source", "fake")
    target = ClassTarget("m.Pool", "Pool", ("KVPool",), path=str(tmp_path / "nowhere.py"))
    results = runner.run_levels([target], ("source", "fake"), contract_version=1)
    assert [r.check for r in results][-1] == "fake"
    assert results[-1].detail == "contract 1"
    assert "load-error" not in runner.active_rules(("source",))
    assert "load-error" in runner.active_rules(("source", "fake"))
    broken = dataclasses.replace(fake, module="kvfake_no_such_level")
    monkeypatch.setattr(runner, "LEVELS", (*conformance.LEVELS, broken))
    (gone,) = runner.run_levels([target], ("fake",))
    assert gone.outcome is Outcome.ERROR
    assert gone.detail == (
        "fake level is not available in this kvcache (kvfake_no_such_level is missing)"
    )


def test_the_library_example_of_the_checker_page_runs_as_written(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, isolated_modules: None
) -> None:
    import re

    page = (Path(__file__).resolve().parents[2] / "docs" / "checker.md").read_text("utf-8")
    section = page[page.index("## The checker as a library") :]
    (code,) = re.findall(r"```python\n(.*?)```", section[: section.index("\n## ", 3)], re.S)
    monkeypatch.chdir(tmp_path)
    printed: list[object] = []
    namespace = {"print": printed.append}
    exec(compile(code.replace('"my_pools/"', repr(DRIFTED)), "checker.md", "exec"), namespace)
    assert printed == [conformance.EXIT_FINDINGS]
    sarif = (tmp_path / "kvcache.sarif").read_text(encoding="utf-8")
    assert '"ruleId": "missing-parameter"' in sarif


def test_a_bad_format_is_refused_before_anything_runs(monkeypatch: pytest.MonkeyPatch) -> None:
    def must_not_run(*args: object, **kwargs: object) -> None:
        raise AssertionError("a level ran")

    monkeypatch.setattr(runner, "run_levels", must_not_run)
    with pytest.raises(UsageError, match="unknown format 'yaml'"):
        conformance.check([DRIFTED], format="yaml")
