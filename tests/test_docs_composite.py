"""The composite allocator docs/pool-authors.md shows, run as written: it keeps the token and
scale sides in step through applied and rejected frees, free groups, backups and reuse of the
caller's tensor, using only the public face of ``kvcache_core``."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
import torch

from kvcache_core import DoubleFreeError
from kvcache_plugins.mha import MHATokenToKVPool

GUIDE = Path(__file__).resolve().parent.parent / "docs" / "pool-authors.md"


def _example() -> str:
    text = GUIDE.read_text(encoding="utf-8")
    start = text.index("## A composite allocator of your own")
    section = text[start : text.index("\n## ", start + 1)]
    (code,) = re.findall(r"```python\n(.*?)```", section, re.S)
    return code


def _make(size: int = 16, scale_rows: int = 12) -> Any:
    namespace: dict[str, Any] = {}
    exec(compile(_example(), str(GUIDE), "exec"), namespace)
    pool = MHATokenToKVPool(size, 1, torch.float32, 1, 1, 1)
    return namespace["ScaleSlotAllocator"](size, scale_rows, pool)


def _pairs(alloc: Any) -> dict[int, int]:
    """token slot -> scale row, for every token that has one."""
    table = alloc.scale_of
    return {int(s): int(table[s]) for s in (table > 0).nonzero().reshape(-1)}


def test_the_example_uses_only_the_public_face():
    code = _example()
    assert not re.search(r"\.\s*_[a-z]", code.replace("super().__init__", ""))


def test_alloc_pairs_every_slot_and_a_free_gives_both_back():
    alloc = _make()
    a, b = alloc.alloc(4), alloc.alloc(4)
    assert sorted(_pairs(alloc)) == sorted(a.tolist() + b.tolist())
    assert len(set(_pairs(alloc).values())) == 8  # each token its own scale row
    assert alloc.available_size() == 4  # the scale side (12 rows) is the short one
    assert alloc.alloc(8) is None  # never partial
    alloc.free(a)
    assert sorted(_pairs(alloc)) == sorted(b.tolist())  # out of reach at once
    assert alloc.available_size() == 8
    assert alloc.scales.available_size() == 8


def test_a_double_free_is_rejected_alone_and_changes_nothing():
    alloc = _make()
    a, b = alloc.alloc(4), alloc.alloc(4)
    before = _pairs(alloc)
    alloc.free(a)
    alloc.free(torch.cat([b[:2], a[:1]]))  # a[0] twice in the batch: this call is rejected
    with pytest.raises(DoubleFreeError):
        alloc.check_frees()
    assert _pairs(alloc) == {s: r for s, r in before.items() if s in b.tolist()}
    assert alloc.available_size() == 8  # a's 4 back; b untouched
    alloc.free(b)
    alloc.check_frees()
    assert _pairs(alloc) == {} and alloc.available_size() == 12


def test_backup_restore_and_free_groups():
    alloc = _make()
    a = alloc.alloc(4)
    state = alloc.backup_state()
    alloc.free_group_begin()
    alloc.free(a[:2])
    alloc.free(a[:1])  # bad: a[0] again
    alloc.free(a[2:])
    alloc.free_group_end()  # queued, each call on its own: checked at the next settle
    with pytest.raises(DoubleFreeError):
        alloc.check_frees()
    assert _pairs(alloc) == {} and alloc.available_size() == 12  # the good calls applied
    alloc.restore_state(state)
    assert sorted(_pairs(alloc)) == sorted(a.tolist()) and alloc.available_size() == 8
    with pytest.raises(Exception, match="did not back up"):
        alloc.restore_state(_make().backup_state())


def test_a_caller_reusing_its_tensor_does_not_change_the_queued_free():
    alloc = _make()
    a, b = alloc.alloc(4), alloc.alloc(4)
    row = a.clone()
    alloc.free(row)
    row.copy_(b)
    alloc.check_frees()
    assert sorted(_pairs(alloc)) == sorted(b.tolist())
