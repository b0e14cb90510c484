"""The batch check at the settle, on the cases the state machines reach only by chance."""

from __future__ import annotations

import pytest
import torch

from kvcache_core import DoubleFreeError, InvalidSlotError
from kvcache_core.allocation import paged

from . import _factories as fx


@pytest.mark.parametrize("bad", [70, -1])
def test_an_id_out_of_range_leaves_the_marks_exact(bad):
    """``index_add_`` is the range check and may apply the ids before the bad one: the marks
    are rebuilt from the free stack, so the held ids of the refused call are still held."""
    alloc = fx.paged(64)
    held = alloc.alloc(8)
    alloc.free(torch.tensor([int(held[0]), int(held[1]), bad]))
    with pytest.raises(InvalidSlotError, match=f"cannot free slot {bad}"):
        alloc.check_frees()
    assert alloc.available_size() == 56
    alloc.free(held[:2])
    alloc.check_frees()  # not a double free: they were still held
    assert alloc.available_size() == 58
    alloc.free(held[:1])
    with pytest.raises(DoubleFreeError, match=f"slot {int(held[0])} is already free"):
        alloc.check_frees()


def test_a_large_queue_settles_by_ids_before_its_call_bound(monkeypatch):
    """Every bulk op of a settle stays below torch's grain size (see ``_MAX_PENDING_IDS``)."""
    monkeypatch.setattr(paged, "_MAX_PENDING_IDS", 32)
    alloc = fx.paged(64)
    calls = [alloc.alloc(8) for _ in range(5)]
    for call in calls[:3]:
        alloc.free(call)
    assert len(alloc._pending) == 3
    alloc.free(calls[3])  # 32 ids queued: settled
    assert alloc._pending == [] and alloc._free.top == 64 - 8
