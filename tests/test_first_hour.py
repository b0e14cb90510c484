"""docs/pool-authors.md "Your first hour", followed literally; `kvcache new-pool`'s refusals;
the example and the scaffold import only `kvcache_core`'s public names.

The doc's commands run as written, in a fresh temporary directory, each in a fresh process,
with one translation: ``pip install`` installs into a temporary directory (``--target``,
``--no-deps --no-build-isolation``, never editable) so the test never touches this venv and
pip never fetches torch. A command the test does not know how to run fails the test, so the
doc cannot show a step nobody runs.
"""

from __future__ import annotations

import ast
import json
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

import kvcache_core
from kvcache_core.cli import main
from kvcache_core.commands.scaffold import KINDS, render

ROOT = Path(__file__).resolve().parent.parent
DOC = ROOT / "docs" / "pool-authors.md"
EXAMPLES = ROOT / "examples"


def first_hour_commands() -> list[str]:
    text = DOC.read_text(encoding="utf-8")
    section = text.split("## Your first hour", 1)[1]
    block = re.search(r"```console\n(.*?)```", section, re.S)
    assert block is not None, "the first-hour section shows no console block"
    return [line[2:] for line in block.group(1).splitlines() if line.startswith("$ ")]


class Session:
    """Runs doc commands: ``cd`` moves, everything else is a fresh process."""

    def __init__(self, cwd: Path, site: Path) -> None:
        self.cwd = cwd
        self.site = site
        self.env = dict(os.environ)
        self.env["PYTHONPATH"] = os.pathsep.join(
            filter(None, [str(site), str(ROOT), self.env.get("PYTHONPATH")])
        )
        self.env["KVCACHE_CACHE_DIR"] = str(site.parent / "cache")
        self.outputs: dict[str, subprocess.CompletedProcess[str]] = {}

    def argv(self, words: list[str]) -> list[str]:
        head, rest = words[0], words[1:]
        if head == "kvcache":
            return [sys.executable, "-m", "kvcache_core.cli", *rest]
        if head == "pytest":
            return [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", *rest]
        if head == "pip" and rest[:1] == ["install"]:
            sources = [w for w in rest[1:] if not w.startswith("-")]
            sources = [s.split("[", 1)[0] for s in sources]  # extras: dependencies, not needed
            pip = [sys.executable, "-m", "pip", "install", "--quiet", "--no-deps"]
            return [*pip, "--no-build-isolation", "--target", str(self.site), *sources]
        raise AssertionError(f"the test does not know how to run {' '.join(words)!r}")

    def run(self, line: str) -> None:
        for part in line.split("&&"):
            words = shlex.split(part)
            if words[0] == "mkdir":
                (self.cwd / words[1]).mkdir()
                continue
            if words[0] == "cd":
                self.cwd = self.cwd / words[1]
                continue
            proc = subprocess.run(
                self.argv(words), cwd=self.cwd, env=self.env, capture_output=True, text=True
            )
            self.outputs[part.strip()] = proc
            assert proc.returncode == 0, f"$ {part.strip()}\n{proc.stdout}\n{proc.stderr}"


@pytest.fixture(scope="module")
def session(tmp_path_factory: pytest.TempPathFactory) -> Session:
    work = tmp_path_factory.mktemp("empty")
    session = Session(work, tmp_path_factory.mktemp("site"))
    for line in first_hour_commands():
        session.run(line)
    return session


def test_the_doc_shows_scaffold_install_check_and_battery():
    commands = " ; ".join(first_hour_commands())
    for step in ("kvcache new-pool", "pip install", "kvcache check", "pytest"):
        assert step in commands


def test_first_hour_ends_in_a_clean_check_and_a_passing_battery(session):
    check = next(p for c, p in session.outputs.items() if c.startswith("kvcache check"))
    assert "0 findings (0 errors, 0 warnings)" in check.stdout, check.stdout
    for level in ("source:", "signature:", "types:", "behaviour/"):
        assert level in check.stdout
    tests = session.outputs["pytest"]
    assert re.search(r"\d+ passed", tests.stdout) and "failed" not in tests.stdout
    listed = next(p for c, p in session.outputs.items() if c.startswith("kvcache list"))
    assert "my-pool" in listed.stdout


def test_the_scaffold_ships_ci_and_a_readme(session):
    root = session.cwd
    workflow = (root / ".github" / "workflows" / "kvcache.yml").read_text()
    assert "kvcache check my-pool" in workflow
    assert "kvcache check my-pool" in (root / "README.md").read_text()


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["new-pool", "bad name"], "not a valid distribution name"),
        (["new-pool", "pool-"], "not a valid distribution name"),
        (["new-pool", "9lives"], "cannot import"),
        (["new-pool", "fine", "--kind", "nonsense"], "invalid choice"),
        (["new-pool", "fine", "--storage", "int4"], "invalid choice"),
        (["new-pool", "fine", "--kind", "mla", "--storage", "int8"], "offered for --kind mha"),
        (["new-pool", "mha"], "already installed"),
    ],
)
def test_new_pool_refuses_with_a_clear_message(tmp_path, monkeypatch, capsys, argv, message):
    monkeypatch.chdir(tmp_path)
    assert main(argv) == 2
    assert message in capsys.readouterr().err
    assert list(tmp_path.iterdir()) == []


def test_an_unknown_kind_is_a_usage_error_listing_every_kind(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    assert main(["new-pool", "fine", "--kind", "gqa"]) == 2
    err = capsys.readouterr().err
    assert "--kind" in err and "gqa" in err
    assert all(kind in err for kind in KINDS), err
    assert list(tmp_path.iterdir()) == []


def test_new_pool_never_overwrites(tmp_path, capsys):
    target = tmp_path / "mine"
    target.mkdir()
    (target / "keep.txt").write_text("mine")
    assert main(["new-pool", "mine", "--dir", str(target)]) == 2
    assert "already exists" in capsys.readouterr().err
    assert [p.name for p in target.iterdir()] == ["keep.txt"]
    empty = tmp_path / "empty"
    empty.mkdir()
    assert main(["new-pool", "mine", "--dir", str(empty)]) == 0
    assert (empty / "mine" / "__init__.py").exists()


# -- only public names -------------------------------------------------------------------------

ALLOWED_MODULES = {"__future__", "torch", "pytest", "kvcache_core.testing"}


def _bad_imports(source: str, own: str) -> list[str]:
    bad: list[str] = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            modules = [(a.name, None) for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            modules = [(node.module, a.name) for a in node.names]
        else:
            continue
        for module, name in modules:
            top = module.split(".")[0]
            if module == "kvcache_core":
                if name is not None and name not in kvcache_core.__all__:
                    bad.append(f"kvcache_core.{name} is not public")
            elif module in ALLOWED_MODULES or top == own or top in sys.stdlib_module_names:
                continue
            else:
                bad.append(f"imports {module}")
    return bad


def _examples() -> list[Path]:
    return sorted(p.parent for p in EXAMPLES.glob("*/pyproject.toml"))


@pytest.mark.parametrize("example", _examples(), ids=lambda p: p.name)
def test_examples_import_only_public_names(example):
    bad = [
        f"{path.relative_to(ROOT)}: {problem}"
        for path in example.rglob("*.py")
        if "build" not in path.parts
        for problem in _bad_imports(path.read_text(encoding="utf-8"), path.parts[-2])
    ]
    assert bad == []


@pytest.mark.parametrize(
    ("kind", "storage"), [*((k, "full") for k in KINDS), ("mha", "int8"), ("mha", "fp8")]
)
def test_scaffold_imports_only_public_names(kind, storage):
    files = render("my-pool", "my_pool", kind, storage=storage, requirement="kvcache")
    bad = [
        f"{path}: {problem}"
        for path, text in files.items()
        if path.endswith(".py")
        for problem in _bad_imports(text, "my_pool")
    ]
    assert bad == []


def test_the_import_rule_catches_a_private_import():
    assert _bad_imports("from kvcache_plugins.allocators import X", "mine") == [
        "imports kvcache_plugins.allocators"
    ]
    assert _bad_imports("from kvcache_core.storage import LayerRows", "mine") == [
        "imports kvcache_core.storage"
    ]
    assert json.dumps(_bad_imports("from kvcache_core import LayerRows", "mine")) == "[]"
