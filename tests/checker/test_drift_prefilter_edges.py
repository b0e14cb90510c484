"""Edges of the drift prefilter where a weaker filter would silently skip a file the full read
parses: each is compared with the full read and held to the finding it must produce.

Why each: ``def \\`` continues a line before the method name (the pattern must see through
it); a ``--root`` class whose file names no followed method (only its name gets it read); a
``super().m(kw=)`` call in a class that does not override ``m`` (checked against the one
ancestor it reaches, so its classes must be kept); an absolute import whose suffix matches two
given files (a tie resolves nothing, both ways).
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from kvcache_core.conformance.source.drift import analyze

# A working base (not a stub): a rename against it is a finding even when no call shows it.
BASE = (
    "class Base:\n"
    "    def get_cpu_copy(self, indices, mamba_indices=None):\n"
    "        return indices\n"
)


def _write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")


def _both(paths: list[str], **kwargs: object):
    fast = [replace(r, duration_s=0.0) for r in analyze(paths, prefilter=True, **kwargs)]
    full = [replace(r, duration_s=0.0) for r in analyze(paths, prefilter=False, **kwargs)]
    return fast, full


def _findings(results) -> list[tuple[str, str, str | None]]:
    return sorted(
        (r.target.rsplit(".", 1)[-1], f.rule, f.parameter) for r in results for f in r.findings
    )


def test_a_def_continued_before_the_method_name_is_read(tmp_path: Path) -> None:
    pkg = tmp_path / "pkg"
    _write(pkg / "__init__.py", "")
    _write(pkg / "base.py", BASE)
    _write(
        pkg / "child.py",
        "from .base import Base\n\n\nclass Child(Base):\n"
        "    def \\\n        get_cpu_copy(self, idx, mamba_indices=None): ...\n",
    )
    fast, full = _both([str(pkg)])
    assert fast == full
    assert ("Child", "renamed-parameter", "indices") in _findings(fast)


def test_a_root_class_whose_file_names_no_method_is_read(tmp_path: Path) -> None:
    pkg = tmp_path / "pkg"
    _write(pkg / "__init__.py", "")
    _write(pkg / "base.py", BASE)
    _write(pkg / "middle.py", "from .base import Base\n\n\nclass Root(Base):\n    pass\n")
    _write(
        pkg / "leaf.py",
        "from .middle import Root\n\n\nclass Leaf(Root):\n"
        "    def get_cpu_copy(self, idx, mamba_indices=None): ...\n",
    )
    _write(  # outside the root's hierarchy: out of scope with --root
        pkg / "other.py",
        "from .base import Base\n\n\nclass Other(Base):\n    def get_cpu_copy(self, i): ...\n",
    )
    fast, full = _both([str(pkg)], root="Root")
    assert fast == full
    assert _findings(fast) == [("Leaf", "renamed-parameter", "indices")]


def test_a_super_call_from_a_class_that_does_not_override_reaches_its_ancestor(
    tmp_path: Path,
) -> None:
    pkg = tmp_path / "pkg"
    _write(pkg / "__init__.py", "")
    _write(pkg / "base.py", BASE)
    # another implementer that lacks the keyword: a plain call is checked against it too
    _write(
        pkg / "narrow.py", "class Narrow:\n    def get_cpu_copy(self, indices):\n        return 1\n"
    )
    offload = (
        "    def offload(self, slots):\n"
        "        return super().get_cpu_copy(slots, mamba_indices=None)\n"
    )
    # neither class overrides get_cpu_copy: each super() call reaches its own ancestor only
    _write(pkg / "child.py", "from .base import Base\n\n\nclass Child(Base):\n" + offload)
    _write(
        pkg / "narrow_child.py",
        "from .narrow import Narrow\n\n\nclass NarrowChild(Narrow):\n" + offload,
    )
    _write(pkg / "caller.py", "def f(pool):\n    return pool.get_cpu_copy(1, mamba_indices=2)\n")
    fast, full = _both([str(pkg)])
    assert fast == full
    # NarrowChild's super() call reaches Narrow only, which refuses the keyword: the call is
    # wrong whatever arrives. Child's reaches Base, which takes it. The untyped `pool` in
    # caller.py is matched only against families declaring the keyword (Base's): no finding.
    found = [f for f in _findings(fast) if f[1] == "unaccepted-keyword"]
    assert found == [("narrow_child", "unaccepted-keyword", "mamba_indices")], _findings(fast)
    (finding,) = [f for r in fast for f in r.findings if f.rule == "unaccepted-keyword"]
    assert finding.target.endswith("narrow_child.NarrowChild.offload")


def test_an_import_suffix_matching_two_given_files_resolves_nothing(tmp_path: Path) -> None:
    for side, extra in (("one", ""), ("two", ", extra=None")):
        _write(
            tmp_path / side / "mem_cache" / "memory_pool.py",
            f"class Base:\n    def get_cpu_copy(self, indices{extra}): ...\n",
        )
    _write(
        tmp_path / "user" / "pools.py",
        "from engine.srt.mem_cache.memory_pool import Base\n\n\n"
        "class Leaf(Base):\n    def get_cpu_copy(self, idx): ...\n",
    )
    paths = [str(tmp_path / "one"), str(tmp_path / "two"), str(tmp_path / "user")]
    fast, full = _both(paths)
    assert fast == full
    assert _findings(fast) == [("Leaf", "unresolved-base", None)]
