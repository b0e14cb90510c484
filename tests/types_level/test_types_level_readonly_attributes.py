"""Contract attributes are read by engines, never assigned: a read-only property satisfies one.

sglang's SWA allocator defines ``size`` as a ``@property``; mypy judged it against a Protocol
whose ``size: int`` is a settable variable, and the types level reported a ``type-error`` on a
correct class. The attribute must still be there, and of the right type.
"""

from __future__ import annotations

import textwrap
from pathlib import Path

from kvcache_core.conformance.results.model import Outcome
from kvcache_core.conformance.targets.target import ClassTarget
from kvcache_core.conformance.types import level as types_level

SOURCE = '''
import torch


class _Base:
    def available_size(self) -> int:
        return 0

    def alloc(self, need_size: int) -> torch.Tensor | None:
        return None

    def free(self, indices: torch.Tensor) -> None:
        return None

    def clear(self) -> None:
        return None


class ReadOnlySize(_Base):
    """``size`` is a property without a setter."""

    @property
    def size(self) -> int:
        return 4


class PlainSize(_Base):
    size: int = 4


class WrongSize(_Base):
    @property
    def size(self) -> str:
        return "4"


class NoSize(_Base):
    pass
'''


def _run(tmp_path: Path, mypy_cache: Path) -> dict[str, tuple[Outcome, list[str]]]:
    path = tmp_path / "slot_allocators.py"
    path.write_text(textwrap.dedent(SOURCE))
    names = ["ReadOnlySize", "PlainSize", "WrongSize", "NoSize"]
    targets = [ClassTarget(n, n, ("MambaSlotAllocator",), path=str(path)) for n in names]
    results = types_level.run(targets, cache_dir=mypy_cache)
    return {
        r.target: (r.outcome, [f"{f.method}: {f.message}" for f in r.findings]) for r in results
    }


def test_a_read_only_property_satisfies_a_contract_attribute(
    tmp_path: Path, mypy_cache: Path
) -> None:
    by_class = _run(tmp_path, mypy_cache)
    assert by_class["ReadOnlySize"] == (Outcome.PASSED, []), by_class["ReadOnlySize"]
    assert by_class["PlainSize"] == (Outcome.PASSED, []), by_class["PlainSize"]
    # still checked: a property of the wrong type, or no attribute at all, is a finding
    for name in ("WrongSize", "NoSize"):
        outcome, findings = by_class[name]
        assert outcome is Outcome.FAILED, (name, findings)
        assert [f for f in findings if f.startswith("size:")], (name, findings)
