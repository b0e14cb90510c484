"""A check that crashes inside a pool still gets a runnable reproduction: one that re-runs the
check unthreaded, so the author sees the whole traceback down to the pool's line."""

from __future__ import annotations

from kvcache_core import discover
from kvcache_core.conformance.behaviour import BATTERY, select_checks
from kvcache_core.conformance.behaviour._run import _rerun


def test_rerun_snippet_runs_the_check_on_an_installed_pool() -> None:
    spec = discover().spec("mha")
    check = select_checks(spec)[0]
    snippet = _rerun(check, spec)
    assert f"BATTERY[{check.id!r}]" in snippet and "installed_spec('mha')" in snippet
    exec(compile(snippet, "<reproduction>", "exec"), {})  # the conforming pool: no exception
    assert check.id in BATTERY
