"""Suppressions: accepted findings, each with the reason it is accepted.

Two places, both requiring a reason (a suppression without one is a usage error, exit 2):

* ``pyproject.toml``::

      [tool.kvcache]
      suppress = [
        {rule = "annotation-mismatch", target = "*.LegacyPool", reason = "vendored, fixed in 2.0"},
      ]

  ``target`` (default ``*``) is a glob over the finding's target (``pkg.mod.Class``) or its
  last component; ``method`` (optional) a glob over the method name.
* an inline comment on the line a finding points at (the ``def`` line, the class line, or the
  offending line inside a body)::

      def get_cpu_copy(self, indices):  # kvcache: ignore[missing-parameter] v1 engine only

A suppression that matches no finding is itself reported (``unused-suppression``), so stale
ones do not pile up. Suppressed findings are taken out of their result and kept, with the
reason, in ``CheckResult.extra["suppressed"]``.
"""

from __future__ import annotations

import io
import os
import re
import sys
import tokenize
from collections.abc import Collection, Iterable, Sequence
from dataclasses import dataclass, replace
from fnmatch import fnmatchcase

from .model import CheckResult, Finding, Location, Outcome
from .rules import RULES
from .usage import UsageError

__all__ = [
    "Suppression",
    "apply_suppressions",
    "find_pyproject",
    "load_pyproject",
    "read_tool_section",
    "scan_inline",
]

_INLINE = re.compile(r"#\s*kvcache:\s*ignore\[([^\]]*)\](.*)$")
#: What a file must hold for any of its comments to match ``_INLINE`` (tokenizing is slow).
_INLINE_ANYWHERE = re.compile(r"#\s*kvcache:\s*ignore\[")
_KEYS = frozenset({"rule", "target", "method", "reason"})


@dataclass(frozen=True)
class Suppression:
    """One accepted rule, where it was written, and why."""

    rule: str
    reason: str
    origin: Location
    target: str = "*"
    method: str | None = None
    inline: bool = False

    def matches(self, finding: Finding) -> bool:
        if finding.rule != self.rule:
            return False
        if self.inline:
            where = finding.impl_location
            return (
                where is not None
                and where.line == self.origin.line
                and _same_file(where.path, self.origin.path)
            )
        short = finding.target.rsplit(".", 1)[-1]
        if not (fnmatchcase(finding.target, self.target) or fnmatchcase(short, self.target)):
            return False
        return self.method is None or fnmatchcase(finding.method or "", self.method)


def _same_file(a: str, b: str) -> bool:
    return os.path.realpath(a) == os.path.realpath(b)


def _check_rule(rule: str, where: str) -> None:
    if rule not in RULES:
        raise UsageError(f"{where}: unknown rule id {rule!r}; known: {', '.join(sorted(RULES))}")


def find_pyproject(start: str = ".") -> str | None:
    """The nearest ``pyproject.toml`` at or above ``start``."""
    here = os.path.abspath(start)
    while True:
        candidate = os.path.join(here, "pyproject.toml")
        if os.path.isfile(candidate):
            return candidate
        parent = os.path.dirname(here)
        if parent == here:
            return None
        here = parent


def _entry_line(text: str, rule: str) -> int | None:
    """Best-effort line of a ``suppress`` entry (tomllib keeps no positions)."""
    lines = text.splitlines()
    start = next((i for i, line in enumerate(lines) if "[tool.kvcache" in line), 0)
    for number in range(start, len(lines)):
        if f'"{rule}"' in lines[number] or f"'{rule}'" in lines[number]:
            return number + 1
    return None


def read_tool_section(path: str) -> tuple[str, dict[str, object]]:
    """The text of ``path`` and its ``[tool.kvcache]`` table (empty when absent).

    One reader for every key of the table (``suppress``, ``expected-failures``), so each is
    parsed the same way, with the same errors.
    """
    with open(path, "rb") as fh:
        raw = fh.read()
    text = raw.decode("utf-8", errors="replace")
    if sys.version_info >= (3, 11):
        import tomllib
    else:  # pragma: no cover - the project's CI runs 3.11+
        if "[tool.kvcache" in text:
            raise UsageError(
                f"{path}: reading [tool.kvcache] needs Python 3.11+ (tomllib); "
                "use inline `# kvcache: ignore[...]` comments on Python 3.10"
            )
        return text, {}
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise UsageError(f"{path}: invalid TOML: {exc}") from None
    section = data.get("tool", {}).get("kvcache", {})
    if not isinstance(section, dict):
        raise UsageError(f"{path}: [tool.kvcache] must be a table")
    return text, section


def load_pyproject(path: str) -> list[Suppression]:
    """``[tool.kvcache] suppress`` of ``path``; an invalid entry is a ``UsageError``."""
    text, section = read_tool_section(path)
    entries = section.get("suppress", [])
    if not isinstance(entries, list):
        raise UsageError(f"{path}: [tool.kvcache] suppress must be a list of tables")
    out: list[Suppression] = []
    for number, entry in enumerate(entries, start=1):
        where = f"{path}: [tool.kvcache] suppress entry {number}"
        if not isinstance(entry, dict):
            raise UsageError(f"{where} must be a table like {{rule = ..., reason = ...}}")
        unknown = set(entry) - _KEYS
        if unknown:
            raise UsageError(f"{where}: unknown key(s) {', '.join(sorted(unknown))}")
        rule = entry.get("rule")
        if not isinstance(rule, str):
            raise UsageError(f'{where} needs `rule = "<rule-id>"`')
        _check_rule(rule, where)
        reason = entry.get("reason")
        if not isinstance(reason, str) or not reason.strip():
            raise UsageError(f"{where} ({rule}) has no reason: say why it is accepted")
        target = entry.get("target", "*")
        method = entry.get("method")
        if not isinstance(target, str) or not (method is None or isinstance(method, str)):
            raise UsageError(f"{where}: `target` and `method` must be strings")
        out.append(
            Suppression(
                rule=rule,
                reason=reason.strip(),
                origin=Location(path, _entry_line(text, rule)),
                target=target,
                method=method,
            )
        )
    return out


def _comments(path: str) -> Iterable[tuple[int, str]]:
    with open(path, "rb") as fh:
        source = fh.read().decode("utf-8-sig", errors="replace")
    if "kvcache:" not in source or not _INLINE_ANYWHERE.search(source):
        return []
    try:
        tokens = list(tokenize.generate_tokens(io.StringIO(source).readline))
    except (tokenize.TokenError, SyntaxError):
        return []
    return [(t.start[0], t.string) for t in tokens if t.type == tokenize.COMMENT]


def scan_inline(paths: Iterable[str]) -> list[Suppression]:
    """Every ``# kvcache: ignore[rule, ...] reason`` comment in ``paths``."""
    out: list[Suppression] = []
    for path in sorted(set(paths)):
        try:
            comments = _comments(path)
        except OSError:
            continue
        for line, text in comments:
            match = _INLINE.search(text)
            if match is None:
                continue
            where = f"{path}:{line}"
            rules = [r.strip() for r in match.group(1).split(",") if r.strip()]
            if not rules:
                raise UsageError(f"{where}: `kvcache: ignore[]` names no rule id")
            reason = match.group(2).strip()
            if not reason:
                raise UsageError(
                    f"{where}: `# kvcache: ignore[{', '.join(rules)}]` has no reason: "
                    "write why after the bracket"
                )
            for rule in rules:
                _check_rule(rule, where)
                out.append(Suppression(rule, reason, Location(path, line), inline=True))
    return out


def _outcome(result: CheckResult, findings: Sequence[Finding]) -> Outcome:
    if result.outcome in (Outcome.ERROR, Outcome.SKIPPED):
        return result.outcome
    return Outcome.FAILED if any(f.is_error for f in findings) else Outcome.PASSED


def apply_suppressions(
    results: Sequence[CheckResult],
    suppressions: Sequence[Suppression],
    *,
    active_rules: Collection[str] | None = None,
) -> list[CheckResult]:
    """Results without suppressed findings, plus one result per origin with unused ones.

    ``active_rules`` are the rules the checks that ran can report (None: all). A suppression of
    another rule is not "unused": ``kvcache drift`` cannot judge a types-level suppression.
    """
    out: list[CheckResult] = []
    used: set[int] = set()
    for result in results:
        kept: list[Finding] = []
        hidden: list[dict[str, str]] = []
        for finding in result.findings:
            number = next((i for i, s in enumerate(suppressions) if s.matches(finding)), None)
            if number is None:
                kept.append(finding)
            else:
                used.add(number)
                hit = suppressions[number]
                hidden.append({"rule": finding.rule, "reason": hit.reason, "by": str(hit.origin)})
        if not hidden:
            out.append(result)
            continue
        extra = dict(result.extra)
        extra["suppressed"] = hidden
        out.append(
            replace(result, findings=tuple(kept), outcome=_outcome(result, kept), extra=extra)
        )
    unused: dict[str, list[Finding]] = {}
    for number, s in enumerate(suppressions):
        if number in used or (active_rules is not None and s.rule not in active_rules):
            continue
        what = f"[{s.rule}]" + ("" if s.inline else f" target={s.target}")
        unused.setdefault(s.origin.path, []).append(
            Finding(
                rule="unused-suppression",
                message=f"suppression {what} ({s.reason}) matched no finding",
                target=s.origin.path,
                hint="delete it: the finding it accepted is gone (or it names the wrong rule or "
                "line)",
                impl_location=s.origin,
            )
        )
    for origin, findings in unused.items():
        out.append(CheckResult(origin, "suppressions", Outcome.PASSED, tuple(findings)))
    return out
