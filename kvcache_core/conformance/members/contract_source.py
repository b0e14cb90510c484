"""The contract Protocols read from their source files, the way the source level reads a target.

The source level imports nothing it checks; reading the contract from the live Protocol classes
(``introspect``) would import ``kvcache_core.contracts.pool``, hence torch, which a command that
only reads source must not pay for (``kvcache check --level source`` starts like a linter). So
the Protocols' members, signatures, attribute annotations and attribute lines are read here from
``contracts/pool.py`` and ``contracts/allocator.py`` with ``ast``: the same answers as
``introspect`` and ``methods.attribute_location`` give on the live classes, which a test checks
for every Protocol.
"""

from __future__ import annotations

import ast
import os
import re
from functools import cache

from ...contracts.signature import MethodSig
from ..results.model import Location
from .signatures import sig_from_ast
from .sources import ClassSource, SourceIndex

__all__ = [
    "source_attribute_location",
    "source_protocol_attributes",
    "source_protocol_methods",
]

#: The modules defining the contract Protocols (``contracts/__init__.py`` re-exports them).
_FILES = ("pool.py", "allocator.py")


@cache
def _protocols() -> tuple[SourceIndex, dict[str, ClassSource]]:
    core = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    folder = os.path.join(core, "contracts")  # kvcache_core/contracts, read, never imported
    index = SourceIndex()
    classes: dict[str, ClassSource] = {}
    for name in _FILES:
        module = index.load_file(os.path.join(folder, name))
        classes.update({n: c for n, c in module.classes.items() if c.is_protocol})
    return index, classes


def _mro(protocol: str) -> list[ClassSource]:
    """The Protocol classes ``protocol`` is made of, itself first (``typing.Protocol`` aside)."""
    index, classes = _protocols()
    if protocol not in classes:
        raise KeyError(f"unknown protocol {protocol!r}")
    return [k for k in index.mro(classes[protocol]) if isinstance(k, ClassSource) and k.is_protocol]


def _is_property(node: ast.FunctionDef | ast.AsyncFunctionDef) -> bool:
    return any(isinstance(d, ast.Name) and d.id == "property" for d in node.decorator_list)


@cache
def _members(protocol: str) -> dict[str, ast.stmt]:
    """Every member name, sorted, with the statement of the nearest class that defines it."""
    found: dict[str, ast.stmt] = {}
    for klass in _mro(protocol):
        for name, node in [*klass.methods.items(), *klass.class_assignments.items()]:
            found.setdefault(name, node)
    return dict(sorted(found.items()))


@cache
def source_protocol_methods(protocol: str) -> dict[str, MethodSig]:
    """``introspect.protocol_methods`` of the Protocol named ``protocol``, from its source."""
    out: dict[str, MethodSig] = {}
    for name, node in _members(protocol).items():
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and not _is_property(node):
            owner = next(k for k in _mro(protocol) if k.methods.get(name) is node)
            out[name] = sig_from_ast(node, path=owner.path)
    return out


@cache
def source_protocol_attributes(protocol: str) -> dict[str, str]:
    """``introspect.protocol_attributes`` of the Protocol named ``protocol``, from its source."""
    methods = source_protocol_methods(protocol)
    out: dict[str, str] = {}
    for name in _members(protocol):
        if name in methods:
            continue
        out[name] = "property"
        for klass in _mro(protocol):
            node = klass.class_assignments.get(name)
            if isinstance(node, ast.AnnAssign):
                out[name] = ast.unparse(node.annotation)
                break
    return out


@cache
def source_attribute_location(protocol: str, name: str) -> Location | None:
    """``methods.attribute_location`` of the Protocol named ``protocol``, from its source."""
    pattern = re.compile(rf"^\s+{re.escape(name)}\s*:")
    for klass in _mro(protocol):
        if not isinstance(klass.class_assignments.get(name), ast.AnnAssign):
            continue
        node = klass.node
        first = min([node.lineno, *(d.lineno for d in node.decorator_list)])
        lines = klass.module.source.splitlines()[first - 1 : node.end_lineno]
        for offset, text in enumerate(lines):
            if pattern.match(text):
                return Location(klass.path, first + offset)
    return None
