"""The checker's findings on sglang's pools as ids, and the ids docs/engines.md documents.

Why ids: ``make interop`` must fail when the checker finds a difference that "Coming from
sglang" does not list, and pass when every one is listed, whatever the exact wording of a
message. A finding's id is what stays put while sglang or the battery's wording moves:

- a signature, attribute or types finding: ``<rule>:<method>(<parameter>)``, e.g.
  ``renamed-parameter:free(indices)``; ``<rule>:<name>`` when it concerns one member only
  (``type-error:device``, ``missing-attribute:swa_layer_ids``);
- a behaviour finding: its check, ``behaviour/<check-id>`` (one id per check, whichever sglang
  pool fails it: the table row says which ones, and why).

The same drift seen by several levels is one id (the levels' findings are merged first, as
every report merges them). The table's first column holds one or more ids in backticks; a row
of the differential run (``scales-in-place``) and a row of the checker share the table.

Nothing here imports sglang or torch: the suite tests the parser and the comparison on its own.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
TABLE_HEADING = "## Coming from sglang"
BEHAVIOUR_RULES = frozenset({"behaviour-failed", "behaviour-unexpected-pass"})

#: Findings that are the checker's mistakes, not sglang's differences, with where they are
#: fixed. Listed, never failing the run; one that no longer shows is reported, so the entry
#: is removed once the fix lands.
KNOWN_FALSE_POSITIVES: Mapping[str, str] = {}


def finding_id(check: str, rule: str, method: str | None, parameter: str | None) -> str:
    """The id of one finding (see the module docstring)."""
    if rule in BEHAVIOUR_RULES:
        return check if check.startswith("behaviour/") else f"behaviour/{check}"
    if method and parameter:
        return f"{rule}:{method}({parameter})"
    return f"{rule}:{method or parameter or '?'}"


def documented_ids(text: str | None = None) -> set[str]:
    """Every id in the first column of the "Coming from sglang" table."""
    if text is None:
        text = (ROOT / "docs" / "engines.md").read_text(encoding="utf-8")
    start = text.index(TABLE_HEADING)
    section = text[start + len(TABLE_HEADING) :]
    end = section.find("\n#")
    section = section if end < 0 else section[:end]
    ids: set[str] = set()
    for line in section.splitlines():
        if not line.startswith("|") or line.startswith("|---"):
            continue
        first = line.split("|")[1]
        ids.update(re.findall(r"`([^`]+)`", first))
    return ids


def result_ids(results: Sequence[Any]) -> dict[str, str]:
    """``{id: one message}`` for every finding of every result (``CheckResult``s, merged)."""
    found: dict[str, str] = {}
    for result in results:
        for finding in result.findings:
            key = finding_id(result.check, finding.rule, finding.method, finding.parameter)
            found.setdefault(key, f"{result.target}: {finding.message}")
    return found


@dataclass
class Comparison:
    """Observed ids against the table: what is undocumented decides the exit status."""

    observed: dict[str, str]
    documented: set[str]
    false_positives: Mapping[str, str] = field(default_factory=lambda: dict(KNOWN_FALSE_POSITIVES))

    @property
    def undocumented(self) -> dict[str, str]:
        return {
            k: v
            for k, v in self.observed.items()
            if k not in self.documented and k not in self.false_positives
        }

    @property
    def seen(self) -> list[str]:
        return sorted(k for k in self.observed if k in self.documented)

    @property
    def stale_false_positives(self) -> list[str]:
        return sorted(k for k in self.false_positives if k not in self.observed)

    @property
    def ok(self) -> bool:
        return not self.undocumented

    def report(self, unseen_from: Iterable[str] = ()) -> list[str]:
        """Lines for the terminal; ``unseen_from`` are documented ids this stage could see."""
        lines = [f"checker findings documented ({len(self.seen)}): {', '.join(self.seen)}"]
        unseen = sorted(set(unseen_from) - set(self.observed))
        if unseen:
            lines.append(f"checker ids documented, not observed: {', '.join(unseen)}")
        for key in sorted(k for k in self.false_positives if k in self.observed):
            lines.append(f"known false positive {key}: {self.false_positives[key]}")
        for key in self.stale_false_positives:
            lines.append(f"false positive {key} no longer reported: remove it from the list")
        for key, example in sorted(self.undocumented.items()):
            lines.append(f"UNDOCUMENTED {key}: {' '.join(example.split())[:300]}")
        return lines


def is_checker_id(key: str) -> bool:
    """Whether a documented id names a checker finding (not a differential-run probe)."""
    return key.startswith("behaviour/") or ":" in key


def run_checker(plugin: str = "sglang") -> list[Any]:
    """Every level of ``kvcache check PLUGIN``, findings merged across levels as reports do.

    Behaviour results are not handed to the merge: each behaviour check's finding is its own
    (until the merge keeps them apart itself, it folds them into one).
    """
    from kvcache_core.conformance.members.sources import SourceIndex
    from kvcache_core.conformance.results.merge import merge_levels
    from kvcache_core.conformance.runner import ALL_LEVELS, run_levels
    from kvcache_core.conformance.targets.resolve import resolve_targets

    index = SourceIndex()
    targets, results = resolve_targets([plugin], against=None, index=index, read_plugins=False)
    results += run_levels(targets, ALL_LEVELS, index=index)
    behaviour = [r for r in results if r.check.startswith("behaviour")]
    static = [r for r in results if not r.check.startswith("behaviour")]
    return [*merge_levels(static), *behaviour]
