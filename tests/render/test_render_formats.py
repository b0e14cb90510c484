"""Every format renders every outcome; unknown formats are refused."""

from __future__ import annotations

import pytest

from kvcache_core.conformance.reporting.render import FORMATS, render
from kvcache_core.conformance.results.model import CheckResult


def test_formats() -> None:
    assert FORMATS == ("text", "json", "junit", "sarif", "github")


@pytest.mark.parametrize("fmt", FORMATS)
def test_every_format_renders_every_outcome(fmt: str, results: list[CheckResult]) -> None:
    out = render(results, fmt)
    assert out.endswith("\n")
    assert "broken" in out


@pytest.mark.parametrize("fmt", FORMATS)
def test_no_results(fmt: str) -> None:
    assert render([], fmt).endswith("\n")


def test_unknown_format() -> None:
    with pytest.raises(ValueError, match="unknown format 'yaml'; formats: text, json"):
        render([], "yaml")
