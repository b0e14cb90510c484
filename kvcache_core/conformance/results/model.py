"""The checker's one result model: (target x check) -> outcome + findings.

Every renderer (text, JSON, JUnit, SARIF, GitHub) and discovery's validation read this model and
nothing else, so a finding looks the same wherever it is reported.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field

from .rules import RULES, Severity

__all__ = ["CheckResult", "Finding", "Location", "Outcome", "Related", "unparsable_file"]


class Outcome(str, enum.Enum):
    PASSED = "passed"
    FAILED = "failed"
    ERROR = "error"
    SKIPPED = "skipped"
    EXPECTED_FAILURE = "expected-failure"

    def __str__(self) -> str:
        return self.value


@dataclass(frozen=True)
class Location:
    """A file and 1-based line; ``line`` is None when only the file is known."""

    path: str
    line: int | None = None

    def __str__(self) -> str:
        return f"{self.path}:{self.line}" if self.line is not None else self.path


@dataclass(frozen=True)
class Related:
    """Another place a finding concerns (a call site that breaks), with what happens there."""

    location: Location
    message: str


@dataclass(frozen=True)
class Finding:
    """One precise disagreement between an implementation and the contract."""

    rule: str
    message: str
    target: str
    method: str | None = None
    parameter: str | None = None
    hint: str = ""
    contract_location: Location | None = None
    impl_location: Location | None = None
    severity: Severity | None = None
    #: A runnable snippet that shows the problem on its own (behaviour findings).
    reproduction: str = ""
    #: The levels that saw this finding (``("source", "signature", "types")``), in run order.
    #: Filled in when the same finding from several levels is merged into one (see
    #: ``merge.merge_levels``); empty on a finding fresh from one check.
    levels: tuple[str, ...] = ()
    #: Other places the finding concerns: the call sites that break because of it
    #: (``kvcache drift``), one finding however many there are.
    related: tuple[Related, ...] = ()

    def __post_init__(self) -> None:
        if self.rule not in RULES:
            raise ValueError(f"unknown rule id {self.rule!r}")
        if self.severity is None:
            object.__setattr__(self, "severity", RULES[self.rule].severity)

    @property
    def is_error(self) -> bool:
        return self.severity is Severity.ERROR

    def __str__(self) -> str:
        where = f"{self.target}.{self.method}" if self.method else self.target
        return f"[{self.rule}] {where}: {self.message}"


@dataclass(frozen=True)
class CheckResult:
    """The outcome of one check (a level against one Protocol) on one target."""

    target: str
    check: str
    outcome: Outcome
    findings: tuple[Finding, ...] = ()
    detail: str = ""
    duration_s: float = 0.0
    extra: dict[str, object] = field(default_factory=dict, compare=False)


def unparsable_file(path: str, exc: Exception, level: str) -> CheckResult:
    """The ``load-error`` result for a file that cannot be parsed, at ``level``.

    One wording for every level that reads source (the source level, ``kvcache drift``), so a
    syntax error reads the same whichever command met it.
    """
    line = getattr(exc, "lineno", None)
    message = f"cannot parse {path}: {type(exc).__name__}: {exc}"
    finding = Finding(
        rule="load-error",
        message=message,
        target=path,
        hint="fix the syntax error; nothing in this file was checked",
        impl_location=Location(path, line if isinstance(line, int) else None),
    )
    return CheckResult(path, level, Outcome.ERROR, (finding,), detail=message)
