"""The CLI starts like a linter: source-only commands import neither torch, mypy nor a plugin.

``kvcache check --level source`` on paths (or ``module:Class``) reads the contract from its
source too, and reads an installed plugin's ``PoolSpec``s from its hook's source (every built-in
plugin's hook is plain enough; a plugin whose hook is not is still imported).

Each command runs in a fresh interpreter, which then reports what it imported. Timings are the
benchmark's business (benchmarks/bench_drift.py); this only checks what was imported.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
CORPUS = ROOT / "tests" / "drift_corpus"

_PROBE = """
import contextlib, io, json, sys
from kvcache_core.cli import main
out, err = io.StringIO(), io.StringIO()
with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
    code = main(sys.argv[1:])
heavy = sorted(
    m for m in sys.modules
    if m.split(".")[0] in ("torch", "mypy", "kvcache_plugins", "numpy", "pluggy")
)
print(json.dumps({"code": code, "out": out.getvalue(), "err": err.getvalue(), "heavy": heavy}))
"""


def _probe(*argv: str) -> dict[str, object]:
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
    }
    done = subprocess.run(
        [sys.executable, "-c", _PROBE, *argv],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        cwd=ROOT,
        env=env,
    )
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout.strip().splitlines()[-1])
    assert isinstance(report, dict)
    return report


@pytest.mark.parametrize(
    "argv",
    [
        pytest.param(["--version"], id="version"),
        pytest.param(["--help"], id="help"),
        pytest.param(["check", "--help"], id="check-help"),
        pytest.param(["drift", str(CORPUS)], id="drift"),
        pytest.param(["drift", str(CORPUS / "drift_tree"), "--format", "json"], id="drift-json"),
        pytest.param(["drift", str(CORPUS / "dsa_sub.py"), "--format", "sarif"], id="drift-sarif"),
        pytest.param(["check", "--level", "source", str(CORPUS)], id="check-source"),
        pytest.param(
            ["check", "--level", "source", "--against", "KVPool", str(CORPUS / "dsa_sub.py")],
            id="check-source-against",
        ),
        pytest.param(["check", "--level", "source"], id="check-source-every-plugin"),
        pytest.param(["check", "--level", "source", "mha", "swa"], id="check-source-plugins"),
    ],
)
def test_source_only_commands_import_no_torch_mypy_or_plugin(argv: list[str]) -> None:
    report = _probe(*argv)
    assert report["heavy"] == [], report["heavy"]


def test_version_and_help_still_answer() -> None:
    from kvcache_core import __version__

    report = _probe("--version")
    assert report["code"] == 0
    assert report["out"] == f"kvcache {__version__}\n"
    report = _probe("--help")
    assert report["code"] == 0
    for command in ("list", "check", "drift", "demo", "new"):
        assert command in str(report["out"])


@pytest.mark.parametrize("targets", [[], ["mha", "swa"]], ids=["every-plugin", "by-name"])
def test_plugins_read_without_importing_report_what_importing_them_reports(
    targets: list[str], capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    from kvcache_core.cli import main
    from kvcache_core.conformance.targets import plugin_source

    report = _probe("check", "--level", "source", *targets)
    # In this process every plugin is imported instead: what `kvcache check` did before.
    monkeypatch.setattr(plugin_source, "static_specs", lambda ep, index=None: "forced")
    code = main(["check", "--level", "source", *targets])
    captured = capsys.readouterr()
    assert (report["code"], report["out"], report["err"]) == (code, captured.out, captured.err)
    assert report["heavy"] == []


def test_drift_without_torch_reports_what_it_reports_in_process(run_drift_in_process) -> None:
    report = _probe("drift", str(CORPUS / "drift_tree"), "--format", "json")
    assert report["code"] == 1
    assert _timeless(json.loads(str(report["out"]))["results"]) == run_drift_in_process


def _timeless(results: list[dict[str, object]]) -> list[dict[str, object]]:
    return [{k: v for k, v in r.items() if k != "duration_s"} for r in results]


@pytest.fixture
def run_drift_in_process(capsys: pytest.CaptureFixture[str]) -> object:
    from kvcache_core.cli import main

    assert main(["drift", str(CORPUS / "drift_tree"), "--format", "json"]) == 1
    return _timeless(json.loads(capsys.readouterr().out)["results"])


def test_the_parser_defaults_spelled_out_for_start_up_match_their_sources() -> None:
    from kvcache_core.commands import demo, drift
    from kvcache_core.conformance.source import drift as analysis
    from kvcache_core.engine import DemoSettings

    settings = DemoSettings()
    assert {name: getattr(settings, name) for name in demo.DEFAULTS} == demo.DEFAULTS
    assert drift.DEFAULT_METHODS == analysis.DEFAULT_METHODS


def test_contracts_still_export_every_name_lazily() -> None:
    import kvcache_core.contracts as contracts

    for name in contracts.__all__:
        assert getattr(contracts, name) is not None, name
    assert set(contracts.__all__) <= set(dir(contracts))
    with pytest.raises(AttributeError):
        contracts.NoSuchName  # noqa: B018
