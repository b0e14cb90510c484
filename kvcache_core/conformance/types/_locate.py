"""Where in the implementation a types-level finding points: the ``def`` (or the attribute's
assignment) of the class that really defines the member, following base classes across files;
the class statement itself when the member is missing.

mypy says *that* a member conflicts, not where it is written; the fix goes where it is written,
which for an inherited method is a base class, maybe in another module.
"""

from __future__ import annotations

import ast
from pathlib import Path

from ...contracts.signature import MethodSig
from ..members.signatures import sig_from_ast
from ..members.sources import ClassSource, SourceIndex
from ..results.model import Location

__all__ = ["impl_location", "impl_signature"]


def _assignment_line(cls: ClassSource, name: str) -> int | None:
    """Line of ``name = ...``/``name: T`` in the class body, or of ``self.name = ...``."""
    stmt = cls.class_assignments.get(name)
    if stmt is not None:
        return stmt.lineno
    methods = sorted(cls.methods.values(), key=lambda m: m.name != "__init__")
    for method in methods:
        for node in ast.walk(method):
            if not isinstance(node, (ast.Assign, ast.AnnAssign)):
                continue
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            for target in targets:
                if (
                    isinstance(target, ast.Attribute)
                    and target.attr == name
                    and isinstance(target.value, ast.Name)
                    and target.value.id == "self"
                ):
                    return node.lineno
    return None


def impl_location(
    index: SourceIndex, path: Path, class_name: str, member: str | None
) -> Location | None:
    """The best location for ``member`` of ``class_name`` defined in ``path`` (None: unknown)."""
    try:
        module = index.load_file(str(path))
    except (OSError, SyntaxError, UnicodeDecodeError, ValueError):
        return Location(str(path))
    cls = module.classes.get(class_name)
    if cls is None:
        return Location(str(path))
    here = Location(cls.path, cls.line)
    if member is None:
        return here
    found = index.find_method(cls, member)
    if found is not None:
        owner, node = found
        return Location(owner.path, node.lineno)
    for klass in index.mro(cls):
        if isinstance(klass, ClassSource) and member in klass.attributes:
            line = _assignment_line(klass, member)
            return Location(klass.path, line if line is not None else klass.line)
    return here


def impl_signature(
    index: SourceIndex, path: Path, class_name: str, member: str
) -> MethodSig | None:
    """The method ``member`` as the source of the class (or a base) writes it."""
    try:
        module = index.load_file(str(path))
    except (OSError, SyntaxError, UnicodeDecodeError, ValueError):
        return None
    cls = module.classes.get(class_name)
    found = index.find_method(cls, member) if cls is not None else None
    if found is None:
        return None
    owner, node = found
    return sig_from_ast(node, path=owner.path)
