"""Fixtures of the checker's tests: the corpus, a results-capturing renderer, the CLI."""

from __future__ import annotations

import contextlib
import io
import os
import sys
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from kvcache_core import cli
from kvcache_core.conformance.members.sources import SourceIndex
from kvcache_core.conformance.reporting import report as _output
from kvcache_core.conformance.results.model import CheckResult
from kvcache_core.conformance.targets.resolve import resolve_targets
from kvcache_core.conformance.targets.target import ClassTarget

from ._corpus import CORPUS


@dataclass
class CliRun:
    code: int
    out: str
    err: str
    results: list[CheckResult] = field(default_factory=list)
    formats: list[str] = field(default_factory=list)

    def findings(self, rule: str | None = None) -> list[object]:
        return [f for r in self.results for f in r.findings if rule is None or f.rule == rule]


@pytest.fixture
def run_cli(monkeypatch: pytest.MonkeyPatch) -> Callable[..., CliRun]:
    """Run ``kvcache ARGS`` in-process, recording the results handed to the renderer.

    The renderer is replaced by a recorder, so these tests check what the checker *found*,
    independently of how the (separately built) renderers print it.
    """

    def run(*argv: str, cwd: Path | None = None) -> CliRun:
        captured: list[CheckResult] = []
        formats: list[str] = []

        def record(results: Sequence[CheckResult], fmt: str) -> str:
            captured.extend(results)
            formats.append(fmt)
            return f"{len(results)} results\n"

        monkeypatch.setattr(_output, "_renderer", lambda: record)
        out, err = io.StringIO(), io.StringIO()
        old = os.getcwd()
        try:
            if cwd is not None:
                os.chdir(cwd)
            with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
                code = cli.main(list(argv))
        finally:
            os.chdir(old)
        return CliRun(code, out.getvalue(), err.getvalue(), captured, formats)

    return run


@pytest.fixture(scope="session")
def corpus_targets() -> tuple[list[ClassTarget], SourceIndex]:
    index = SourceIndex()
    targets, errors = resolve_targets([str(CORPUS)], against=None, index=index)
    assert not errors, errors
    return targets, index


@pytest.fixture
def isolated_modules() -> Iterator[None]:
    """Forget modules imported by a test (the corpus, temporary packages)."""
    before = set(sys.modules)
    path = list(sys.path)
    yield
    for name in set(sys.modules) - before:
        if not name.startswith(("kvcache", "torch", "_pytest", "pluggy")):
            sys.modules.pop(name, None)
    sys.path[:] = path
