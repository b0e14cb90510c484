"""What a behaviour finding carries besides its message: where to look, and a reproduction
that fails with a message of its own.

Why a location: code scanning (SARIF) rejects results without one, and a GitHub annotation
without a file lands on no line. A behaviour failure is the pool's (or, for allocator checks,
the allocator's), so it points at that class statement.

Why the reproduction must end in an ``assert`` with a message: run on its own, a script that
ends in a bare ``assert torch.equal(a, b)`` says only ``AssertionError``, and one that ends in
a call that raises says nothing about what the checker expected.
"""

from __future__ import annotations

import ast
import functools
import inspect
import textwrap

from ...contracts.spec import PoolSpec
from ..results.model import Location
from ._check import BehaviourCheck

__all__ = ["end_in_assert", "subject_location"]

#: Longest message an added ``assert`` carries (the finding has the whole text).
_MESSAGE_LIMIT = 300


@functools.cache
def _class_location(cls: type) -> Location | None:
    try:
        path = inspect.getsourcefile(cls)
        _, line = inspect.getsourcelines(cls)
    except (OSError, TypeError):  # built at run time, or no source on disk
        return None
    return Location(path, line) if path else None


def subject_location(check: BehaviourCheck, spec: PoolSpec) -> Location | None:
    """The class statement of the pool (the allocator for ``allocator-*`` checks)."""
    cls = spec.allocator_class if check.id.startswith("allocator-") else spec.pool_class
    return _class_location(cls)


def _last(statements: list[ast.stmt]) -> ast.stmt:
    """The statement that runs last in source order, inside loops, ``with`` and ``if``."""
    last = statements[-1]
    if isinstance(last, ast.With) or (
        isinstance(last, (ast.For, ast.While, ast.If)) and not last.orelse
    ):
        return _last(last.body)
    return last


def _message(text: str) -> str:
    one_line = " ".join(text.split())
    if len(one_line) > _MESSAGE_LIMIT:
        one_line = one_line[: _MESSAGE_LIMIT - 3] + "..."
    return repr(one_line)


def end_in_assert(reproduction: str, message: str) -> str:
    """``reproduction`` ending in an ``assert`` that has a message.

    A final ``assert`` without a message gets ``message``; a final statement that is not an
    ``assert`` (a call expected to raise) is wrapped so that what it raises fails an ``assert``
    naming ``message`` and the exception (its traceback is printed first). Anything that does
    not parse is returned as it was.
    """
    if not reproduction.strip():
        return reproduction
    try:
        tree = ast.parse(reproduction)
    except SyntaxError:
        return reproduction
    if not tree.body:
        return reproduction
    lines = reproduction.splitlines()
    last = _last(tree.body)
    if isinstance(last, ast.Assert):
        if last.msg is not None:
            return reproduction
        end_line = last.test.end_lineno or last.test.lineno
        end_col = last.test.end_col_offset
        if end_col is None:
            return reproduction
        row = lines[end_line - 1]
        # columns count UTF-8 bytes; the literal text before the test's end is sliced so
        encoded = row.encode("utf-8")
        head, tail = encoded[:end_col].decode("utf-8"), encoded[end_col:].decode("utf-8")
        lines[end_line - 1] = f"{head}, {_message(message)}{tail}"
        return "\n".join(lines) + "\n"
    top = tree.body[-1]
    first = min([top.lineno, *(d.lineno for d in getattr(top, "decorator_list", []))])
    before = "\n".join(lines[: first - 1])
    body = textwrap.indent("\n".join(lines[first - 1 : top.end_lineno]), "    ")
    after = "\n".join(lines[top.end_lineno or first :])
    wrapped = "\n".join(
        [
            "import traceback",
            "",
            "failure = None",
            "try:",
            body,
            "except Exception as error:  # the pool's own traceback first",
            "    traceback.print_exc()",
            "    failure = error",
            f"assert failure is None, {_message(message)} + f': {{failure!r}}'",
        ]
    )
    return "\n".join(part for part in (before, wrapped, after) if part) + "\n"
