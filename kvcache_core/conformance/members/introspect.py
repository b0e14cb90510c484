"""Read a contract Protocol's members (methods and attributes) as neutral signatures."""

from __future__ import annotations

import inspect
from functools import cache

from typing_extensions import get_protocol_members

from ...contracts.signature import MethodSig
from .signatures import sig_from_callable

__all__ = ["protocol_attributes", "protocol_methods"]


def _mro_lookup(proto: type, name: str) -> tuple[type, object] | None:
    for klass in proto.__mro__:
        if name in vars(klass):
            return klass, vars(klass)[name]
    return None


@cache
def protocol_methods(proto: type) -> dict[str, MethodSig]:
    """Contract methods of ``proto`` (inherited ones included), by name, sorted by name."""
    methods: dict[str, MethodSig] = {}
    for name in sorted(get_protocol_members(proto)):
        found = _mro_lookup(proto, name)
        if found is None:
            continue
        _, value = found
        if inspect.isfunction(value):
            methods[name] = sig_from_callable(name, value)
    return methods


@cache
def protocol_attributes(proto: type) -> dict[str, str]:
    """Data members of ``proto`` (name -> annotation text), properties included."""
    attrs: dict[str, str] = {}
    for name in sorted(get_protocol_members(proto)):
        found = _mro_lookup(proto, name)
        if found is not None and inspect.isfunction(found[1]):
            continue
        for klass in proto.__mro__:
            ann = vars(klass).get("__annotations__", {})
            if name in ann:
                attrs[name] = str(ann[name])
                break
        else:
            attrs[name] = "property"
    return attrs
