"""Signature comparison, written once: used by discovery, the source level and the runtime
signature level alike.

The question asked is the caller's: *can every call the contract allows be made to this
implementation, with the same meaning?* Each way it cannot is one finding with a stable rule id,
both signatures in the message, and a hint with the exact parameter text to write.
"""

from __future__ import annotations

from collections.abc import Callable

from ...contracts.signature import MethodSig, Param, ParamKind
from ..results.model import Finding, Location
from .annotations import parameter_conflicts, return_conflicts

__all__ = ["compare_signatures"]

#: add(rule, parameter, message, hint)
_Emit = Callable[[str, "str | None", str, str], None]


def _loc(path: str | None, line: int | None) -> Location | None:
    return Location(path, line) if path else None


def _defaults_equal(a: str | None, b: str | None) -> bool:
    return (a or "").replace('"', "'").strip() == (b or "").replace('"', "'").strip()


def compare_signatures(
    contract: MethodSig,
    impl: MethodSig,
    *,
    target: str,
    note: str = "",
) -> list[Finding]:
    """Every way ``impl`` cannot stand in for ``contract``; empty when it can.

    ``note`` is appended to each finding's message (discovery and the checker use it to say
    which older contract version the implementation matches).
    """
    if impl.params == contract.params and impl.returns == contract.returns:
        return []  # written exactly as the contract: the common case at engine start-up
    findings: list[Finding] = []

    def both() -> str:  # rendered only when there is something to report
        return f"contract: {contract.render()}; implementation: {impl.render()}"

    suffix = f" ({note})" if note else ""

    def add(rule: str, param: str | None, message: str, hint: str) -> None:
        findings.append(
            Finding(
                rule=rule,
                message=f"{message}{suffix}. {both()}",
                target=target,
                method=contract.name,
                parameter=param,
                hint=hint,
                contract_location=_loc(contract.path, contract.line),
                impl_location=_loc(impl.path, impl.line),
            )
        )

    contract_names = {p.name for p in contract.params}
    has_var_kw = any(p.kind is ParamKind.VAR_KEYWORD for p in impl.params)
    has_var_pos = any(p.kind is ParamKind.VAR_POSITIONAL for p in impl.params)
    impl_positional = [p for p in impl.params if p.positional]

    renamed: set[str] = set()
    for index, want in enumerate(contract.params):
        if want.kind in (ParamKind.VAR_POSITIONAL, ParamKind.VAR_KEYWORD):
            continue
        got = impl.get(want.name)
        if got is None:
            other = _missing(
                add, want, index, impl_positional, contract_names, has_var_kw, has_var_pos
            )
            if other is not None:
                renamed.add(other)
            continue
        _compare_param(add, want, index, got, impl)

    for extra in impl.params:
        # A renamed parameter is reported once, as renamed, not again as an extra one.
        if extra.name not in contract_names and extra.name not in renamed and extra.required:
            add(
                "extra-required-parameter",
                extra.name,
                f"requires `{extra.name}`, which callers of the contract never pass",
                f"give it a default (`{extra.render()} = ...`) or remove it",
            )

    if return_conflicts(contract.returns, impl.returns):
        add(
            "return-mismatch",
            None,
            f"returns `{impl.returns}`, the contract returns `{contract.returns}`: callers may "
            "get a value the contract does not promise",
            f"annotate the return as `-> {contract.returns}`",
        )
    return findings


def _missing(
    emit: _Emit,
    want: Param,
    index: int,
    impl_positional: list[Param],
    contract_names: set[str],
    has_var_kw: bool,
    has_var_pos: bool,
) -> str | None:
    """Report a contract parameter the implementation lacks; return the name it was renamed
    to, if that is what happened."""
    if want.positional and index < len(impl_positional):
        other = impl_positional[index]
        if other.name not in contract_names:
            emit(
                "renamed-parameter",
                want.name,
                f"`{want.name}` is called `{other.name}` here; callers passing "
                f"`{want.name}=` by keyword get a TypeError",
                f"rename `{other.name}` to `{want.render()}`",
            )
            return other.name
    if has_var_kw and want.kind is not ParamKind.POSITIONAL_ONLY:
        emit(
            "kwargs-hides-parameter",
            want.name,
            f"`{want.name}` is only accepted through `**kwargs`, where it is easily dropped "
            "instead of forwarded",
            f"declare `{want.render()}` explicitly and pass it on",
        )
        return None
    if has_var_pos and want.kind is ParamKind.POSITIONAL_ONLY:
        return None
    emit(
        "missing-parameter",
        want.name,
        f"does not accept `{want.name}`; a caller passing it gets "
        "`TypeError: unexpected keyword argument`",
        f"add `{want.render()}`",
    )
    return None


def _compare_param(emit: _Emit, want: Param, index: int, got: Param, impl: MethodSig) -> None:
    if want.kind is ParamKind.POSITIONAL_OR_KEYWORD and got.kind is not want.kind:
        emit(
            "parameter-kind-changed",
            want.name,
            f"`{want.name}` is {got.kind} here but {want.kind} in the contract",
            f"declare it as `{want.render()}` before any `*` or `/`",
        )
    elif want.kind is ParamKind.KEYWORD_ONLY and got.kind not in (
        ParamKind.KEYWORD_ONLY,
        ParamKind.POSITIONAL_OR_KEYWORD,
    ):
        emit(
            "parameter-kind-changed",
            want.name,
            f"`{want.name}` is {got.kind} here but keyword-only in the contract",
            f"declare it as `*, {want.render()}`",
        )
    elif want.positional and got.positional and impl.index(got.name) != index:
        emit(
            "parameter-order-changed",
            want.name,
            f"`{want.name}` is positional parameter {impl.index(got.name) + 1} here "
            f"but {index + 1} in the contract",
            f"move `{want.render()}` to position {index + 1}",
        )
    if not want.required and got.required:
        emit(
            "became-required",
            want.name,
            f"`{want.name}` has no default here; the contract's callers may omit it",
            f"write `{want.render()}`",
        )
    elif not want.required and not _defaults_equal(want.default, got.default):
        emit(
            "default-changed",
            want.name,
            f"`{want.name}` defaults to `{got.default}` here but `{want.default}` in the contract",
            f"write `{want.render()}`",
        )
    if parameter_conflicts(want.annotation, got.annotation):
        emit(
            "annotation-mismatch",
            want.name,
            f"`{want.name}` is annotated `{got.annotation}` here but `{want.annotation}` "
            "in the contract: it does not accept every value the contract's callers pass",
            f"write `{want.render()}`",
        )
