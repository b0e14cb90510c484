"""The per-method checks both the source level and the runtime signature level run.

Each level only differs in *how* it gets a method (``ast`` from a file, or a live function and
its ``inspect.getsource``); what it then checks is written here once: the signature comparison
(``compare_signatures``, with the contract-history note), and the body checks of ``_bodies``.
"""

from __future__ import annotations

import ast
import inspect
import re
from collections.abc import Collection, Sequence
from functools import cache

from ...contracts.history import CONTRACT_VERSION, VERSIONS
from ...contracts.signature import MethodSig
from ..results.model import Finding, Location, Outcome
from .bodies import dropped_parameters, only_raises_not_implemented, raw_loc_uses
from .compare import compare_signatures
from .contract_source import (
    source_attribute_location,
    source_protocol_attributes,
    source_protocol_methods,
)
from .introspect import protocol_attributes, protocol_methods
from .versions import change_note

__all__ = [
    "BODY_RULES",
    "PROTOCOL_ORDER",
    "attribute_finding",
    "attribute_location",
    "body_findings",
    "body_may_find",
    "contract_attributes",
    "contract_methods",
    "dropped_how",
    "forward_hint",
    "method_findings",
    "missing_method",
    "outcome_for",
    "protocol_by_name",
    "split_by_protocol",
]

#: Every contract Protocol by name, bases before the Protocols that extend them. A target's
#: methods are reported under the first Protocol of this order that it claims and that
#: requires them, so a method shared by KVPool and OffloadablePool is reported once.
PROTOCOL_ORDER: tuple[str, ...] = (
    "KVPool",
    "OffloadablePool",
    "MLAPool",
    "IndexerKeyPool",
    "SlidingWindowPool",
    "HiSparsePool",
    "MambaStatePool",
    "TokenAllocator",
    "PagedAllocator",
    "SWAAllocator",
    "MambaSlotAllocator",
)


def outcome_for(findings: Sequence[Finding]) -> Outcome:
    """FAILED when any finding is an error; warnings and notes alone still pass."""
    return Outcome.FAILED if any(f.is_error for f in findings) else Outcome.PASSED


def protocol_by_name(name: str) -> type:
    """The contract Protocol called ``name`` (raises ``KeyError`` listing the valid names)."""
    from ... import contracts

    if name not in PROTOCOL_ORDER:
        raise KeyError(f"unknown protocol {name!r}; known: {', '.join(PROTOCOL_ORDER)}")
    proto = getattr(contracts, name)
    assert isinstance(proto, type)
    return proto


def _methods(proto: type | str) -> dict[str, MethodSig]:
    """A Protocol's methods: from the class, or, given its name, from its source (the source
    level's way: no import, hence no torch; the same answer, see ``contract_source``)."""
    if isinstance(proto, str):
        _known(proto)
        return source_protocol_methods(proto)
    return protocol_methods(proto)


def _attributes(proto: type | str) -> dict[str, str]:
    if isinstance(proto, str):
        _known(proto)
        return source_protocol_attributes(proto)
    return protocol_attributes(proto)


def _known(name: str) -> None:
    if name not in PROTOCOL_ORDER:
        raise KeyError(f"unknown protocol {name!r}; known: {', '.join(PROTOCOL_ORDER)}")


def contract_methods(proto: type | str, version: int = CONTRACT_VERSION) -> dict[str, MethodSig]:
    """The methods ``proto`` (a Protocol, or its name: read from source) requires under
    contract ``version``.

    The current version is read from the Protocol itself (with its file and line); an older
    version replaces the methods ``history`` records for it, keeping the Protocol's location.
    """
    methods = dict(_methods(proto))
    if version != CONTRACT_VERSION:
        for name, old in VERSIONS[version].methods.items():
            if name in methods:
                current = methods[name]
                methods[name] = MethodSig(
                    old.name, old.params, old.returns, current.path, current.line
                )
    return methods


def contract_attributes(proto: type | str) -> dict[str, str]:
    return dict(_attributes(proto))


def split_by_protocol(
    protocols: Sequence[str], *, from_source: bool = False
) -> list[tuple[str, list[str], list[str]]]:
    """``(protocol, its methods, its attributes)`` with each member under one Protocol only
    (``from_source``: the Protocols read from their source, not imported)."""
    ordered = sorted(
        dict.fromkeys(protocols),
        key=lambda p: PROTOCOL_ORDER.index(p) if p in PROTOCOL_ORDER else len(PROTOCOL_ORDER),
    )
    seen: set[str] = set()
    out: list[tuple[str, list[str], list[str]]] = []
    for name in ordered:
        proto: type | str = name if from_source else protocol_by_name(name)
        methods = [m for m in _methods(proto) if m not in seen]
        attrs = [a for a in _attributes(proto) if a not in seen]
        seen.update(methods)
        seen.update(attrs)
        out.append((name, methods, attrs))
    return out


def _loc(sig: MethodSig) -> Location | None:
    return Location(sig.path, sig.line) if sig.path else None


def missing_method(
    contract: MethodSig,
    *,
    protocol: str,
    target: str,
    class_name: str,
    where: Location | None,
    why: str = "",
) -> Finding:
    """``class_name`` does not define ``contract`` (``why`` says more, e.g. "only a stub")."""
    return Finding(
        rule="missing-method",
        message=f"{protocol} requires `{contract.render()}`; {class_name} "
        + (why or "does not define it"),
        target=target,
        method=contract.name,
        hint=f"def {contract.render()}: ...",
        contract_location=_loc(contract),
        impl_location=where,
    )


@cache
def attribute_location(proto: type, name: str) -> Location | None:
    """The line of the Protocol (or its base) that declares attribute ``name``."""
    pattern = re.compile(rf"^\s+{re.escape(name)}\s*:")
    for klass in proto.__mro__:
        if name not in vars(klass).get("__annotations__", {}):
            continue
        try:
            lines, first = inspect.getsourcelines(klass)
            path = inspect.getsourcefile(klass)
        except (OSError, TypeError):
            return None
        for offset, text in enumerate(lines):
            if pattern.match(text) and path:
                return Location(path, first + offset)
    return None


def attribute_finding(
    name: str,
    annotation: str,
    *,
    protocol: str,
    target: str,
    class_name: str,
    where: Location,
    from_source: bool = False,
) -> Finding:
    return Finding(
        rule="missing-attribute",
        message=f"{protocol} requires attribute `{name}: {annotation}`; {class_name} never "
        "assigns it (no class-level definition, no `self." + name + " = ...` in any method)",
        target=target,
        parameter=name,
        hint=f"set `self.{name}` in `__init__` (type `{annotation}`)",
        contract_location=source_attribute_location(protocol, name)
        if from_source
        else attribute_location(protocol_by_name(protocol), name),
        impl_location=where,
    )


def forward_hint(call: str, param: str, star: str) -> str:
    """The delegate call written so that it passes ``param`` on (valid code: a keyword the call
    already passes with another value gets the parameter instead, never a second time)."""
    try:
        node = ast.parse(call, mode="eval").body
    except SyntaxError:
        return f"pass `{star}{param}` on to `{call}`"
    if not isinstance(node, ast.Call):
        return f"pass `{star}{param}` on to `{call}`"
    value = ast.Name(param, ast.Load())
    if star == "*":
        node.args.append(ast.Starred(value, ast.Load()))
    elif star == "**":
        node.keywords.append(ast.keyword(None, value))
    else:
        same = [k for k in node.keywords if k.arg == param]
        if same:
            same[0].value = value
        else:
            node.keywords.append(ast.keyword(param, value))
    return f"write `{ast.unparse(node)}`"


def dropped_how(call: str, param: str, star: str) -> str:
    """How the delegate call loses ``param``: without it, or with another value in its place."""
    shown = f"{star}{param}"
    try:
        node = ast.parse(call, mode="eval").body
    except SyntaxError:
        node = None
    if isinstance(node, ast.Call) and not star:
        for kw in node.keywords:
            if kw.arg == param:
                return (
                    f"`{call}` passes `{param}={ast.unparse(kw.value)}` instead of it, so "
                    f"callers' `{shown}` is silently replaced"
                )
    return f"`{call}` is called without it, so callers' `{shown}` is silently dropped"


#: The rules ``body_findings`` reports: read from a method's body, not from its signature.
BODY_RULES = frozenset({"not-implemented", "parameter-not-forwarded", "writeloc-not-unwrapped"})


def body_may_find(contract: MethodSig, names: Collection[str]) -> bool:
    """Whether ``body_findings`` could report anything on a body that uses only ``names``.

    ``names`` are the global and attribute names the body (nested functions included) refers to,
    e.g. a code object's ``co_names``: a body can only raise ``NotImplementedError`` if it names
    it, and only delegates to ``<other>.<method>(...)`` if it names the method. Write paths
    (a ``KVWriteLoc`` parameter) are always read. A False here lets a caller skip reading and
    parsing the source, which is what keeps discovery's body checks cheap.
    """
    return (
        "NotImplementedError" in names
        or contract.name in names
        or any("KVWriteLoc" in (p.annotation or "") for p in contract.params)
    )


def body_findings(
    contract: MethodSig,
    impl: MethodSig,
    node: ast.FunctionDef | ast.AsyncFunctionDef,
    *,
    protocol: str,
    target: str,
    owner: str | None,
    path: str | None,
    line_offset: int = 0,
) -> list[Finding]:
    """Findings read from the method's body: not-implemented, not forwarded, raw ``loc``."""
    findings: list[Finding] = []
    contract_at = _loc(contract)

    def at(line: int) -> Location | None:
        return Location(path, line + line_offset) if path else None

    if only_raises_not_implemented(node):
        inherited = f" (inherited from {owner})" if owner else ""
        findings.append(
            Finding(
                rule="not-implemented",
                message=f"`{contract.name}`{inherited} only raises NotImplementedError, yet the "
                f"class claims {protocol}: engines find the method with `hasattr` and call it",
                target=target,
                method=contract.name,
                hint=f"implement `{contract.render()}`; or, if the class cannot, delete the "
                f"method and stop declaring {protocol}, so engines see it cannot",
                contract_location=contract_at,
                impl_location=at(node.lineno),
            )
        )
    wanted = {p.name for p in contract.params}
    for drop in dropped_parameters(node, contract.name, wanted):
        shown = f"{drop.star}{drop.param}"
        findings.append(
            Finding(
                rule="parameter-not-forwarded",
                message=f"`{contract.name}` accepts `{shown}` but never passes it on: "
                + dropped_how(drop.call, drop.param, drop.star),
                target=target,
                method=contract.name,
                parameter=drop.param,
                hint=forward_hint(drop.call, drop.param, drop.star),
                contract_location=contract_at,
                impl_location=at(drop.line),
            )
        )
    for index, want in enumerate(contract.params):
        if "KVWriteLoc" not in (want.annotation or ""):
            continue
        got = impl.get(want.name)
        if got is None and index < len(impl.params) and impl.params[index].positional:
            got = impl.params[index]
        if got is None:
            continue
        uses = raw_loc_uses(node, got.name)
        if uses:
            more = f" (and {len(uses) - 1} more)" if len(uses) > 1 else ""
            findings.append(
                Finding(
                    rule="writeloc-not-unwrapped",
                    message=f"`{contract.name}` indexes with `{got.name}` as it arrives "
                    f"(`{uses[0].text}`){more}, but the contract passes "
                    f"`{want.render()}`: a KVWriteLoc used as an index raises or writes the "
                    "wrong rows",
                    target=target,
                    method=contract.name,
                    parameter=got.name,
                    hint=f"unwrap it first: `{got.name}, swa_{got.name} = "
                    f"unwrap_write_loc({got.name})` (from kvcache_core import unwrap_write_loc)",
                    contract_location=contract_at,
                    impl_location=at(uses[0].line),
                )
            )
    return findings


def method_findings(
    contract: MethodSig,
    impl: MethodSig,
    node: ast.FunctionDef | ast.AsyncFunctionDef | None,
    *,
    protocol: str,
    target: str,
    owner: str | None,
    contract_version: int,
    path: str | None,
    line_offset: int = 0,
) -> list[Finding]:
    """Everything one level can say about one contract method of one class.

    ``owner`` names the base class that really defines the method when it is inherited (None
    when the class defines it itself); ``path``/``line_offset`` place the body's lines.
    """
    found = compare_signatures(contract, impl, target=target)
    if any(f.is_error for f in found):
        note = change_note(contract.name, impl, contract_version)
        if note:
            found = compare_signatures(contract, impl, target=target, note=note)
    if node is not None:
        found += body_findings(
            contract,
            impl,
            node,
            protocol=protocol,
            target=target,
            owner=owner,
            path=path,
            line_offset=line_offset,
        )
    return found
