"""GitHub workflow commands: escaped, pinned to file and line, capped at 10 with a summary."""

from __future__ import annotations

import re
from dataclasses import replace

import pytest

from kvcache_core.conformance.reporting.render import render
from kvcache_core.conformance.reporting.render.github import MAX_ANNOTATIONS
from kvcache_core.conformance.results.model import CheckResult, Finding, Location, Outcome

COMMAND = re.compile(r"^::(error|warning|notice)(?: ([^:]*))?::(.*)$")


def _commands(out: str) -> list[tuple[str, dict[str, str], str]]:
    found = []
    for line in out.splitlines():
        match = COMMAND.match(line)
        if match:
            props = dict(p.split("=", 1) for p in (match[2] or "").split(",") if p)
            found.append((match[1], props, match[3]))
    return found


def test_annotations(results: list[CheckResult]) -> None:
    out = render(results, "github")
    commands = _commands(out)
    kinds = [k for k, _, _ in commands]
    # the run error first, then findings by severity; the expected failure is not annotated
    assert kinds == ["error", "error", "error", "error", "warning"]
    assert not any("renamed-parameter" in p.get("title", "") for _, p, _ in commands)
    _, props, message = commands[1]
    assert props["file"] == "pkg/pools.py"
    assert props["line"] == "40"
    assert props["title"].startswith("kvcache type-error%3A pkg.pools.DriftPool get_cpu_copy")
    assert "%0AContract%3A" not in message and "%0AContract: " in message
    assert "%0AHint: match the contract" in message
    assert out.splitlines()[-1].startswith("kvcache check: 7 checks on 3 targets")


def test_escaping(results: list[CheckResult]) -> None:
    out = render(results, "github")
    line = next(line for line in out.splitlines() if "missing-method" in line)
    assert "100%25" in line and "%0Asecond line" in line
    assert "\n" not in line.rstrip("\n")
    props = _commands(line)[0][1]
    assert "line" not in props  # no line known: file only


def test_workspace_relative_paths(
    results: list[CheckResult], monkeypatch: pytest.MonkeyPatch, project: object
) -> None:
    monkeypatch.setenv("GITHUB_WORKSPACE", str(project).rsplit("/", 1)[0])
    props = _commands(render(results, "github"))[1][1]
    assert props["file"] == "project/pkg/pools.py"


def test_more_than_ten_findings_fall_back_to_a_summary() -> None:
    base = Finding(
        rule="type-error",
        message="m",
        target="t",
        method="f",
        impl_location=Location("/abs/pool.py", 1),
    )
    findings = tuple(replace(base, method=f"m{i}") for i in range(12))
    findings += (replace(base, rule="annotation-mismatch", method="w"),)
    results = [CheckResult("t", "types:KVPool", Outcome.FAILED, findings)]
    out = render(results, "github")
    commands = _commands(out)
    assert len(commands) == MAX_ANNOTATIONS + 1
    assert [k for k, _, _ in commands[:MAX_ANNOTATIONS]] == ["error"] * MAX_ANNOTATIONS
    kind, props, message = commands[-1]
    assert kind == "notice"
    assert "3 more findings not annotated (1 annotation-mismatch, 2 type-error)" in message
    assert props["title"] == "kvcache check%3A more findings"
