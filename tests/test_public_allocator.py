"""The allocators are public API: a third-party subclass is checked cleanly at every level."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import pytest

import kvcache_core
from kvcache_core.cli import main


def test_allocators_are_public_names_and_the_old_module_reexports_them():
    from kvcache_plugins import allocators

    for name in ("PagedSlotAllocator", "TokenSlotAllocator", "ForwardsOffload", "FreeGroup"):
        assert name in kvcache_core.__all__
    assert allocators.PagedSlotAllocator is kvcache_core.PagedSlotAllocator
    assert allocators.TokenSlotAllocator is kvcache_core.TokenSlotAllocator


@pytest.mark.parametrize("level", ["source", "signature", "types"])
def test_a_subclass_gets_no_unresolved_base_at_any_level(tmp_path, monkeypatch, capsys, level):
    package = tmp_path / "thirdparty_alloc"
    package.mkdir()
    (package / "__init__.py").write_text(
        textwrap.dedent(
            """
            from kvcache_core import PagedSlotAllocator


            class MyAllocator(PagedSlotAllocator):
                \"\"\"Adds nothing: every member is inherited from kvcache_core.\"\"\"
            """
        )
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.chdir(tmp_path)
    target = "thirdparty_alloc/__init__.py" if level == "source" else "thirdparty_alloc:MyAllocator"
    code = main(
        ["check", target, "--against", "PagedAllocator", "--level", level, "--format", "json"]
    )
    report = json.loads(capsys.readouterr().out)
    assert code == 0, report
    assert "unresolved-base" not in json.dumps(report)
    assert Path(package / "__init__.py").exists()
