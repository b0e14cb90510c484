"""What a behaviour check is, and how checks are registered.

A check is a plain function of a `CheckContext` that raises `BehaviourFailure`
when the pool misbehaves. Checks register themselves with `behaviour_check`, stating the
capabilities they need, so the battery a pool gets follows from the capabilities its
``PoolSpec`` declares (the way scikit-learn picks estimator checks from an estimator's tags).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from ...contracts.spec import Capability

if TYPE_CHECKING:
    from ._context import CheckContext

__all__ = ["BATTERY", "BehaviourCheck", "BehaviourFailure", "behaviour_check"]


class BehaviourFailure(AssertionError):
    """A pool did something the contract forbids.

    ``message`` says what differed (which check, slot, layer, part); ``reproduction`` is a
    runnable snippet that shows it on its own; ``hint`` says what to change. Subclassing
    ``AssertionError`` makes a failure read naturally inside pytest.
    """

    def __init__(self, message: str, *, reproduction: str = "", hint: str = "") -> None:
        super().__init__(message)
        self.message = message
        self.reproduction = reproduction
        self.hint = hint


CheckFunction = Callable[["CheckContext"], None]


@dataclass(frozen=True)
class BehaviourCheck:
    """One named check: ``behaviour/<id>`` in every report."""

    id: str
    function: CheckFunction
    requires: frozenset[Capability]
    hint: str
    summary: str

    @property
    def name(self) -> str:
        return f"behaviour/{self.id}"

    def applies_to(self, capabilities: frozenset[Capability]) -> bool:
        return self.requires <= capabilities


#: Every registered check by id, in registration order (which is also run order).
BATTERY: dict[str, BehaviourCheck] = {}


def behaviour_check(
    check_id: str, *, requires: frozenset[Capability] | set[Capability] = frozenset(), hint: str
) -> Callable[[CheckFunction], CheckFunction]:
    """Register ``function`` as the check ``check_id`` (ids are stable: never rename one)."""

    def register(function: CheckFunction) -> CheckFunction:
        if check_id in BATTERY:
            raise ValueError(f"behaviour check {check_id!r} registered twice")
        doc = (function.__doc__ or "").strip().splitlines()
        BATTERY[check_id] = BehaviourCheck(
            check_id, function, frozenset(requires), hint, doc[0] if doc else check_id
        )
        return function

    return register
