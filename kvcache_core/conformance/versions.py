"""Which published contract version an implementation matches, for findings that say
"matches contract 1; contract 2 added `mamba_indices`".

Kept beside the checker, not in ``contracts/``: the contract is data, diagnosing an
implementation against it is the checker's job (and ``contracts/`` must not import it).
"""

from __future__ import annotations

from ..contracts.history import VERSIONS
from ..contracts.signature import MethodSig
from .compare import compare_signatures

__all__ = ["change_note"]


def change_note(method: str, impl: MethodSig, current: int) -> str:
    """If ``impl`` exactly matches an older version of ``method``, say so and what changed."""
    for number in sorted(VERSIONS, reverse=True):
        if number >= current:
            continue
        old = VERSIONS[number].methods.get(method)
        if old is None:
            continue
        errors = [
            f for f in compare_signatures(old, impl, target="") if f.rule != "return-mismatch"
        ]
        if not errors:
            changes = [
                VERSIONS[v].changes[method]
                for v in range(number + 1, current + 1)
                if method in VERSIONS[v].changes
            ]
            return f"matches contract {number}; " + "; ".join(changes) if changes else ""
    return ""
