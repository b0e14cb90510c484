"""Contract members as the types level hands them to mypy: each one's own source text.

Why the text and not a re-rendering: mypy must judge a class against exactly what the contract
says (decorators, ``Optional`` spellings, defaults), so every one-member Protocol the types level
generates is the contract's own lines. An older contract version is the one exception: it only
exists as data in ``history``, so its methods are rendered from there.
"""

from __future__ import annotations

import ast
import builtins
import inspect
import re
import sys
import textwrap
from dataclasses import dataclass
from functools import cache
from types import ModuleType

from ...contracts.history import CONTRACT_VERSION, VERSIONS
from ...contracts.signature import MethodSig
from ..members.signatures import sig_from_ast

__all__ = ["ContractMember", "contract_member"]

_Member = ast.FunctionDef | ast.AsyncFunctionDef | ast.AnnAssign


@dataclass(frozen=True)
class ContractMember:
    """One Protocol member: where the contract defines it and the text mypy gets.

    ``call_text`` is the same method as a ``__call__`` (for plain methods only): mypy ignores
    positional parameter names when it matches a class against a Protocol, but not when it
    matches a bound method against a callable Protocol, and a renamed parameter breaks every
    caller that passes it by keyword.

    ``imports`` maps every name the text uses to the object it denotes in the contract module,
    as ``(bound name, import statement, object id)``; the id lets two contract modules that
    import the same class share one import.
    """

    owner: str
    name: str
    is_method: bool
    text: str
    path: str
    line: int
    imports: tuple[tuple[str, str, int], ...]
    sig: MethodSig | None = None
    call_text: str | None = None
    #: The text of the one-member Protocol, when it is not ``text``: an attribute becomes a
    #: read-only property, because engines only read contract attributes, and a Protocol's
    #: plain ``size: int`` would make mypy demand a *settable* one (a read-only ``size``
    #: property is a correct pool).
    protocol_text: str | None = None

    @property
    def checked_text(self) -> str:
        """What the generated Protocol declares for this member."""
        return self.protocol_text if self.protocol_text is not None else self.text

    @property
    def display(self) -> str:
        """One line of contract text for messages and hints."""
        if self.sig is not None:
            return f"def {self.sig.render()}"
        return " ".join(self.text.split())


@cache
def _parsed(path: str) -> tuple[list[str], ast.Module]:
    with open(path, encoding="utf-8") as fh:
        source = fh.read()
    return source.splitlines(), ast.parse(source, filename=path)


def _class_node(tree: ast.Module, name: str) -> ast.ClassDef:
    for node in tree.body:
        if isinstance(node, ast.ClassDef) and node.name == name:
            return node
    raise LookupError(f"class {name} not found at the top level of its module")


def _defining_class(proto: type, name: str) -> type:
    for klass in proto.__mro__:
        if name in vars(klass) or name in inspect.get_annotations(klass):
            return klass
    raise LookupError(f"{proto.__name__}.{name} is not defined by any class of its MRO")


def _nodes(cls_node: ast.ClassDef, name: str) -> list[_Member]:
    """Every statement of the class body that defines ``name`` (a property and its setter)."""
    found: list[_Member] = []
    for stmt in cls_node.body:
        if isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef)):
            defined = stmt.name
        elif isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name):
            defined = stmt.target.id
        else:
            continue
        if defined == name:
            found.append(stmt)
    return found


def _annotation_names(node: ast.AST) -> set[str]:
    """Names an annotation (or default) refers to, looking inside string forward references."""
    names: set[str] = set()
    for sub in ast.walk(node):
        if isinstance(sub, ast.Name):
            names.add(sub.id)
        elif isinstance(sub, ast.Constant) and isinstance(sub.value, str):
            try:
                names |= _annotation_names(ast.parse(sub.value, mode="eval"))
            except SyntaxError:
                continue
    return names


def _referenced(nodes: list[_Member]) -> set[str]:
    names: set[str] = set()
    for node in nodes:
        if isinstance(node, ast.AnnAssign):
            names |= _annotation_names(node.annotation)
            continue
        parts: list[ast.AST] = [*node.decorator_list, *node.args.defaults]
        parts += [d for d in node.args.kw_defaults if d is not None]
        args = node.args
        for arg in [*args.posonlyargs, *args.args, *args.kwonlyargs, args.vararg, args.kwarg]:
            if arg is not None and arg.annotation is not None:
                parts.append(arg.annotation)
        if node.returns is not None:
            parts.append(node.returns)
        for part in parts:
            names |= _annotation_names(part)
    return names


def _import_for(bound: str, module: ModuleType) -> tuple[str, str, int] | None:
    """How the generated module binds ``bound`` to what it denotes in ``module``."""
    namespace = vars(module)
    if bound not in namespace:
        if hasattr(builtins, bound):
            return None
        raise LookupError(f"{module.__name__} does not define {bound!r}")
    obj = namespace[bound]
    if isinstance(obj, ModuleType):
        return bound, f"import {obj.__name__} as {bound}", id(obj)
    home = getattr(obj, "__module__", None)
    qualname = getattr(obj, "__qualname__", None)
    if (
        isinstance(home, str)
        and isinstance(qualname, str)
        and "." not in qualname
        and getattr(sys.modules.get(home), qualname, None) is obj
    ):
        return bound, f"from {home} import {qualname} as {bound}", id(obj)
    return bound, f"from {module.__name__} import {bound} as {bound}", id(obj)


def _text(lines: list[str], nodes: list[_Member]) -> str:
    chunks = []
    for node in nodes:
        first = min([node.lineno, *(d.lineno for d in getattr(node, "decorator_list", []))])
        end = node.end_lineno or node.lineno
        chunks.append(textwrap.dedent("\n".join(lines[first - 1 : end])))
    return "\n".join(chunks)


@cache
def contract_member(proto: type, name: str, version: int = CONTRACT_VERSION) -> ContractMember:
    """The member ``name`` of Protocol ``proto`` under contract ``version``."""
    owner = _defining_class(proto, name)
    path = inspect.getsourcefile(owner)
    if path is None:
        raise LookupError(f"no source file for {owner.__qualname__}")
    lines, tree = _parsed(path)
    nodes = _nodes(_class_node(tree, owner.__name__), name)
    if not nodes:
        raise LookupError(f"{owner.__name__}.{name} not found in {path}")
    module = sys.modules[owner.__module__]
    first = nodes[0]
    is_method = not isinstance(first, ast.AnnAssign)
    sig = sig_from_ast(first, path=path) if not isinstance(first, ast.AnnAssign) else None
    text = _text(lines, nodes)
    old = VERSIONS[version].methods.get(name) if version != CONTRACT_VERSION else None
    if old is not None and sig is not None:
        sig = MethodSig(old.name, old.params, old.returns, sig.path, sig.line)
        text = f"def {sig.render()}: ..."
        names = _annotation_names(ast.parse(text))
    else:
        names = _referenced(nodes)
    call_text = None
    plain = isinstance(first, (ast.FunctionDef, ast.AsyncFunctionDef)) and not first.decorator_list
    if plain and len(nodes) == 1:
        call_text, count = re.subn(
            rf"\bdef\s+{re.escape(name)}\s*\(", "def __call__(", text, count=1
        )
        call_text = call_text if count else None
    imports = tuple(
        found for found in (_import_for(n, module) for n in sorted(names)) if found is not None
    )
    protocol_text = None
    if isinstance(first, ast.AnnAssign):
        annotation = ast.get_source_segment("\n".join(lines), first.annotation)
        protocol_text = f"@property\ndef {name}(self) -> {annotation}: ..."
    return ContractMember(
        owner=owner.__name__,
        name=name,
        is_method=is_method,
        text=text,
        path=path,
        line=first.lineno,
        imports=imports,
        sig=sig,
        call_text=call_text,
        protocol_text=protocol_text,
    )
