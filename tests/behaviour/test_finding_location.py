"""Behaviour findings are reported at the class that misbehaved (SARIF needs a location for
code scanning to accept a result; a GitHub annotation needs a file and line), annotation titles
do not repeat the target, and every reproduction ends in an ``assert`` with a message."""

from __future__ import annotations

import ast
import inspect
import json
import os
import subprocess
import sys
import textwrap

import pytest

from kvcache_core.conformance.behaviour import run_spec
from kvcache_core.conformance.behaviour._report import end_in_assert
from kvcache_core.conformance.reporting.render import render
from kvcache_core.conformance.results.model import Outcome

from .gallery_core import GALLERY


@pytest.fixture(scope="module")
def leaky():
    """The gallery's leaky MHA pool: fails write-isolation (a pool check) and its allocator
    is the built-in one; its results for two checks."""
    (spec,) = [s for check, s in GALLERY if s.name == "gallery-leaky-write"]
    return spec, run_spec(spec, only=["write-isolation", "write-readback"])


def test_a_behaviour_finding_points_at_the_pool_class(leaky) -> None:
    spec, results = leaky
    (failed,) = [r for r in results if r.outcome is Outcome.FAILED]
    (finding,) = failed.findings
    _, line = inspect.getsourcelines(spec.pool_class)
    assert finding.impl_location is not None
    assert finding.impl_location.path == inspect.getsourcefile(spec.pool_class)
    assert finding.impl_location.line == line


def test_sarif_results_of_behaviour_findings_have_a_location(leaky, monkeypatch) -> None:
    spec, results = leaky
    monkeypatch.chdir(os.path.dirname(inspect.getsourcefile(spec.pool_class) or "."))
    log = json.loads(render(results, "sarif"))
    (result,) = log["runs"][0]["results"]
    (where,) = result["locations"]
    physical = where["physicalLocation"]
    assert physical["artifactLocation"] == {"uri": "gallery_core.py", "uriBaseId": "%SRCROOT%"}
    assert physical["region"]["startLine"] == inspect.getsourcelines(spec.pool_class)[1]


def test_github_annotation_has_file_line_and_a_title_without_repetition(leaky) -> None:
    spec, results = leaky
    (line,) = [x for x in render(results, "github").splitlines() if x.startswith("::error")]
    props = dict(p.split("=", 1) for p in line[len("::error ") :].split("::", 1)[0].split(","))
    assert props["file"].endswith("gallery_core.py")
    assert props["line"] == str(inspect.getsourcelines(spec.pool_class)[1])
    title = props["title"].replace("%3A", ":")
    assert title == "kvcache behaviour-failed: pool:gallery-leaky-write (behaviour/write-isolation)"
    assert title.count("gallery-leaky-write") == 1


def test_every_gallery_reproduction_ends_in_an_assert_with_a_message() -> None:
    for check, spec in GALLERY:
        (result,) = run_spec(spec, only=[check])
        (finding,) = result.findings
        tree = ast.parse(finding.reproduction)
        last = tree.body[-1]
        while isinstance(last, (ast.For, ast.If, ast.With)):
            last = last.body[-1]
        assert isinstance(last, ast.Assert) and last.msg is not None, (spec.name, check)


def _run(source: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", source], capture_output=True, text=True, timeout=60
    )


@pytest.mark.parametrize(
    ("source", "expected"),
    [
        ("x = 1\nassert x == 2\n", "x = 1\nassert x == 2, 'wrong x'\n"),
        ("x = 1\nassert x == 2, 'own'\n", "x = 1\nassert x == 2, 'own'\n"),
        (
            "for i in range(2):\n    assert i < 1\n",
            "for i in range(2):\n    assert i < 1, 'wrong x'\n",
        ),
        ("x = 'é'\nassert x == 'e'  # note\n", "x = 'é'\nassert x == 'e', 'wrong x'  # note\n"),
        ("def f(:\n", "def f(:\n"),
        ("", ""),
    ],
)
def test_end_in_assert_adds_a_message_to_a_bare_assert(source: str, expected: str) -> None:
    assert end_in_assert(source, "wrong   x") == expected


def test_end_in_assert_wraps_a_call_that_raises_and_keeps_its_traceback() -> None:
    source = textwrap.dedent(
        """
        def check():
            raise ValueError("pool line 7")
        check()  # raises
        """
    )
    wrapped = end_in_assert(source, "write-readback on pool 'p': raised ValueError")
    last = ast.parse(wrapped).body[-1]
    assert isinstance(last, ast.Assert) and last.msg is not None
    done = _run(wrapped)
    assert done.returncode == 1
    assert "ValueError: pool line 7" in done.stderr  # the pool's own traceback
    assert "AssertionError: write-readback on pool 'p': raised ValueError: " in done.stderr
    assert _run(end_in_assert("x = 1\nprint(x)\n", "m")).returncode == 0  # nothing raised
