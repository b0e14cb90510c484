"""``kvcache check --select/--deselect ID``: which checks run and which findings are kept.

Ruff-style: ``--select`` replaces the default (everything) with the ids given, ``--deselect``
removes ids from whatever is selected; both are repeatable and take comma lists. An id is a
behaviour check id (``write-readback``, also spelled ``behaviour/write-readback``) or a rule id
(``missing-parameter``). A behaviour check that is not selected does not run at all (so a slow
or hanging check can be left out); a finding is kept when one of its ids (its rule, and for a
behaviour finding its check id) is selected and none is deselected. An unknown id is a usage
error naming the known ones, so a typo cannot silently select nothing.

Why both kinds of id: the static levels report rules, the behaviour level reports checks, and
CI wants to gate on either ("only `missing-parameter` for now", "skip `offload-roundtrip`
until #42").
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace

from .model import CheckResult, Finding, Outcome
from .rules import RULES
from .usage import UsageError

__all__ = ["BEHAVIOUR_PREFIX", "Selection", "parse_selection"]

BEHAVIOUR_PREFIX = "behaviour/"


def _ids(values: Sequence[str] | None) -> list[str]:
    names = [n.strip() for v in values or () for n in v.split(",")]
    return [n.removeprefix(BEHAVIOUR_PREFIX) for n in names if n]


def _battery_ids() -> tuple[str, ...]:
    from .battery_ids import battery_ids  # read from source: no torch

    return battery_ids()


@dataclass(frozen=True)
class Selection:
    """The ids ``--select`` chose (None: all) and those ``--deselect`` removed."""

    selected: frozenset[str] | None = None
    deselected: frozenset[str] = frozenset()

    @property
    def everything(self) -> bool:
        """No option was given: nothing is filtered."""
        return self.selected is None and not self.deselected

    def wants(self, ids: Iterable[str]) -> bool:
        """Whether something carrying ``ids`` (a finding's rule and check) is kept."""
        given = set(ids)
        if given & self.deselected:
            return False
        return self.selected is None or bool(given & self.selected)

    def behaviour_checks(self, battery: Iterable[str]) -> list[str] | None:
        """The battery's check ids to run (None: every check)."""
        if self.everything:
            return None
        # a selected rule that behaviour findings carry selects every check
        return [c for c in battery if self.wants({c, "behaviour-failed"})]

    def apply(self, results: Sequence[CheckResult]) -> list[CheckResult]:
        """Results keeping only the selected findings, outcomes recomputed."""
        if self.everything:
            return list(results)
        out: list[CheckResult] = []
        for result in results:
            check_id = result.check.removeprefix(BEHAVIOUR_PREFIX)
            behaviour = result.check.startswith(BEHAVIOUR_PREFIX)
            kept = [f for f in result.findings if self.wants(_finding_ids(f, check_id, behaviour))]
            if len(kept) == len(result.findings):
                out.append(result)
                continue
            outcome = result.outcome
            if outcome is Outcome.FAILED and not any(f.is_error for f in kept):
                outcome = Outcome.PASSED
            out.append(replace(result, findings=tuple(kept), outcome=outcome))
        return out


def _finding_ids(finding: Finding, check_id: str, behaviour: bool) -> set[str]:
    return {finding.rule, check_id} if behaviour else {finding.rule}


def parse_selection(
    select: Sequence[str] | None,
    deselect: Sequence[str] | None,
    *,
    battery: Sequence[str] | None = None,
) -> Selection:
    """``--select``/``--deselect`` values as a ``Selection``.

    ``battery`` is the behaviour check ids (default: the battery's, read from its source
    without importing it). Raises ``UsageError`` on an unknown id.
    """
    chosen, removed = _ids(select), _ids(deselect)
    if select is not None and not chosen:
        raise UsageError("--select names no check or rule id")
    unknown = [n for n in [*chosen, *removed] if n not in RULES]
    if unknown:
        checks = tuple(battery) if battery is not None else _battery_ids()
        unknown = [n for n in unknown if n not in checks]
        if unknown:
            raise UsageError(
                f"unknown check or rule id {', '.join(map(repr, unknown))}; behaviour checks: "
                f"{', '.join(checks)}; rules: {', '.join(RULES)}"
            )
    return Selection(
        selected=frozenset(chosen) if select is not None else None,
        deselected=frozenset(removed),
    )
