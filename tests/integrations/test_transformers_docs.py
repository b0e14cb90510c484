"""The guide's example runs as printed, and what it says about pool choice holds."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

GUIDE = Path(__file__).resolve().parents[2] / "docs" / "integrations" / "transformers.md"


def test_the_guide_example_runs(capsys: pytest.CaptureFixture[str]) -> None:
    blocks = re.findall(r"```python\n(.*?)```", GUIDE.read_text(encoding="utf-8"), re.S)
    assert len(blocks) == 1
    exec(compile(blocks[0], str(GUIDE), "exec"), {"__name__": "guide"})
    pool, retractions, offloaded = capsys.readouterr().out.split()
    assert (pool, retractions) == ("mha", "1") and int(offloaded) > 0


def test_the_guide_names_the_supported_range() -> None:
    from kvcache_core.integrations.transformers import SUPPORTED_TRANSFORMERS

    assert f"`transformers{SUPPORTED_TRANSFORMERS}`" in GUIDE.read_text(encoding="utf-8")
    pyproject = (GUIDE.parents[2] / "pyproject.toml").read_text(encoding="utf-8")
    assert f'hf = ["transformers{SUPPORTED_TRANSFORMERS}"]' in pyproject
