"""Read the drift corpus's ``# expect...`` comments and compare them with findings."""

from __future__ import annotations

import io
import re
import tokenize
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from kvcache_core.conformance.results.model import CheckResult, Finding

CORPUS = Path(__file__).resolve().parent.parent / "drift_corpus"

_EXPECT = re.compile(r"expect(?:\[(\w+)\])?:\s*")


@dataclass(frozen=True, order=True)
class Expected:
    """One finding a level must report: rule, class (or call site), method, file, line."""

    path: str
    line: int
    rule: str
    owner: str
    method: str | None

    def __str__(self) -> str:
        where = f"{self.owner}.{self.method}" if self.method else self.owner
        return f"{Path(self.path).name}:{self.line} [{self.rule}] {where}"


def _parse(comment: str, path: str, line: int) -> Iterable[tuple[str, Expected]]:
    """``# expect: a X.m; b Y.m; expect[source]: c Z`` -> (level tag, Expected)..."""
    text = comment.lstrip("#").strip()
    pieces = _EXPECT.split(text)
    # split() gives ["", tag, body, tag, body, ...]
    for tag, body in zip(pieces[1::2], pieces[2::2], strict=True):
        for item in body.split(";"):
            item = item.strip()
            if not item:
                continue
            rule, what = item.split()
            owner, _, method = what.partition(".")
            yield (tag or "both"), Expected(path, line, rule, owner, method or None)


def expectations(level: str, root: Path = CORPUS) -> set[Expected]:
    """Every expectation for ``level`` ("source", "signature" or "drift") under ``root``."""
    tags = {"source": {"both", "source"}, "signature": {"both"}, "drift": {"drift"}}[level]
    out: set[Expected] = set()
    for path in sorted(root.rglob("*.py")):
        source = path.read_text(encoding="utf-8")
        for tok in tokenize.generate_tokens(io.StringIO(source).readline):
            if tok.type == tokenize.COMMENT and "expect" in tok.string and ":" in tok.string:
                for tag, exp in _parse(tok.string, str(path), tok.start[0]):
                    if tag in tags:
                        out.add(exp)
    return out


def as_expected(finding: Finding) -> Expected:
    assert finding.impl_location is not None, f"no location: {finding}"
    assert finding.impl_location.line is not None, f"no line: {finding}"
    return Expected(
        str(Path(finding.impl_location.path).resolve()),
        finding.impl_location.line,
        finding.rule,
        finding.target.rsplit(".", 1)[-1],
        finding.method,
    )


def reported(results: Iterable[CheckResult]) -> set[Expected]:
    return {as_expected(f) for r in results for f in r.findings}


def diff(expected: set[Expected], got: set[Expected]) -> str:
    missing = "\n  ".join(map(str, sorted(expected - got))) or "-"
    extra = "\n  ".join(map(str, sorted(got - expected))) or "-"
    return f"\nnot reported:\n  {missing}\nunexpected:\n  {extra}"
