"""Renderers of the checker's one result model: every output format reads ``CheckResult``s and
nothing else, so a finding says the same thing in a terminal, a CI log, a JUnit report and a
code-scanning alert.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from ...results.model import CheckResult
from ..report import FORMATS
from . import github, jsonout, junit, sarif, text

__all__ = ["FORMATS", "render"]

_RENDERERS: dict[str, Callable[[Sequence[CheckResult]], str]] = {
    "text": text.render,
    "json": jsonout.render,
    "junit": junit.render,
    "sarif": sarif.render,
    "github": github.render,
}


def render(results: Sequence[CheckResult], fmt: str) -> str:
    """``results`` in format ``fmt`` (one of `FORMATS`); raises ``ValueError`` otherwise."""
    try:
        renderer = _RENDERERS[fmt]
    except KeyError:
        raise ValueError(f"unknown format {fmt!r}; formats: {', '.join(FORMATS)}") from None
    return renderer(results)
