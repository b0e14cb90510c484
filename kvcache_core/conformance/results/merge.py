"""One finding per drift, however many levels saw it.

The source, signature and types levels often see the same drift (a missing ``mamba_indices`` is
a finding to all three). Reported once per level, one drift reads as three and the summary
counts three. So findings that agree (same target, rule, method and parameter) across levels are
merged into the first one reported, the one of the cheapest level, which lists every level that
saw it in ``Finding.levels``. The types level says ``type-error`` for whatever mypy rejects; a
``type-error`` about the same target, method and parameter as an *error* of another level is
mypy seeing that same drift, so it is merged into it too (the precise rule id is kept). One
about no parameter in particular, or matching only a warning, stays on its own: merging it into
a warning would turn an error into a warning.

This runs after suppressions and before rendering. After suppressions: a suppression matches a
finding by rule, target, method and line, which every level's copy shares, so each copy is hidden
by the same suppression, and each result's outcome is recomputed from its own findings (merging
first would leave a later level's result failed on a finding that was then suppressed). Before
rendering: every format, and the summary's counts, see one finding per drift.

A result whose findings were all merged into another level's keeps its outcome (that check did
see the drift) and says, in its ``detail``, where its findings are reported.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

from .model import CheckResult, Finding

__all__ = ["level_of", "merge_levels"]

_Key = tuple[str, str, str | None, str | None]
_MYPY = "type-error"


def level_of(check: str) -> str:
    """``source:KVPool`` -> ``source``; ``drift:overrides`` -> ``drift``; ``load`` -> ``load``;
    ``behaviour/write-isolation`` -> ``behaviour``.

    Every check of one level must map to that level: findings are merged only *across*
    levels, and two behaviour checks read as two levels would merge their failures (which
    share target and rule) into one, losing every message and reproduction but the first.
    """
    return check.split(":", 1)[0].split("/", 1)[0]


def _key(finding: Finding) -> _Key:
    return (finding.target, finding.rule, finding.method, finding.parameter)


def _param_key(finding: Finding) -> _Key:
    return (finding.target, "", finding.method, finding.parameter)


def _label(finding: Finding) -> str:
    where = finding.method or ""
    if finding.parameter:
        where += f"({finding.parameter})"
    return f"[{finding.rule}] {where}".rstrip()


def merge_levels(results: Sequence[CheckResult]) -> list[CheckResult]:
    """``results`` with each finding seen by several levels kept once, listing those levels."""
    kept: list[list[Finding]] = [[] for _ in results]
    moved: list[list[tuple[Finding, str]]] = [[] for _ in results]
    first: dict[_Key, tuple[int, int]] = {}
    errors: dict[_Key, tuple[int, int]] = {}  # precise error findings, by (target, method, param)
    for number, result in enumerate(results):
        level = level_of(result.check)
        for finding in result.findings:
            finding = replace(finding, levels=finding.levels or (level,))
            where = first.get(_key(finding))
            if where is None and finding.rule == _MYPY and finding.parameter is not None:
                where = errors.get(_param_key(finding))
            if where is not None:
                at_result, at_finding = where
                earlier = kept[at_result][at_finding]
                new = [lv for lv in finding.levels if lv not in earlier.levels]
                if at_result != number and new:
                    kept[at_result][at_finding] = replace(earlier, levels=(*earlier.levels, *new))
                    moved[number].append((finding, results[at_result].check))
                    continue
            else:
                first[_key(finding)] = (number, len(kept[number]))
                if finding.is_error and finding.rule != _MYPY and finding.parameter is not None:
                    errors.setdefault(_param_key(finding), (number, len(kept[number])))
            kept[number].append(finding)
    out: list[CheckResult] = []
    for number, result in enumerate(results):
        if not moved[number]:
            out.append(replace(result, findings=tuple(kept[number])))
            continue
        notes = [f"{_label(f)}: reported under {check}" for f, check in moved[number]]
        count = len(notes)
        said = (
            f"{count} finding{'' if count == 1 else 's'} also seen by other levels, "
            "reported once: " + "; ".join(notes)
        )
        detail = f"{result.detail.rstrip()}\n{said}" if result.detail.strip() else said
        extra = dict(result.extra)
        extra["merged"] = [
            {
                "rule": f.rule,
                "method": f.method,
                "parameter": f.parameter,
                "reported_under": check,
            }
            for f, check in moved[number]
        ]
        out.append(replace(result, findings=tuple(kept[number]), detail=detail, extra=extra))
    return out
