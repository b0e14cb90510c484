"""Which published contract version an implementation matches, for findings that say
"matches contract 1; contract 2 added `mamba_indices`".

Kept beside the checker, not in ``contracts/``: the contract is data, diagnosing an
implementation against it is the checker's job (and ``contracts/`` must not import it).

"Matches" means *exactly*: the same parameters, in the same order, of the same kinds, with the
same defaults, and the same annotations where the implementation writes one. A signature that
would merely accept every call of the old version (one with ``**kwargs``, or an extra optional
parameter of its own) was not written against it, and saying so would mislead the reader.
"""

from __future__ import annotations

from ...contracts.history import VERSIONS
from ...contracts.signature import MethodSig, Param
from .signatures import normalize_annotation

__all__ = ["change_note", "matches_exactly"]

#: How mypy prints every default: it says there is one, not which.
_ANY_DEFAULT = "..."


def _same_default(want: str | None, got: str | None) -> bool:
    if want is None or got is None:
        return want is got
    if got == _ANY_DEFAULT:
        return True
    return want.replace('"', "'").strip() == got.replace('"', "'").strip()


def _same_annotation(want: str | None, got: str | None) -> bool:
    """Equal after normalisation; an implementation that writes none says nothing against."""
    if got is None or want is None:
        return True
    return normalize_annotation(want) == normalize_annotation(got)


def _same_param(want: Param, got: Param) -> bool:
    return (
        want.name == got.name
        and want.kind is got.kind
        and _same_default(want.default, got.default)
        and _same_annotation(want.annotation, got.annotation)
    )


def matches_exactly(version: MethodSig, impl: MethodSig) -> bool:
    """Whether ``impl`` is ``version``'s signature as written (annotations may be left out)."""
    return (
        len(version.params) == len(impl.params)
        and all(_same_param(w, g) for w, g in zip(version.params, impl.params, strict=True))
        and _same_annotation(version.returns, impl.returns)
    )


def change_note(method: str, impl: MethodSig, current: int) -> str:
    """If ``impl`` exactly matches an older version of ``method``, say so and what changed."""
    for number in sorted(VERSIONS, reverse=True):
        if number >= current:
            continue
        old = VERSIONS[number].methods.get(method)
        if old is None or not matches_exactly(old, impl):
            continue
        changes = [
            VERSIONS[v].changes[method]
            for v in range(number + 1, current + 1)
            if method in VERSIONS[v].changes
        ]
        return f"matches contract {number}; " + "; ".join(changes) if changes else ""
    return ""
