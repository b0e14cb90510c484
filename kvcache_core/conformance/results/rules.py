"""Stable rule ids of the checker, with default severities and one-line summaries.

Rule ids are part of the public interface (SARIF, JSON, suppressions): never rename one.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

__all__ = ["RULES", "Rule", "Severity"]


class Severity(str, enum.Enum):
    ERROR = "error"
    WARNING = "warning"
    NOTE = "note"

    def __str__(self) -> str:
        return self.value


@dataclass(frozen=True)
class Rule:
    id: str
    severity: Severity
    summary: str


_ALL = [
    Rule("missing-method", Severity.ERROR, "a contract method is not implemented"),
    Rule("missing-parameter", Severity.ERROR, "a contract parameter is not accepted"),
    Rule(
        "extra-required-parameter",
        Severity.ERROR,
        "the implementation requires a parameter the contract does not pass",
    ),
    Rule(
        "renamed-parameter", Severity.ERROR, "a contract parameter is accepted under another name"
    ),
    Rule(
        "parameter-kind-changed",
        Severity.ERROR,
        "a parameter can no longer be passed the way the contract passes it",
    ),
    Rule(
        "parameter-order-changed",
        Severity.ERROR,
        "a positional parameter moved to another position",
    ),
    Rule("became-required", Severity.ERROR, "an optional contract parameter has no default"),
    Rule("default-changed", Severity.ERROR, "an optional parameter has a different default"),
    Rule(
        "kwargs-hides-parameter",
        Severity.ERROR,
        "**kwargs stands in for a named contract parameter",
    ),
    Rule(
        "parameter-not-forwarded",
        Severity.ERROR,
        "a pass-through accepts a parameter and never passes it on",
    ),
    Rule(
        "annotation-mismatch",
        Severity.WARNING,
        "a parameter's annotation differs from the contract's",
    ),
    Rule("return-mismatch", Severity.WARNING, "the return annotation differs from the contract's"),
    Rule(
        "not-implemented",
        Severity.ERROR,
        "a declared capability's method only raises NotImplementedError",
    ),
    Rule("missing-attribute", Severity.ERROR, "a contract attribute is not defined"),
    Rule("type-error", Severity.ERROR, "mypy reports the class does not satisfy the Protocol"),
    Rule("behaviour-failed", Severity.ERROR, "a behavioural check failed"),
    Rule(
        "behaviour-unexpected-pass",
        Severity.ERROR,
        "a behavioural check declared as an expected failure passed",
    ),
    Rule("load-error", Severity.ERROR, "the target could not be loaded or parsed"),
    Rule("unused-suppression", Severity.WARNING, "a suppression matched no finding"),
    Rule(
        "writeloc-not-unwrapped",
        Severity.ERROR,
        "a write path indexes with `loc` before unwrapping a possible KVWriteLoc",
    ),
    Rule(
        "unaccepted-keyword",
        Severity.ERROR,
        "a call site passes a keyword that some implementer of the method does not accept",
    ),
    Rule(
        "unresolved-base",
        Severity.WARNING,
        "a base class could not be found without importing it; inherited members are unchecked",
    ),
    Rule("store-check-failed", Severity.ERROR, "a snapshot store failed a store-battery check"),
    Rule(
        "missing-engine-name",
        Severity.ERROR,
        "a plugin takes a name from an engine module that no longer defines it",
    ),
]

RULES: dict[str, Rule] = {r.id: r for r in _ALL}
