"""``pytest --kvcache-conformance`` and ``kvcache_core.testing``, run the way a pool author
runs them: real pytest sessions (``pytester``) over real plugins installed as distributions
(a ``.dist-info`` with entry points on ``sys.path``; nothing in discovery is mocked).

The installed plugin ``kvc_gallery`` provides a pool that writes through an alias of ``loc``
(it fails ``write-forms-agree``) under three names: plain, expected to fail on its spec, and
expected to fail in ``pyproject.toml``; and a conforming pool whose spec declares a stale
expected failure. ``kvc_broken`` fails to import.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import tomllib
from _battery_helpers import GALLERY_PLUGIN, PLUGIN, install

from kvcache_core import discover
from kvcache_core.conformance.behaviour import select_checks

pytest_plugins = ["pytester"]

ROOT = Path(__file__).resolve().parent.parent
PYPROJECT = """
[tool.kvcache.expected-failures]
"brk-tomlxfail/write-forms-agree" = "aliases loc, tracked in #8"
"""


@pytest.fixture
def project(pytester: pytest.Pytester) -> pytest.Pytester:
    pytester.makepyfile(kvc_gallery=GALLERY_PLUGIN, kvc_broken="raise ImportError('no gpu')")
    install(pytester.path, "kvc-gallery", "kvcache.pools", {"kvc_gallery": "kvc_gallery"})
    install(pytester.path, "kvc-broken", "kvcache.pools", {"kvc_broken": "kvc_broken"})
    pytester.makefile(".toml", pyproject=PYPROJECT)
    pytester.syspathinsert()
    return pytester


def run(project: pytest.Pytester, *args: str) -> pytest.RunResult:
    """An in-process pytest run with the plugin. pytester drops every module a run imports, so
    plugins that import big packages (hypothesis) are turned off to keep each run quick."""
    return project.runpytest("-p", PLUGIN, "-p", "no:hypothesispytest", "-p", "no:xdist", *args)


def ids(pool: str) -> list[str]:
    """The test ids the battery must produce for ``pool``: whatever checks are registered."""
    spec = discover().spec(pool)
    return [f"test_kvcache_conformance[{pool}-behaviour/{c.id}]" for c in select_checks(spec)]


def test_loading_the_plugin_imports_no_torch() -> None:
    code = f"import sys, {PLUGIN}; print('torch' in sys.modules)"
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    ).stdout
    assert out.strip() == "False"


def test_every_public_name_of_the_lazy_package_resolves() -> None:
    """``kvcache_core`` imports its names on first use (so the plugin can be light): each one
    in ``__all__`` must still resolve, to the object its defining module has.

    In a fresh interpreter: pytester's in-process runs drop the modules they imported, so in
    this process a name cached during one of them may belong to a module imported again since.
    """
    script = textwrap.dedent(
        """
        import importlib
        import kvcache_core

        for name in kvcache_core.__all__:
            value = getattr(kvcache_core, name)
            if name != "__version__":
                module = importlib.import_module(kvcache_core._LAZY[name], "kvcache_core")
                assert value is getattr(module, name), name
        assert set(kvcache_core.__all__) <= set(dir(kvcache_core))
        try:
            kvcache_core.no_such_name
        except AttributeError as exc:
            assert "no_such_name" in str(exc)
        else:
            raise AssertionError("an unknown name resolved")
        print("ok")
        """
    )
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=120, check=False
    )
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr


def test_one_test_per_pool_and_check_with_readable_ids(project: pytest.Pytester) -> None:
    result = run(project, "--co", "-q", "--kvcache-conformance=brk-alias")
    assert result.ret == 0
    collected = [line for line in result.outlines if line.startswith("test_kvcache")]
    assert collected == ids("brk-alias")


def test_a_failing_check_is_a_failing_test_showing_the_finding(
    project: pytest.Pytester,
) -> None:
    result = run(project, "--kvcache-conformance=brk-alias", "-k", "write-forms-agree")
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(
        [
            "*_ test_kvcache_conformance[[]brk-alias-behaviour/write-forms-agree[]] _*",
            "[[]behaviour-failed[]] pool:brk-alias: behaviour/write-forms-agree: raised *",
            "hint: unwrap `loc` with kvcache_core.unwrap_write_loc(loc)*",
            "reproduction:",
            "    spec = installed_spec('brk-alias')  # *",
        ]
    )
    assert "_call(" not in result.stdout.str()  # no traceback through the harness


def test_expected_failures_on_the_spec_and_in_pyproject_are_xfails(
    project: pytest.Pytester,
) -> None:
    result = run(
        project,
        "--kvcache-conformance=brk-specxfail,brk-tomlxfail",
        "-k",
        "write-forms-agree",
        "-rx",
    )
    result.assert_outcomes(xfailed=2)
    result.stdout.fnmatch_lines_random(
        [
            "XFAIL*brk-specxfail-behaviour/write-forms-agree* - aliases loc, tracked in #7 "
            "(declared in PoolSpec 'brk-specxfail')",
            "XFAIL*brk-tomlxfail-behaviour/write-forms-agree* - aliases loc, tracked in #8 "
            f"(declared in {project.path / 'pyproject.toml'})",
        ]
    )


def test_an_expected_failure_that_passes_fails_the_run(project: pytest.Pytester) -> None:
    result = run(project, "--kvcache-conformance=brk-stale", "-k", "write-forms-agree")
    result.assert_outcomes(failed=1)
    assert result.ret == pytest.ExitCode.TESTS_FAILED
    result.stdout.fnmatch_lines(
        [
            "[[]XPASS(strict)[]] behaviour/write-forms-agree passed on pool 'brk-stale', but "
            "PoolSpec 'brk-stale' declares it an expected failure (fixed long ago). Remove that "
            "declaration*"
        ]
    )


def test_an_unknown_name_is_a_usage_error_naming_the_installed_ones(
    project: pytest.Pytester,
) -> None:
    result = run(project, "--kvcache-conformance=brk-alias,nope")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(
        [
            "ERROR: --kvcache-conformance: no installed kvcache pool or plugin is named 'nope'; "
            "pools: brk-alias, brk-specxfail, brk-stale, brk-tomlxfail, dsa, *mha*; plugins: *"
        ]
    )


@pytest.mark.parametrize(
    ("table", "says"),
    [
        ('"brk-alias/write-forms-agree" = ""', "needs a reason"),
        ('brk-alias = { no-such-check = "why" }', "unknown behaviour check 'no-such-check'"),
        ('"no-such-pool/write-forms-agree" = "why"', "no installed pool is named 'no-such-pool'"),
    ],
)
def test_a_bad_expected_failure_is_a_usage_error(
    project: pytest.Pytester, table: str, says: str
) -> None:
    project.makefile(".toml", pyproject=f"[tool.kvcache.expected-failures]\n{table}\n")
    result = run(project, "--kvcache-conformance=brk-alias")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    assert says in result.stderr.str()


def test_a_plugin_discovery_rejects_fails_instead_of_vanishing(
    project: pytest.Pytester,
) -> None:
    result = run(project, "--kvcache-conformance=kvc_broken")
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(
        ["*test_kvcache_conformance[[]kvc_broken-discovery[]]*", "*import failed*no gpu*"]
    )


def test_a_plugin_name_selects_its_pools_and_m_selects_the_battery(
    project: pytest.Pytester,
) -> None:
    project.makepyfile(test_other="def test_unrelated(): pass")
    result = run(
        project,
        "--kvcache-conformance=kvc_gallery",
        "-m",
        "kvcache_conformance",
        "--co",
        "-q",
    )
    collected = [line for line in result.outlines if line.startswith("test_")]
    pools = ["brk-alias", "brk-specxfail", "brk-stale", "brk-tomlxfail"]
    assert collected == [i for pool in pools for i in ids(pool)]


def test_without_the_option_nothing_is_added(project: pytest.Pytester) -> None:
    project.makepyfile(test_other="def test_unrelated(): pass")
    result = run(project)
    result.assert_outcomes(passed=1)


def test_conformance_cases_in_an_authors_own_suite(project: pytest.Pytester) -> None:
    project.makepyfile(
        test_mine="""
        import pytest
        from kvcache_core.testing import check_conformance, conformance_cases
        from kvc_gallery import AliasPool, create_alias, spec

        under_development = spec("not-installed", create_alias, AliasPool)

        @pytest.mark.parametrize(
            ("spec", "check_id"),
            conformance_cases("brk-alias", "brk-tomlxfail", "brk-stale", under_development),
        )
        def test_conformance(spec, check_id):
            if check_id == "write-forms-agree":
                check_conformance(spec, check_id)
        """
    )
    result = project.runpytest("-v", "-p", "no:hypothesispytest", "-p", "no:xdist")
    result.stdout.fnmatch_lines_random(
        [
            "*test_conformance[[]brk-alias-behaviour/write-forms-agree[]] FAILED*",
            "*test_conformance[[]brk-tomlxfail-behaviour/write-forms-agree[]] XFAIL*",
            "*test_conformance[[]brk-stale-behaviour/write-forms-agree[]] FAILED*",
            "*test_conformance[[]not-installed-behaviour/write-forms-agree[]] FAILED*",
            "E   *[[]behaviour-failed[]] pool:brk-alias: behaviour/write-forms-agree: *",
            "*XPASS(strict)*fixed long ago*",
        ]
    )


def _subprocess_env(project: pytest.Pytester) -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(project.path), str(ROOT)]))
    return env


def test_xdist_workers_collect_the_same_battery(
    project: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    import xdist  # noqa: F401  (a dev dependency: missing is a failure, not a skip)

    monkeypatch.setenv("PYTHONPATH", _subprocess_env(project)["PYTHONPATH"])
    args = ["-p", PLUGIN, "--kvcache-conformance=kvc_gallery", "-k", "write-forms-agree"]
    written = project.path / "battery.json"
    junit = project.path / "junit.xml"
    args += [f"--kvcache-report=json:{written}", f"--junitxml={junit}"]
    result = project.runpytest_subprocess("-n", "2", "-p", "no:hypothesispytest", *args)
    # a difference between the workers' collections would be an error, not these outcomes
    result.assert_outcomes(failed=2, xfailed=2)
    # The workers' results reach the controller, which writes the one report (in plan order).
    import json

    results = json.loads(written.read_text(encoding="utf-8"))["results"]
    assert [(r["target"], r["outcome"]) for r in results] == [
        ("pool:brk-alias", "failed"),
        ("pool:brk-specxfail", "expected-failure"),
        ("pool:brk-stale", "failed"),
        ("pool:brk-tomlxfail", "expected-failure"),
    ]
    # How the results travel is the plugin's business: nothing of it lands in the user's JUnit.
    assert "testcase" in (text := junit.read_text(encoding="utf-8"))
    assert "kvcache_conformance_result" not in text and "<property" not in text


def test_the_pytest11_entry_point_loads_it_and_costs_no_torch(project: pytest.Pytester) -> None:
    """Installed with kvcache's own entry point, the plugin loads by itself; naming it again
    (``-p``, ``pytest_plugins``) is the same plugin, not a second registration (a ValueError
    when the entry point has any other name). Without the option a whole session imports no
    torch."""
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text())
    entry_points = pyproject["project"]["entry-points"]["pytest11"]
    assert PLUGIN in entry_points.values()
    install(project.path, "kvcache-pytest-entry-point", "pytest11", entry_points)
    project.makepyfile(
        test_light="""
        import sys

        def test_plugin_loaded_and_no_torch(pytestconfig):
            assert pytestconfig.pluginmanager.has_plugin("kvcache_core.pytest_plugin")
            assert "torch" not in sys.modules
        """
    )
    env = _subprocess_env(project)
    for extra, conftest in (([], ""), (["-p", PLUGIN], f"pytest_plugins = [{PLUGIN!r}]")):
        project.makeconftest(conftest)
        proc = subprocess.run(
            [sys.executable, "-m", "pytest", "-q", "-p", "no:hypothesispytest", *extra],
            cwd=project.path,
            env=env,
            capture_output=True,
            text=True,
        )
        assert proc.returncode == 0, proc.stdout + proc.stderr
        assert "1 passed" in proc.stdout


def test_kvcache_check_reads_the_same_expected_failures(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from kvcache_core.cli import main

    config = tmp_path / "pyproject.toml"
    config.write_text('[tool.kvcache.expected-failures]\nmha = { write-forms-agree = "" }\n')
    code = main(["check", "mha", "--level", "source", "--config", str(config)])
    assert code == 2
    assert "mha.write-forms-agree needs a reason" in capsys.readouterr().err
    config.write_text(textwrap.dedent(PYPROJECT))
    assert main(["check", "mha", "--level", "source", "--config", str(config)]) == 0


def test_a_path_swallowed_by_the_option_gets_a_usage_error_saying_so(
    project: pytest.Pytester,
) -> None:
    project.mkdir("tests")
    result = run(project, "--kvcache-conformance", "tests")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    assert "write `pytest tests --kvcache-conformance`" in result.stderr.str()


def test_runxfail_shows_the_finding_of_an_expected_failure(project: pytest.Pytester) -> None:
    args = ("--kvcache-conformance=brk-specxfail", "-k", "write-forms-agree", "--runxfail")
    result = run(project, *args)
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(["hint: unwrap `loc`*"])


def test_a_spec_expecting_an_unknown_check_fails_one_test_not_the_run(
    project: pytest.Pytester,
) -> None:
    """A plugin is someone else's code (perhaps written against a newer kvcache with more
    checks): its bad declaration fails that pool's case, the battery still runs."""
    project.makepyfile(
        kvc_badspec="""
        from kvc_gallery import MHATokenToKVPool, create_mha, hookimpl, spec

        @hookimpl
        def kvcache_pool_specs():
            xfail = {"no-such-check": "from a newer kvcache"}
            return [spec("brk-badspec", create_mha, MHATokenToKVPool, expected_failures=xfail)]
        """
    )
    install(project.path, "kvc-badspec", "kvcache.pools", {"kvc_badspec": "kvc_badspec"})
    result = run(project, "--kvcache-conformance=brk-badspec", "-v")
    result.assert_outcomes(passed=len(ids("brk-badspec")), failed=1)
    result.stdout.fnmatch_lines(
        [
            "*test_kvcache_conformance[[]brk-badspec-expected-failures[]] FAILED*",
            "*expected failure brk-badspec/no-such-check: unknown behaviour check*",
        ]
    )


def test_kvcache_report_is_the_checkers_report_of_the_battery(
    project: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``--kvcache-report`` writes, in every format, the bytes the library's one pipeline gives
    for the same cases; and its results are the ones ``kvcache check`` reports for those pools
    (a still clock makes durations equal on both sides)."""
    import json
    import time

    from kvcache_core.cli import main
    from kvcache_core.conformance import FORMATS, report
    from kvcache_core.conformance.results.expected import load_expected_failures
    from kvcache_core.testing import case_result, plan_conformance, with_pool_seconds

    monkeypatch.setattr(time, "perf_counter", lambda: 0.0)
    out = {fmt: project.path / f"battery.{fmt}" for fmt in FORMATS}
    reports = [f"--kvcache-report={fmt}:{path}" for fmt, path in out.items()]
    names = "--kvcache-conformance=kvc_gallery,kvc_broken"
    result = run(project, names, "-k", "write-forms-agree or discovery", *reports)
    result.assert_outcomes(failed=3, xfailed=2)

    pyproject = str(project.path / "pyproject.toml")
    cases = [
        case
        for case in plan_conformance(
            ["kvc_gallery", "kvc_broken"], configured=load_expected_failures(pyproject)
        )
        if case.check in ("write-forms-agree", "discovery")
    ]
    library = [report(with_pool_seconds([case_result(c) for c in cases]), f) for f in FORMATS]
    for fmt, expected in zip(FORMATS, library, strict=True):
        assert out[fmt].read_text(encoding="utf-8") == expected.text, fmt
    assert library[0].exit_code == 2  # the rejected plugin could not run
    written = json.loads(out["json"].read_text(encoding="utf-8"))["results"]
    outcomes = {r["target"]: r["outcome"] for r in written}
    assert outcomes == {
        "pool:brk-alias": "failed",
        "pool:brk-specxfail": "expected-failure",
        "pool:brk-stale": "failed",
        "pool:brk-tomlxfail": "expected-failure",
        "pool:kvc_broken": "error",
    }

    check_json = project.path / "check.json"
    argv = ["check", "kvc_gallery", "--level", "behaviour", "--select", "write-forms-agree"]
    main([*argv, "--format", "json", "--config", pyproject, "--output", str(check_json)])

    def shown(results: list[dict[str, object]]) -> list[tuple[object, ...]]:
        return sorted(
            (r["target"], r["check"], r["outcome"], r["detail"], json.dumps(r["findings"]))
            for r in results
            if str(r["target"]).startswith("pool:brk-")
        )

    checked = json.loads(check_json.read_text(encoding="utf-8"))["results"]
    assert len(shown(written)) == 4
    assert shown(written) == shown(checked)


def test_kvcache_report_needs_a_known_format_and_a_file(project: pytest.Pytester) -> None:
    for bad in ("yaml:out.yaml", "json", "json:"):
        result = run(project, "--kvcache-conformance=brk-alias", f"--kvcache-report={bad}")
        assert result.ret == pytest.ExitCode.USAGE_ERROR
        assert "expected FORMAT:FILE with FORMAT one of text, json" in result.stderr.str()


def test_conformance_report_is_what_the_plugin_writes(
    project: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``kvcache_core.testing.conformance_report`` and ``--kvcache-report`` are one report."""
    import time

    from kvcache_core.testing import conformance_report

    monkeypatch.setattr(time, "perf_counter", lambda: 0.0)
    written = project.path / "battery.txt"
    run(project, "--kvcache-conformance=brk-alias", f"--kvcache-report=text:{written}")
    library = conformance_report("brk-alias", pyproject=project.path / "pyproject.toml")
    assert written.read_text(encoding="utf-8") == library.text
    assert library.exit_code == 1
    failed = [r.check for r in library.results if r.outcome.value != "passed"]
    assert failed == ["behaviour/write-forms-agree"]
    assert "pool:brk-alias  (behaviour checks: 0.00 s)" in library.text
    # A pool discovery rejected is an ERROR result of the report, not an exception.
    refused = conformance_report("kvc_broken", pyproject=project.path / "pyproject.toml")
    assert refused.exit_code == 2
    assert {(r.target, r.outcome.value) for r in refused.results} == {("pool:kvc_broken", "error")}
