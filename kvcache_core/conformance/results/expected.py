"""Expected failures: behaviour checks a pool is known to fail, each with the reason it fails.

Why they exist: a pool that fails one check today should still have every *other* check guard
it in CI, and its known failure must stay visible. Why a reason is required and a passing one
is an error: an expected failure is a debt with a ticket, and a list that nobody has to touch
when the bug is fixed rots into a list of checks that no longer run.

Two places declare them, with the same meaning:

* the plugin's ``PoolSpec(expected_failures={"<check-id>": "reason"})``, shipped with the pool;
* the project's ``pyproject.toml``, for a team running the battery on pools it does not own::

      [tool.kvcache.expected-failures]
      fused-mha = { offload-roundtrip = "fp8 scales are not offloaded yet (#123)" }
      "fused-mha/write-forms-agree" = "KVWriteLoc support lands in 0.3 (#456)"

  Keys are a pool name with a table of ``check-id = "reason"``, or ``"<pool>/<check-id>"``
  with the reason. Both ``kvcache check --level behaviour`` and ``pytest --kvcache-conformance``
  read it. An empty reason, an unknown check id, a check that does not apply to the pool, or a
  pool that is not installed is a usage error naming what is known, so a typo cannot silently
  expect nothing.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

from .suppressions import read_tool_section
from .usage import UsageError

if TYPE_CHECKING:
    from ...contracts.spec import PoolSpec

__all__ = [
    "SECTION",
    "ExpectedFailure",
    "check_applicable",
    "check_known_ids",
    "expected_failures_for",
    "load_expected_failures",
    "parse_expected_failures",
    "validate_expected_failures",
]

#: The key under ``[tool.kvcache]``.
SECTION = "expected-failures"


@dataclass(frozen=True)
class ExpectedFailure:
    """One declared expected failure: which check of which pool, why, and where it was said."""

    pool: str
    check: str
    reason: str
    origin: str

    def describe(self) -> str:
        return f"{self.reason} (declared in {self.origin})"


def _reason(value: object, where: str) -> str:
    if not isinstance(value, str) or not value.strip():
        raise UsageError(
            f"{where} needs a reason: why the check fails, and where that is tracked "
            '(e.g. "reload drops fp8 scales, #123")'
        )
    return value.strip()


def parse_expected_failures(section: Mapping[str, object], origin: str) -> list[ExpectedFailure]:
    """The ``expected-failures`` table of a ``[tool.kvcache]`` section, shape-checked only.

    Check ids and pool names are validated later, against the battery and the installed pools
    (`validate_expected_failures`), because reading the table must not import torch.
    """
    table = section.get(SECTION, {})
    head = f"{origin}: [tool.kvcache.{SECTION}]"
    if not isinstance(table, dict):
        raise UsageError(f'{head} must be a table: `"<pool>" = {{ "<check-id>" = "reason" }}`')
    out: list[ExpectedFailure] = []
    for key, value in table.items():
        if "/" in key:
            pool, _, check = key.partition("/")
            if not pool or not check or "/" in check:
                raise UsageError(f'{head}: key {key!r} must read "<pool>/<check-id>"')
            out.append(ExpectedFailure(pool, check, _reason(value, f"{head} {key!r}"), origin))
            continue
        if not isinstance(value, dict):
            raise UsageError(
                f"{head}: {key!r} must be a table of check ids with reasons, "
                f'`{key} = {{ "<check-id>" = "reason" }}`, or use the key "{key}/<check-id>"'
            )
        if not value:
            raise UsageError(f"{head}: {key!r} lists no check")
        for check, reason in value.items():
            where = f"{head} {key}.{check}"
            out.append(ExpectedFailure(key, check, _reason(reason, where), origin))
    seen: dict[tuple[str, str], ExpectedFailure] = {}
    for entry in out:
        pair = (entry.pool, entry.check)
        if pair in seen:
            raise UsageError(f"{head}: {entry.pool}/{entry.check} is declared twice")
        seen[pair] = entry
    return out


def load_expected_failures(path: str | None) -> list[ExpectedFailure]:
    """``[tool.kvcache.expected-failures]`` of the ``pyproject.toml`` at ``path`` (None: none)."""
    if path is None:
        return []
    _, section = read_tool_section(path)
    return parse_expected_failures(section, path)


def expected_failures_for(
    spec: PoolSpec, configured: Iterable[ExpectedFailure] = ()
) -> dict[str, ExpectedFailure]:
    """Every expected failure of ``spec`` by check id: its own declarations, then the project's.

    The project's entry wins when both name a check (the project runs the battery, so its
    reason is the one to show). A check id the battery does not know, or one that does not
    apply to the pool's capabilities (so it would never run, and never be found stale), is a
    ``UsageError``.
    """
    merged = {
        check: ExpectedFailure(spec.name, check, reason, f"PoolSpec {spec.name!r}")
        for check, reason in spec.expected_failures.items()
    }
    merged.update({e.check: e for e in configured if e.pool == spec.name})
    _check_ids(spec, merged.values())
    return merged


def _check_ids(spec: PoolSpec, entries: Iterable[ExpectedFailure]) -> None:
    from ..behaviour import BATTERY, select_checks

    applicable = {c.id for c in select_checks(spec)}  # also registers the battery
    for entry in entries:
        if entry.check not in BATTERY:
            raise UsageError(
                f"{entry.origin}: expected failure {entry.pool}/{entry.check}: unknown behaviour "
                f"check {entry.check!r}; known: {', '.join(BATTERY)}"
            )
        if entry.check not in applicable:
            needs = ", ".join(sorted(str(c) for c in BATTERY[entry.check].requires))
            raise UsageError(
                f"{entry.origin}: expected failure {entry.pool}/{entry.check}: the check does "
                f"not run on pool {entry.pool!r} (it needs capabilities: {needs}); remove it"
            )


def check_known_ids(configured: Iterable[ExpectedFailure]) -> None:
    """Every configured entry names a check id the battery has (a ``UsageError`` otherwise).

    What ``kvcache check`` can hold any entry to before it knows which pools it will run: a
    typo in a check id would otherwise expect nothing, silently, while the pool name may
    legitimately belong to a plugin another run checks.
    """
    from .battery_ids import battery_ids  # read from source: the source level imports no torch

    known = battery_ids()
    for entry in configured:
        if entry.check not in known:
            raise UsageError(
                f"{entry.origin}: expected failure {entry.pool}/{entry.check}: unknown behaviour "
                f"check {entry.check!r}; known: {', '.join(known)}"
            )


def check_applicable(configured: Iterable[ExpectedFailure], specs: Mapping[str, PoolSpec]) -> None:
    """Entries naming a pool of ``specs`` (the pools a run checks) name checks that run on it.

    ``kvcache check`` calls it when the behaviour level runs: an expected failure of a check
    the pool's capabilities never select would never be found stale.
    """
    for entry in configured:
        spec = specs.get(entry.pool)
        if spec is not None:
            _check_ids(spec, [entry])


def validate_expected_failures(
    configured: Iterable[ExpectedFailure], specs: Mapping[str, PoolSpec]
) -> None:
    """Every configured entry names an installed pool and a check that runs on it."""
    for entry in configured:
        spec = specs.get(entry.pool)
        if spec is None:
            raise UsageError(
                f"{entry.origin}: expected failure {entry.pool}/{entry.check}: no installed "
                f"pool is named {entry.pool!r}; installed: {', '.join(sorted(specs)) or 'none'}"
            )
        _check_ids(spec, [entry])
