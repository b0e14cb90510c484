"""``kvcache check PATH --against ENGINE:Class``: an engine's own class as the contract, read
from source, constructor included, for classes that subclass it or are installed in its place
(also from inside a plugin's patch method)."""

from __future__ import annotations

from pathlib import Path

import pytest

ENGINE = (
    "class Base:\n"
    "    def __init__(self, size, page_size, speculative_eagle_topk=None):\n"
    "        self.size = size\n"
    "\n"
    "    def alloc(self, need_size):\n"
    "        return need_size\n"
    "\n"
    "    def clear(self, src_indices):\n"
    "        return src_indices\n"
)

PLUGIN = (
    "import types\n"
    "\n"
    "\n"
    "class Patch:\n"
    '    target_module = "engine"\n'
    "\n"
    "    def apply(self, mod: types.ModuleType):\n"
    '        Base = getattr(mod, "Base")\n'
    "\n"
    "        class Elastic(Base):\n"
    "            def __init__(self, size, page_size):\n"
    "                super().__init__(size, page_size)\n"
    "\n"
    "            def alloc(self, need_size, extra):\n"
    "                return need_size\n"
    "\n"
    "            def clear(self, src_index):\n"
    "                return src_index\n"
    "\n"
    "        class Standalone:\n"
    "            def alloc(self, n):\n"
    "                return n\n"
    "\n"
    "        mod.Base = Elastic\n"
    "        mod.Other = Standalone\n"
)


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    (tmp_path / "engine.py").write_text(ENGINE, encoding="utf-8")
    (tmp_path / "plug").mkdir()
    (tmp_path / "plug" / "patch.py").write_text(PLUGIN, encoding="utf-8")
    return tmp_path


def test_a_patch_class_is_held_to_the_engine_class_constructor_included(run_cli, tree):
    run = run_cli("check", "plug", "--level", "source", "--against", "engine.py:Base", cwd=tree)
    assert run.code == 1
    found = {(f.rule, f.method, f.parameter, str(f.severity)) for f in run.findings()}
    assert found == {
        ("missing-parameter", "__init__", "speculative_eagle_topk", "error"),
        ("extra-required-parameter", "alloc", "extra", "error"),
        # an engine class is no keyword contract: a rename is a warning here
        ("renamed-parameter", "clear", "src_indices", "warning"),
    }
    (result,) = run.results
    assert result.check == "source:Base"
    assert result.target.endswith("Patch.apply.Elastic")  # Standalone replaces nothing of Base


def test_a_replacement_that_does_not_subclass_is_compared_with_what_it_replaces(run_cli, tree):
    (tree / "plug" / "patch.py").write_text(
        "import engine\n\n\nclass Mine:\n    def __init__(self, size):\n        self.size = size\n"
        "\n\nengine.Base = Mine\n",
        encoding="utf-8",
    )
    run = run_cli("check", "plug", "--level", "source", "--against", "engine.py:Base", cwd=tree)
    params = sorted(f.parameter for f in run.findings() if f.method == "__init__")
    assert params == ["page_size", "speculative_eagle_topk"]
    assert all("replaces" in f.message for f in run.findings())


def test_usage_errors_name_what_is_wrong(run_cli, tree):
    run = run_cli("check", "plug", "--level", "source", "--against", "engine.py:Nope", cwd=tree)
    assert run.code == 2 and "defines no class Nope" in run.err
    run = run_cli("check", "plug", "--level", "source", "--against", "missing.py:Base", cwd=tree)
    assert run.code == 2 and "no file missing.py" in run.err
    (tree / "plug" / "patch.py").write_text("class Unrelated:\n    pass\n", encoding="utf-8")
    run = run_cli("check", "plug", "--level", "source", "--against", "engine.py:Base", cwd=tree)
    assert run.code == 2 and "subclasses or replaces" in run.err
