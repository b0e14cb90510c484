"""The runtime signature level: compare ``inspect.signature`` of a class's methods with the
contract Protocol's. Discovery runs exactly this at engine start-up (it is cheap: no instance
is built, nothing is called).
"""

from __future__ import annotations

import inspect

from ..contracts.history import change_note
from ..contracts.spec import CONTRACT_VERSION
from .compare import compare_signatures
from .introspect import protocol_methods
from .model import Finding, Location
from .signature_model import sig_from_callable

__all__ = ["class_location", "signature_findings"]


def class_location(cls: type) -> Location | None:
    """Where ``cls`` is defined, when its source file can be found."""
    try:
        path = inspect.getsourcefile(cls)
        line = inspect.getsourcelines(cls)[1]
    except (OSError, TypeError):
        return None
    return Location(path, line) if path else None


def _defining_class(cls: type, name: str) -> type | None:
    return next((k for k in cls.__mro__ if name in vars(k)), None)


def signature_findings(
    cls: type, protocol: type, *, contract_version: int = CONTRACT_VERSION
) -> list[Finding]:
    """Every signature finding of ``cls`` against ``protocol`` (methods only).

    Inherited methods are looked up along the MRO, and findings point at the class that really
    defines the method, which is where the fix has to go.
    """
    target = f"{cls.__module__}.{cls.__qualname__}"
    findings: list[Finding] = []
    for name, contract in protocol_methods(protocol).items():
        owner = _defining_class(cls, name)
        if owner is None or owner is object:
            findings.append(
                Finding(
                    rule="missing-method",
                    message=f"{protocol.__name__} requires `{contract.render()}`; "
                    f"{cls.__qualname__} does not define it",
                    target=target,
                    method=name,
                    hint=f"def {contract.render()}: ...",
                    contract_location=Location(contract.path, contract.line)
                    if contract.path
                    else None,
                    impl_location=class_location(cls),
                )
            )
            continue
        raw = inspect.getattr_static(cls, name)
        func = raw.__func__ if isinstance(raw, (staticmethod, classmethod)) else raw
        if not callable(func):
            findings.append(
                Finding(
                    rule="missing-method",
                    message=f"`{name}` on {owner.__qualname__} is not a method",
                    target=target,
                    method=name,
                    hint=f"def {contract.render()}: ...",
                    impl_location=class_location(owner),
                )
            )
            continue
        try:
            impl = sig_from_callable(name, func, bound=isinstance(raw, staticmethod))
        except (TypeError, ValueError) as exc:
            findings.append(
                Finding(
                    rule="load-error",
                    message=f"cannot read the signature of `{name}`: {exc}",
                    target=target,
                    method=name,
                )
            )
            continue
        found = compare_signatures(contract, impl, target=target)
        if any(f.is_error for f in found):
            note = change_note(name, impl, contract_version)
            if note:
                found = compare_signatures(contract, impl, target=target, note=note)
        findings.extend(found)
    return findings
