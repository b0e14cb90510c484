"""A generated source tree the size of an engine package, with known drift findings.

Most files are irrelevant (classes, functions, some mentioning a followed method only in a
comment or calling it without keywords); a few chains of classes run across files, each level
in its own module and reaching its base another way (relative import, ``as`` alias, a
module-qualified base, a package re-export, a star import), so that only the chain's first and
last modules name the followed methods. Some chains' last override drifted; one module calls
``get_cpu_copy`` with ``mamba_indices=`` on an untyped receiver (a related location of each
drifted leaf's finding). ``kvcache drift`` must report exactly ``expected``.

Shared by tests/checker/test_drift_prefilter.py and benchmarks/bench_drift.py.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from pathlib import Path

__all__ = ["Tree", "generate_tree"]

PACKAGE = "enginepkg"


@dataclass(frozen=True)
class Tree:
    root: Path  # the package folder to hand to ``kvcache drift``
    files: int
    #: (rule, target) of every finding expected.
    expected: frozenset[tuple[str, str]]


_BASE = '''"""The chain's root: it defines the offload methods."""


class {name}:
    def get_cpu_copy(self, indices, mamba_indices=None):
        return indices

    def load_cpu_copy(self, snapshot, indices, mamba_indices=None):
        return None
'''

# Middle levels never name a followed method: the prefilter must still read them for the MRO.
_MIDDLE = {
    "relative": "from .{prev} import {base}\n\n\nclass {name}({base}):\n",
    "alias": "from {pkg}.{chain}.{prev} import {base} as Parent\n\n\nclass {name}(Parent):\n",
    "qualified": "from {pkg}.{chain} import {prev} as up\n\n\nclass {name}(up.{base}):\n",
    "reexport": "from {pkg}.{chain} import {base}\n\n\nclass {name}({base}):\n",
    "star": "from .{prev} import *\n\n\nclass {name}({base}):\n",
}
_MIDDLE_BODY = "    size = {level}\n\n    def describe(self):\n        return '{name}'\n"

_LEAF = '''"""The chain's last level overrides offload."""

from .{prev} import {base}


class {name}({base}):
    def get_cpu_copy(self, {params}):
        return super().get_cpu_copy({forward})
'''

_CALLERS = '''"""Call sites: one passes a keyword some implementer lacks."""


def use(pool, indices):
    snapshot = pool.get_cpu_copy(indices, mamba_indices=None)
    pool.load_cpu_copy(snapshot, indices)
    return snapshot
'''


def _filler(rng: random.Random, number: int) -> str:
    """An irrelevant module of a few KB: classes, methods, and the odd mention of a name."""
    lines = [f'"""Filler module {number}."""', "", "import os", ""]
    for c in range(rng.randint(2, 5)):
        base = f"(Filler{number}x{c - 1})" if c and rng.random() < 0.5 else ""
        lines += ["", f"class Filler{number}x{c}{base}:", f'    """Class {c} of {number}."""']
        for m in range(rng.randint(3, 7)):
            lines += [
                "",
                f"    def method_{m}(self, value, *, scale={m}, name=None):",
                f"        total = value * scale + {rng.randint(0, 99)}",
                "        if name is not None:",
                "            total += len(os.path.join(name, str(total)))",
                "        return total",
            ]
    if number % 7 == 0:  # named in a comment only: the pattern check rejects the file
        lines += ["", "# set_kv_buffer is an engine method; this module never calls it"]
    if number % 50 == 0:  # a call with no keyword: parsed, and nothing to report
        lines += ["", "", "def copy(pool, indices):", "    return pool.get_cpu_copy(indices)"]
    if number % 13 == 0:  # an inline suppression mark in an irrelevant module
        lines += ["", "SETTING = 1  # kvcache: maybe later"]
    return "\n".join(lines) + "\n"


def generate_tree(
    where: Path, *, files: int = 5000, chains: int = 12, depth: int = 6, seed: int = 0
) -> Tree:
    """Write the tree under ``where`` and say what drift must find in it."""
    rng = random.Random(seed)
    root = where / PACKAGE
    root.mkdir(parents=True)
    (root / "__init__.py").write_text('"""A generated engine."""\n', encoding="utf-8")
    written = 1
    expected: set[tuple[str, str]] = set()
    styles = list(_MIDDLE)
    for chain_no in range(chains):
        chain = f"chain{chain_no}"
        folder = root / chain
        folder.mkdir()
        names = [f"Chain{chain_no}Level{level}" for level in range(depth)]
        # The package re-exports the root class, without naming a followed method.
        init = f'"""Chain {chain_no}."""\n\nfrom .level0 import {names[0]}\n'
        (folder / "__init__.py").write_text(init, encoding="utf-8")
        (folder / "level0.py").write_text(_BASE.format(name=names[0]), encoding="utf-8")
        written += 2
        for level in range(1, depth - 1):
            style = styles[(chain_no + level) % len(styles)]
            if style == "reexport" and level != 1:
                style = "relative"  # the package re-exports level 0 only
            text = _MIDDLE[style].format(
                pkg=PACKAGE,
                chain=chain,
                prev=f"level{level - 1}",
                base=names[level - 1],
                name=names[level],
            ) + _MIDDLE_BODY.format(level=level, name=names[level])
            (folder / f"level{level}.py").write_text(text, encoding="utf-8")
            written += 1
        drifted = chain_no % 3 == 0
        leaf = names[depth - 1]
        params = "indices" if drifted else "indices, mamba_indices=None"
        forward = "indices" if drifted else "indices, mamba_indices=mamba_indices"
        text = _LEAF.format(
            prev=f"level{depth - 2}",
            base=names[depth - 2],
            name=leaf,
            params=params,
            forward=forward,
        )
        (folder / f"level{depth - 1}.py").write_text(text, encoding="utf-8")
        written += 1
        if drifted:
            expected.add(("missing-parameter", f"{PACKAGE}.{chain}.level{depth - 1}.{leaf}"))
    (root / "callers.py").write_text(_CALLERS, encoding="utf-8")
    written += 1
    # callers.py's untyped `pool` passes mamba_indices=: it is a related location of each
    # drifted leaf's one finding, not a finding of its own
    filler = root / "filler"
    filler.mkdir()
    (filler / "__init__.py").write_text("", encoding="utf-8")
    written += 1
    number = 0
    while written < files:
        folder = filler / f"group{number // 100}"
        if not folder.exists():
            folder.mkdir()
            (folder / "__init__.py").write_text("", encoding="utf-8")
            written += 1
            continue
        (folder / f"module{number}.py").write_text(_filler(rng, number), encoding="utf-8")
        written += 1
        number += 1
    return Tree(root, written, frozenset(expected))
