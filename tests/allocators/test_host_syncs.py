"""How many times ``free`` reads ids back to the host, per call, counted without a GPU.

The counter is `tests/allocators/_host_syncs.py` (shared with ``make bench``, which prints the
same counts): ids that are CPU data standing for device data and record every operation that
would force a device -> host read on CUDA. The allocators' device-resident tables (the SWA
table, the HiSparse device table) are seen through the same proxy, so reading them counts too.
The numbers are pinned: a change that adds a sync to ``free`` fails here and has to say why
(docs/pools/hisparse.md, docs/pools/swa.md).
"""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch

from kvcache_core import DoubleFreeError, PagedSlotAllocator
from kvcache_plugins._hisparse_alloc import HiSparseSlotAllocator
from kvcache_plugins._swa_allocator import SWASlotAllocator

from . import _factories as fx
from ._host_syncs import DeviceIds, as_device, count_host_syncs


def _count(call: Callable[[torch.Tensor], None], ids: torch.Tensor) -> list[str]:
    device_ids = as_device(ids.clone())
    return count_host_syncs(lambda: call(device_ids))


def test_the_proxy_counts_what_would_sync():
    ids = torch.tensor([1, 2, 3]).as_subclass(DeviceIds)

    def reads() -> None:
        _ = ids + 1, ids[1:], torch.isin(ids, ids), ids.clone()  # stay on the device
        assert DeviceIds.syncs == []
        bool((ids > 1).any())
        host = ids.to("cpu")
        host.tolist()  # a host tensor now: free
        ids[ids > 1]
        torch.unique(ids)

    assert count_host_syncs(reads) == ["__bool__", "to-host", "bool-mask", "unique"]


@pytest.mark.parametrize("page_size", [1, 4])
def test_the_plain_allocators_free_reads_nothing_back(page_size):
    """The token/paged allocator only queues the ids (checked at the next settle)."""
    alloc = fx.paged(64, page_size)
    slots = alloc.alloc(8)
    assert slots is not None
    assert _count(alloc.free, slots) == []


def _on_device(*sides: PagedSlotAllocator) -> None:
    """Make host allocators behave as on an accelerator, where a settle copies its queued ids
    to the host once (a host allocator reads them in place, which the proxy would count as
    reads of device data)."""
    for side in sides:
        side._on_host = False


def _swa(page_size: int) -> SWASlotAllocator:
    alloc = fx.swa_alloc(64, 64, page_size=page_size)
    alloc.full_to_swa_index_mapping = as_device(alloc.full_to_swa_index_mapping)
    _on_device(alloc.full_attn_allocator, alloc.swa_attn_allocator)
    return alloc


def _hisparse(page_size: int) -> HiSparseSlotAllocator:
    alloc = fx.hisparse_alloc(64, page_size=page_size)
    alloc.logical_to_device = as_device(alloc.logical_to_device)
    _on_device(alloc._logical, alloc._device)
    return alloc


def _requests(
    alloc: SWASlotAllocator | HiSparseSlotAllocator, page_size: int, n: int
) -> list[torch.Tensor]:
    out = [alloc.alloc(4 if page_size == 1 else page_size) for _ in range(n)]
    return [o for o in out if o is not None]


@pytest.mark.parametrize("page_size", [1, 4])
@pytest.mark.parametrize("make", [_swa, _hisparse], ids=["swa", "hisparse"])
def test_composite_free_reads_nothing_back(make, page_size):
    """SWA and HiSparse ``free`` clear their tables with plain tensor ops and leave every check
    to the settle: no host sync per call, with the ids and the table on the device."""
    alloc = make(page_size)
    for slots in _requests(alloc, page_size, 4):
        assert _count(alloc.free, slots) == []
    alloc.check_frees()
    assert alloc.available_size() == 64


@pytest.mark.parametrize("page_size", [1, 4])
@pytest.mark.parametrize("make", [_swa, _hisparse], ids=["swa", "hisparse"])
def test_composite_settle_syncs_per_batch_not_per_call(make, page_size):
    """What ``free`` no longer reads is read at the settle, once for the whole batch: the
    count does not grow with the number of queued calls (at most 2, one more when a call was
    rejected)."""
    counts = []
    for calls in (1, 8):
        alloc = make(page_size)
        for slots in _requests(alloc, page_size, calls):
            alloc.free(as_device(slots.clone()))
        counts.append(len(count_host_syncs(alloc.check_frees)))
        assert alloc.available_size() == 64
    assert counts[0] == counts[1] <= 2, counts
    alloc = make(page_size)
    held = _requests(alloc, page_size, 8)
    for slots in held:
        alloc.free(as_device(slots.clone()))
    alloc.free(as_device(held[0].clone()))  # a double free: rejected at the settle
    DeviceIds.syncs = []
    with pytest.raises(DoubleFreeError):
        alloc.check_frees()
    assert len(DeviceIds.syncs) <= 3, DeviceIds.syncs
    assert alloc.available_size() == 64


def test_hisparse_alloc_reads_nothing_back():
    """``alloc(n)`` takes host page ids from both sides (the slots it returns go to the device
    as a copy, not back): no sync, even with the sides' own slots on the device."""
    alloc = _hisparse(4)
    for side in (alloc._logical, alloc._device):
        side.alloc = lambda n, _alloc=side.alloc: as_device(_alloc(n))  # type: ignore[method-assign]
    assert count_host_syncs(lambda: alloc.alloc(8)) == []
    assert alloc.available_size() == 56
