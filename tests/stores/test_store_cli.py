"""The store battery from the command line (``kvcache check --store``) and from pytest
(``--kvcache-store``), on an installed broken store plugin and on the built-in memory store."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from xml.etree import ElementTree

import jsonschema
import pytest

from kvcache_core.cli import main

pytest_plugins = ["pytester"]

KEEPS_FIRST = """
from kvcache_core.hookspecs import hookimpl
from kvcache_core.stores import StoreSpec
from kvcache_plugins.stores.memory import MemoryStore


class KeepsFirst(MemoryStore):
    def put_many(self, items, *, ttl=None):
        super().put_many({k: v for k, v in items.items() if self.get(k) is None}, ttl=ttl)


@hookimpl
def kvcache_store_specs():
    return [StoreSpec("keepsfirst", ("keepsfirst",), KeepsFirst, KeepsFirst, shared=False)]
"""


SCHEMA = Path(__file__).resolve().parents[2] / "docs" / "checker-json-schema.json"
SARIF_SUBSET = Path(__file__).resolve().parents[1] / "render" / "sarif-2.1.0-subset.schema.json"


@pytest.fixture
def keepsfirst(fake_site: Callable[..., Path]) -> Path:
    """A store plugin whose ``put_many`` keeps old values: only ``overwrite`` catches it."""
    site = fake_site(
        "keepsfirst-store",
        entry_points={"keepsfirst": "st_keepsfirst"},
        modules={"st_keepsfirst": KEEPS_FIRST},
        group="kvcache.stores",
    )
    return site / "st_keepsfirst.py"


def _check(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str]:
    code = main(["check", *args])
    return code, capsys.readouterr().out


def test_check_store_reports_the_failing_check(
    keepsfirst: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out = _check(capsys, "--store", "keepsfirst:", "--format", "json")
    assert code == 1
    doc = json.loads(out)
    jsonschema.validate(doc, json.loads(SCHEMA.read_text()))
    failed = [r for r in doc["results"] if r["outcome"] == "failed"]
    # A store that never replaces a value also keeps an expired value over an acknowledged one.
    assert [(r["target"], r["check"]) for r in failed] == [
        ("store:keepsfirst:", "store/overwrite"),
        ("store:keepsfirst:", "store/expiry-race"),
    ]
    (finding,) = failed[0]["findings"]
    assert finding["rule"] == "store-check-failed" and finding["severity"] == "error"
    assert "did not replace" in finding["message"]
    assert finding["impl_location"] == {"path": str(keepsfirst), "line": 7}  # class KeepsFirst
    outcomes = {r["check"]: r["outcome"] for r in doc["results"]}
    assert len(outcomes) == 12 and outcomes["store/outage"] == "skipped"
    (outage,) = [r for r in doc["results"] if r["check"] == "store/outage"]
    assert "no way to stop this store's server" in outage["detail"]
    assert doc["summary"]["outcomes"]["passed"] == 9


def _failing_overwrite(capsys: pytest.CaptureFixture[str], fmt: str) -> str:
    code, out = _check(
        capsys, "--store", "keepsfirst:", "--select", "store/overwrite,missing-key", "--format", fmt
    )
    assert code == 1, out
    return out


def test_check_store_speaks_every_format(
    keepsfirst: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("GITHUB_WORKSPACE", raising=False)
    text = _failing_overwrite(capsys, "text").splitlines()
    assert text[:3] == [
        "store:keepsfirst:",
        "  PASS   store/missing-key",
        "  FAIL   store/overwrite  (1 finding)",
    ]
    assert text[3].startswith("         error[store-check-failed] store/overwrite on keepsfirst:")
    assert "  PASS   store/missing-key" in text

    suite = ElementTree.fromstring(_failing_overwrite(capsys, "junit"))
    assert (suite.get("tests"), suite.get("failures"), suite.get("skipped")) == ("2", "1", "0")
    cases = {c.get("name"): c for c in suite.iter("testcase")}
    assert sorted(cases) == ["store/missing-key", "store/overwrite"]
    failure = cases["store/overwrite"].find("failure")
    assert failure is not None and failure.get("type") == "store-check-failed"
    assert cases["store/missing-key"].find("failure") is None
    assert {c.get("classname") for c in cases.values()} == {"store:keepsfirst:"}

    log = json.loads(_failing_overwrite(capsys, "sarif"))
    jsonschema.validate(log, json.loads(SARIF_SUBSET.read_text()))
    (run,) = log["runs"]
    assert "store-check-failed" in [r["id"] for r in run["tool"]["driver"]["rules"]]
    (result,) = run["results"]
    assert result["ruleId"] == "store-check-failed" and result["level"] == "error"
    (where,) = result["locations"]
    assert where["physicalLocation"]["artifactLocation"]["uri"].endswith("st_keepsfirst.py")
    assert where["physicalLocation"]["region"]["startLine"] == 7

    github = _failing_overwrite(capsys, "github").splitlines()
    (annotation,) = [line for line in github if line.startswith("::")]
    head, _, message = annotation[2:].partition("::")
    kind, _, props = head.partition(" ")
    fields = dict(p.split("=", 1) for p in props.split(","))
    assert kind == "error" and fields["line"] == "7"
    assert fields["file"].endswith("st_keepsfirst.py")
    assert (
        fields["title"] == "kvcache store-check-failed%3A store%3Akeepsfirst%3A (store/overwrite)"
    )
    assert "did not replace" in message
    assert github[-1].startswith("kvcache check: 2 checks on 1 target: 1 passed, 1 failed")

    doc = json.loads(_failing_overwrite(capsys, "json"))
    jsonschema.validate(doc, json.loads(SCHEMA.read_text()))
    assert [r["check"] for r in doc["results"]] == ["store/missing-key", "store/overwrite"]


def test_check_store_select_and_suppressions(
    keepsfirst: Path, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    code, out = _check(capsys, "--store", "keepsfirst:", "--deselect", "store-check-failed")
    assert code == 0 and out.startswith("0 checks on 0 targets"), out
    assert main(["check", "--store", "memory:x", "--select", "overwrite,nosuch"]) == 2
    out, err = capsys.readouterr()
    assert out == "" and "unknown store check id 'nosuch'" in err
    config = tmp_path / "pyproject.toml"
    config.write_text(
        '[tool.kvcache]\nsuppress = [{rule = "store-check-failed", target = "store:keepsfirst:",'
        ' reason = "put_many keeps old values until #7"}]\n'
    )
    code, out = _check(
        capsys, "--store", "keepsfirst:", "--select", "overwrite", "--config", str(config)
    )
    assert code == 0, out
    assert "  PASS   store/overwrite" in out


def test_check_store_passes_the_memory_store(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["check", "--store", "memory:cli-test"]) == 0
    out = capsys.readouterr().out
    assert "  PASS   store/round-trip" in out.splitlines()
    assert out.splitlines()[0] == "store:memory:cli-test"
    assert "11 passed, 0 failed, 0 errors, 1 skipped" in out


def test_check_store_refuses_an_unknown_scheme(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["check", "--store", "nosuch:x"]) == 2
    assert "no accepted snapshot store opens nosuch:" in capsys.readouterr().err


def test_pytest_option_adds_one_test_per_check(pytester: pytest.Pytester) -> None:
    result = pytester.runpytest("--kvcache-store", "memory:pytester", "-k", "round-trip or outage")
    result.assert_outcomes(passed=1, skipped=1, deselected=10)
    result.stdout.no_fnmatch_line("*error*")


def test_the_store_mark_is_registered_outside_this_project(pytester: pytest.Pytester) -> None:
    """The items carry the ``kvcache_store`` mark; a project without our ini file must not
    get pytest's unknown-mark warning for it (here made an error), and ``-m`` selects them."""
    result = pytester.runpytest(
        "--kvcache-store",
        "memory:pytester",
        "-m",
        "kvcache_store",
        "-k",
        "round-trip",
        "-W",
        "error::pytest.PytestUnknownMarkWarning",
        "--strict-markers",
    )
    result.assert_outcomes(passed=1, deselected=11)
