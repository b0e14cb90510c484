"""Whether an implementation's annotation conflicts with the contract's, read from text alone.

The question is mypy's: may the implementation stand in for the contract? A parameter may be
annotated *wider* than the contract's (contravariance: it accepts more), a return *narrower*
(covariance: it promises more); ``Any`` is compatible either way. Only the opposite is a
conflict.

Text cannot always tell. ``layer: MyLayer`` against the contract's ``LayerLike`` (a Protocol)
depends on what ``MyLayer`` is, and no file read here says. So a conflict is only reported when
every name on both sides is one whose relations are known here (builtins, the numeric tower,
torch's ``Tensor``/``dtype``/``device``, kvcache's concrete ``KVSnapshot`` and ``KVWriteLoc``);
anything else is left to the types level, which asks mypy. When in doubt: no finding.
"""

from __future__ import annotations

import ast
from functools import lru_cache

from .signatures import normalize_annotation

__all__ = ["parameter_conflicts", "return_conflicts"]

#: Names whose subtype relations are known from their spelling alone.
_KNOWN = frozenset(
    {
        "None",
        "object",
        "bool",
        "int",
        "float",
        "complex",
        "str",
        "bytes",
        "bytearray",
        "list",
        "dict",
        "tuple",
        "set",
        "frozenset",
        "type",
        "Tensor",
        "dtype",
        "device",
        "Size",
        "KVSnapshot",
        "KVWriteLoc",
    }
)
_TOP = frozenset({"Any", "object"})
#: PEP 484's numeric tower: an ``int`` is accepted where a ``float`` is expected, and so on.
_PROMOTES = frozenset(
    {("bool", "int"), ("bool", "float"), ("bool", "complex"), ("int", "float")}
    | {("int", "complex"), ("float", "complex")}
)


def _members(node: ast.expr) -> list[ast.expr]:
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.BitOr):
        return _members(node.left) + _members(node.right)
    return [node]


def _base(node: ast.expr) -> str:
    if isinstance(node, ast.Subscript):
        return _base(node.value)
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Constant) and node.value is None:
        return "None"
    return ast.unparse(node)


def _known(node: ast.expr) -> bool:
    for sub in ast.walk(node):
        if isinstance(sub, ast.Name) and sub.id not in _KNOWN:
            return False
        if isinstance(sub, ast.Constant) and sub.value not in (None, Ellipsis):
            return False
        if isinstance(sub, ast.Attribute):
            return False
    return True


def _member_within(a: ast.expr, b: ast.expr) -> bool:
    """Whether every value of member ``a`` is a value of member ``b``."""
    base_a, base_b = _base(a), _base(b)
    if base_b in _TOP or base_a == "Any":
        return True
    if ast.unparse(a) == ast.unparse(b) or (base_a, base_b) in _PROMOTES:
        return True
    # `list` and `list[int]`: a bare generic leaves its arguments open (Any).
    return base_a == base_b and not (isinstance(a, ast.Subscript) and isinstance(b, ast.Subscript))


@lru_cache(maxsize=1024)
def _parsed(text: str) -> tuple[ast.expr, ...] | None:
    normal = normalize_annotation(text)
    if not normal:
        return None
    try:
        return tuple(_members(ast.parse(normal, mode="eval").body))
    except SyntaxError:
        return None


def _conflicts(narrow_text: str | None, wide_text: str | None) -> bool:
    """True when ``narrow`` must fit within ``wide`` and, decidably, does not."""
    if narrow_text is None or wide_text is None:
        return False
    narrow, wide = _parsed(narrow_text), _parsed(wide_text)
    if narrow is None or wide is None:
        return False
    if all(any(_member_within(a, b) for b in wide) for a in narrow):
        return False
    return all(_known(m) for m in (*narrow, *wide))


def parameter_conflicts(contract: str | None, impl: str | None) -> bool:
    """The implementation's parameter accepts less than the contract's (decidably)."""
    return _conflicts(contract, impl)


def return_conflicts(contract: str | None, impl: str | None) -> bool:
    """The implementation's return promises less than the contract's (decidably)."""
    return _conflicts(impl, contract)
