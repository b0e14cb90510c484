"""The behaviour battery's check ids, read from the checks' source without importing them.

Why not ``BATTERY``: registering the battery imports torch, and ``kvcache check --level
source`` must not (it validates ``--select`` and ``[tool.kvcache.expected-failures]`` ids all
the same, so a typo is a usage error at every level). Every check is registered by a
``@behaviour_check("<id>", ...)`` decorator in ``behaviour/checks/``; this reads those literal
ids. A test keeps the two lists equal.
"""

from __future__ import annotations

import ast
import functools
from pathlib import Path

__all__ = ["battery_ids"]

_CHECKS = Path(__file__).resolve().parent.parent / "behaviour" / "checks"


def _decorated_ids(tree: ast.Module) -> list[str]:
    ids: list[str] = []
    for node in ast.walk(tree):
        if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        for decorator in node.decorator_list:
            if (
                isinstance(decorator, ast.Call)
                and isinstance(decorator.func, ast.Name)
                and decorator.func.id == "behaviour_check"
                and decorator.args
                and isinstance(decorator.args[0], ast.Constant)
                and isinstance(decorator.args[0].value, str)
            ):
                ids.append(decorator.args[0].value)
    return ids


@functools.cache
def battery_ids() -> tuple[str, ...]:
    """Every registered check id, in file then source order."""
    ids: list[str] = []
    for path in sorted(_CHECKS.glob("*.py")):
        ids += _decorated_ids(ast.parse(path.read_text(encoding="utf-8"), filename=str(path)))
    return tuple(ids)
