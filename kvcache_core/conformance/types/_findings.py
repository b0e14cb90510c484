"""Turn one mypy error about one (class, contract member) into a ``Finding``.

mypy's notes carry the two sides ("Expected: def ...", "Got: def ..."): both go into the message,
as stubtest prints stub and runtime side by side, so the reader sees the whole disagreement
without opening a file. The parameter that differs is found by parsing both signatures and asking
the house's one signature comparison; when that cannot tell (a type mypy and the text disagree
on), the finding still stands, only without a parameter. When only the bound-method check failed
(parameter names), mypy prints the contract side alone and the other side is read from source.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Mapping
from dataclasses import replace

from ...contracts.signature import MethodSig
from ..members.compare import compare_signatures
from ..members.signatures import sig_from_ast
from ..members.versions import change_note
from ..results.model import Finding, Location
from ..results.rules import RULES
from ._contract import ContractMember

__all__ = ["member_finding", "signature_from_note"]

_ATTRIBUTE = re.compile(r'^(?P<name>\w+): expected "(?P<expected>.*)", got "(?P<got>.*)"$')
_GENERIC_DEF = re.compile(r"^(async )?def \[[^\]]*\] ")
_SEE_DOCS = "See https://"


def signature_from_note(text: str) -> MethodSig | None:
    """``def f(self, x: Tensor, y: int = ...) -> None`` (mypy's spelling) as a ``MethodSig``."""
    text = _GENERIC_DEF.sub("def ", text.strip())
    if not text.startswith(("def ", "async def ")):
        return None
    try:
        node = ast.parse(f"{text}: ...").body[0]
    except SyntaxError:
        return None
    if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
        return None
    return sig_from_ast(node)


def _blocks(notes: list[str]) -> tuple[list[str], list[str], list[str]]:
    """``(expected lines, got lines, other notes)`` of one error's notes."""
    expected: list[str] = []
    got: list[str] = []
    other: list[str] = []
    current: list[str] | None = None
    for note in notes:
        stripped = note.strip()
        if stripped == "Expected:":
            current = expected
        elif stripped == "Got:":
            current = got
        elif current is not None and note.startswith("        "):
            current.append(stripped)
        else:
            current = None
            if not stripped.startswith(("Following member(s)", _SEE_DOCS)):
                other.append(stripped)
    return expected, got, other


def _with_contract_defaults(impl: MethodSig, contract: MethodSig | None) -> MethodSig:
    """mypy prints every default as ``...``; assume the contract's (the signature level checks
    defaults), so only what mypy can see is compared."""
    if contract is None:
        return impl
    params = []
    for param in impl.params:
        want = contract.get(param.name)
        if param.default == "..." and want is not None and want.default is not None:
            param = replace(param, default=want.default)
        params.append(param)
    return replace(impl, params=tuple(params))


def _differences(
    contract: MethodSig | None, impl: MethodSig | None
) -> tuple[str | None, str, bool]:
    """``(first differing parameter, an account of every difference, any of them an error)``."""
    if contract is None or impl is None:
        return None, "", False
    found = compare_signatures(contract, impl, target="")
    reasons = []
    for finding in found:
        what = RULES[finding.rule].summary
        reasons.append(f"`{finding.parameter}`: {what}" if finding.parameter else what)
    first = next((f.parameter for f in found if f.parameter), None)
    return first, "; ".join(dict.fromkeys(reasons)), any(f.is_error for f in found)


def _rename(text: str, names: Mapping[str, ContractMember]) -> str:
    """Generated Protocol names (``_kvc_M3``) back to the contract's (``KVPool``)."""

    def owner(match: re.Match[str]) -> str:
        member = names.get(match.group())
        return member.owner if member is not None else match.group()

    return re.sub(r"_kvc_[MC]\d+", owner, text)


#: Rules that describe what mypy's bound-method check adds: parameter names and kinds.
_NAME_RULES = frozenset(
    {
        "renamed-parameter",
        "missing-parameter",
        "parameter-kind-changed",
        "parameter-order-changed",
        "kwargs-hides-parameter",
        "extra-required-parameter",
    }
)


def _names_only(
    member: ContractMember, call_notes: list[str], impl_sig: MethodSig | None, protocol: str
) -> tuple[str, str | None, list[str]]:
    """The instance matched but the bound method did not: parameter names (or kinds) differ.

    mypy prints only the contract side here; the implementation side is read from its source.
    """
    expected = next(
        (n.split(" has type ", 1)[1].strip('"') for n in call_notes if " has type " in n), ""
    )
    expected = expected.replace("def __call__(", f"def {member.name}(", 1) or member.display
    got = f"def {impl_sig.render()}" if impl_sig is not None else "(source not found)"
    message = (
        f"`{member.name}` does not match {protocol}: parameter names differ (callers passing "
        f"them by keyword break): expected `{expected}`, got `{got}`"
    )
    parameter: str | None = None
    details: list[str] = []
    if impl_sig is not None and member.sig is not None:
        found = [
            f for f in compare_signatures(member.sig, impl_sig, target="") if f.rule in _NAME_RULES
        ]
        parameter = next((f.parameter for f in found if f.parameter), None)
        details = [f"`{f.parameter}`: {RULES[f.rule].summary}" for f in found if f.parameter]
    return message, parameter, details


def _from_notes(
    member: ContractMember, notes: list[str], protocol: str, class_name: str, version: int
) -> tuple[str, str | None, list[str]]:
    """The class did not match the one-member Protocol: mypy's notes carry both sides."""
    name = member.name
    expected, got, other = _blocks(notes)
    if expected or got:
        message = (
            f"`{name}` does not match {protocol}: expected `{'; '.join(expected)}`, "
            f"got `{'; '.join(got)}`"
        )
        impl = signature_from_note(got[0]) if len(got) == 1 else None
        if impl is not None:
            impl = _with_contract_defaults(impl, member.sig)
        parameter, why, breaking = _differences(member.sig, impl)
        details = [why] if why else []
        # As the signature level does: name an older contract only for a breaking difference.
        if breaking and impl is not None:
            note = change_note(name, impl, version)
            if note:
                details.append(note)
        return message, parameter, details
    if not other:  # a one-member Protocol and no note: mypy found no such member at all
        return f"{class_name} does not define `{name}`, which {protocol} requires", None, []
    message = f"`{name}` does not match {protocol}"
    attribute = next((m for m in map(_ATTRIBUTE.match, other) if m is not None), None)
    if attribute is not None:
        other = [o for o in other if _ATTRIBUTE.match(o) is None]
        message += f": expected `{attribute['expected']}`, got `{attribute['got']}`"
    return message, None, other


def member_finding(
    member: ContractMember,
    notes: list[str] | None,
    *,
    call_notes: list[str] | None = None,
    impl_sig: MethodSig | None = None,
    protocol: str,
    target: str,
    class_name: str,
    impl_location: Location | None,
    protocol_names: Mapping[str, ContractMember],
    contract_version: int,
) -> Finding:
    """The finding for mypy's errors about ``member`` of a class.

    ``notes`` are those of the class-against-one-member-Protocol assignment (None when that
    passed), ``call_notes`` those of the bound-method assignment (None when it passed);
    ``impl_sig`` is the method as its source writes it, when it could be read.
    """
    if notes is not None:
        renamed = [_rename(n, protocol_names) for n in notes]
        message, parameter, details = _from_notes(
            member, renamed, protocol, class_name, contract_version
        )
    else:
        renamed = [_rename(n, protocol_names) for n in call_notes or []]
        message, parameter, details = _names_only(member, renamed, impl_sig, protocol)
    if details:
        message += " (" + "; ".join(details) + ")"
    if member.is_method:
        hint = f"match the contract: `{member.display}`"
    else:
        hint = (
            f"declare `{member.display}` (in the class body, or `self.{member.name} = ...` "
            "in __init__)"
        )
    return Finding(
        rule="type-error",
        message=message,
        target=target,
        method=member.name,
        parameter=parameter,
        hint=hint,
        contract_location=Location(member.path, member.line),
        impl_location=impl_location,
    )
