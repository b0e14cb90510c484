"""Every command docs/pool-authors.md shows for running the behaviour battery works, as
written, against an installed plugin named ``fancy`` (the guide's running example) whose pool
fails ``write-forms-agree`` and is declared an expected failure in the documented
``pyproject.toml``: so each command must also honour that declaration to exit 0."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest
from _battery_helpers import GALLERY_PLUGIN, PLUGIN, install

from kvcache_core.cli import main as kvcache_main

pytest_plugins = ["pytester"]

GUIDE = Path(__file__).resolve().parent.parent / "docs" / "pool-authors.md"

FANCY = (
    GALLERY_PLUGIN.split("@hookimpl")[0]
    + """
@hookimpl
def kvcache_pool_specs():
    return [spec("fancy", create_alias, AliasPool)]
"""
)


def section() -> str:
    text = GUIDE.read_text(encoding="utf-8")
    start = text.index("## Running the behaviour battery")
    end = text.find("\n## ", start + 1)
    return text[start : end if end != -1 else len(text)]


def blocks(lang: str) -> list[str]:
    return re.findall(rf"```{lang}\n(.*?)```", section(), re.S)


def commands() -> list[str]:
    """``$ ...`` lines of console blocks, and the ``run:`` steps of the CI workflow that
    invoke kvcache or pytest (installing is the CI machine's business)."""
    shown = [line[2:] for b in blocks("console") for line in b.splitlines() if line[:2] == "$ "]
    ci = [
        m.group(1)
        for b in blocks("yaml")
        for m in re.finditer(r"- run: ((?:kvcache|pytest) .*)", b)
    ]
    return shown + ci


def test_the_section_shows_the_essential_forms() -> None:
    shown = commands()
    assert any(c.startswith("kvcache check") and "behaviour" in c for c in shown)
    assert "pytest --kvcache-conformance" in shown
    assert any(c.startswith("pytest --kvcache-conformance=") and "-n 2" in c for c in shown)
    assert blocks("toml") and blocks("python") and blocks("yaml")


@pytest.fixture
def project(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> pytest.Pytester:
    pytester.makepyfile(fancy_pools=FANCY)
    install(pytester.path, "fancy-pools", "kvcache.pools", {"fancy": "fancy_pools"})
    (toml,) = blocks("toml")
    pytester.makefile(".toml", pyproject=toml)
    own = next(b for b in blocks("python") if b.startswith("# tests/test_conformance.py"))
    (pytester.path / "tests").mkdir()
    (pytester.path / "tests" / "test_conformance.py").write_text(own, encoding="utf-8")
    pytester.syspathinsert()
    monkeypatch.chdir(pytester.path)
    return pytester


@pytest.mark.parametrize("command", commands())
def test_documented_command_works(project: pytest.Pytester, command: str) -> None:
    argv = shlex.split(command)
    if argv[0] == "kvcache":
        assert kvcache_main(argv[1:]) == 0, command
        return
    assert argv[0] == "pytest"
    args = argv[1:]
    if "-n" in args:  # xdist is exercised in test_pytest_plugin.py; one process is enough here
        at = args.index("-n")
        del args[at : at + 2]
    # -p: this venv's editable kvcache may predate the pytest11 entry point (same plugin if not)
    result = project.runpytest("-p", PLUGIN, "-p", "no:hypothesispytest", "-p", "no:xdist", *args)
    assert result.ret == 0, f"{command}\n{result.stdout.str()}\n{result.stderr.str()}"
    if "--kvcache-conformance" in command and "-k" not in args:
        result.stdout.re_match_lines([r".*\bxfailed\b.*"])  # fancy's declared failure
