"""The store battery from the command line (``kvcache check --store``) and from pytest
(``--kvcache-store``), on an installed broken store plugin and on the built-in memory store."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

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


def test_check_store_reports_the_failing_check(
    fake_site: Callable[..., Path], capsys: pytest.CaptureFixture[str]
) -> None:
    fake_site(
        "keepsfirst-store",
        entry_points={"keepsfirst": "st_keepsfirst"},
        modules={"st_keepsfirst": KEEPS_FIRST},
        group="kvcache.stores",
    )
    assert main(["check", "--store", "keepsfirst:", "--format", "json"]) == 1
    doc = json.loads(capsys.readouterr().out)
    failed = [r for r in doc["results"] if r["status"] == "failed"]
    assert [r["check"] for r in failed] == ["overwrite"]
    assert "did not replace" in failed[0]["message"]


def test_check_store_passes_the_memory_store(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["check", "--store", "memory:cli-test"]) == 0
    out = capsys.readouterr().out
    assert "PASSED   store/round-trip [memory:cli-test]" in out
    assert out.strip().endswith("0 failed, 10 passed or skipped")


def test_check_store_refuses_an_unknown_scheme(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["check", "--store", "nosuch:x"]) == 2
    assert "no accepted snapshot store opens nosuch:" in capsys.readouterr().err


def test_pytest_option_adds_one_test_per_check(pytester: pytest.Pytester) -> None:
    result = pytester.runpytest("--kvcache-store", "memory:pytester", "-k", "round-trip or outage")
    result.assert_outcomes(passed=1, skipped=1, deselected=8)
    result.stdout.no_fnmatch_line("*error*")
