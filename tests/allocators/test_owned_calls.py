"""What an allocator keeps of its caller's tensors, and the room a HiSparse extend needs for a
partial page that lost its residency: two weakenings the state machines did not catch."""

from __future__ import annotations

import pytest
import torch

from kvcache_core import DoubleFreeError, InvalidSlotError

from . import _factories as fx

KINDS = {
    "token": lambda: fx.paged(64, 1),  # free's fast path: 1-D int64 on the host
    "paged": lambda: fx.paged(64, 4),
    "swa": lambda: fx.swa_alloc(64, 64, 1),
    "hisparse": lambda: fx.hisparse_alloc(64, 1),
}


@pytest.mark.parametrize("kind", KINDS)
def test_free_keeps_the_ids_it_was_given_when_the_caller_reuses_its_tensor(kind):
    """Engines free a row of their request table and then write the next request into that
    very row. The queued free must keep the ids of the call, not follow the caller's tensor:
    otherwise the settle frees the next request's slots and the first request's stay held."""
    alloc = KINDS[kind]()
    total = alloc.available_size()
    first, second = alloc.alloc(8), alloc.alloc(8)
    row = first.clone()
    alloc.free(row)
    row.copy_(second)  # the caller reuses its row before the free settled
    alloc.check_frees()
    assert alloc.available_size() == total - 8
    assert sorted(alloc.alloc(8).tolist()) == sorted(first.tolist())  # the freed ones
    alloc.free(second)
    alloc.check_frees()  # still held: not a double free
    alloc.free(second.clone())
    with pytest.raises(DoubleFreeError):
        alloc.check_frees()


def test_a_token_free_in_the_steady_state_is_not_handed_back_as_the_callers_tensor():
    """The steady state pops a freed batch whole: if that batch were the caller's tensor, the
    caller's next write into it would change slots the allocator hands out."""
    alloc = fx.paged(64, 1)
    row = alloc.alloc(8).clone()
    alloc.free(row)
    alloc.check_frees()
    again = alloc.alloc(8)
    handed = again.clone()
    row.fill_(3)
    assert torch.equal(again, handed)


def _evicted_partial_page(device_pages_left: int):
    """A HiSparse allocator (page size 4) with one request of 6 tokens (its last page partial)
    whose pages lost their residency, and the device left with ``device_pages_left`` free
    pages, held by filler requests."""
    alloc = fx.hisparse_alloc(32, 4, ratio=4)  # 8 device pages, 32 logical pages
    request = alloc.alloc_extend(
        torch.tensor([0]), torch.tensor([6]), torch.tensor([-1]), extend_num_tokens=6
    )
    assert request is not None
    alloc.free_device(request)
    filler = alloc.alloc(alloc.device_available_size() - 4 * device_pages_left)
    assert filler is not None
    return alloc, request


def _sizes(alloc):
    return alloc.logical_available_size(), alloc.device_available_size()


def test_hisparse_extend_counts_the_evicted_partial_page_in_its_room_check():
    """Extending by 4 tokens continues the partial page (2 tokens) and opens one page (2): two
    device pages, since the partial page is not resident. With one free device page the call
    must return None and change nothing, not take the logical page and then run short."""
    alloc, request = _evicted_partial_page(device_pages_left=1)
    before = _sizes(alloc)
    last = torch.tensor([int(request[-1])])
    got = alloc.alloc_extend(torch.tensor([6]), torch.tensor([10]), last, extend_num_tokens=4)
    assert got is None
    assert _sizes(alloc) == before
    # with the second device page free, the same call succeeds: the continued page and the
    # new one are resident, the request's first page (not continued) stays evicted
    alloc, request = _evicted_partial_page(device_pages_left=2)
    last = torch.tensor([int(request[-1])])
    got = alloc.alloc_extend(torch.tensor([6]), torch.tensor([10]), last, extend_num_tokens=4)
    assert got is not None
    device = alloc.translate_loc_to_device(torch.cat([request, got]))
    assert device[:4].tolist() == [-1] * 4 and bool((device[4:] > 0).all())
    assert alloc.device_available_size() == 0


def test_hisparse_decode_counts_the_evicted_partial_page_in_its_room_check():
    """Decoding the 7th token continues the non-resident partial page: one device page is
    needed although no fresh page is; with none free the call returns None, changing nothing."""
    alloc, request = _evicted_partial_page(device_pages_left=0)
    before = _sizes(alloc)
    last = torch.tensor([int(request[-1])])
    assert alloc.alloc_decode(torch.tensor([7]), last) is None
    assert _sizes(alloc) == before


def _table(alloc):
    if hasattr(alloc, "full_to_swa_index_mapping"):
        return alloc.full_to_swa_index_mapping
    return alloc.logical_to_device


@pytest.mark.parametrize("page_size", [1, 4])
@pytest.mark.parametrize(
    "bad", [0, -3, "wraps onto a held row", "one past the last row", "sentinel row"]
)
@pytest.mark.parametrize("kind", ["swa", "hisparse"])
def test_a_refused_free_leaves_every_table_row_as_it_was(kind, bad, page_size):
    """A free naming a bad id beside a held one is refused at the settle; meanwhile the table
    (window slots, device residency) must not change at any row it does not own: not the
    padding row 0, not the trailing -1, not a row a negative id would wrap around to."""
    alloc = fx.swa_alloc(64, 64, page_size) if kind == "swa" else fx.hisparse_alloc(64, page_size)
    held = alloc.alloc(4 * page_size)
    table = _table(alloc)
    before = table.clone()
    rows = table.numel()
    bad_id = {
        "wraps onto a held row": int(held[1]) - (rows - 1),  # negative: -k is row rows-1-k
        "one past the last row": rows,
        "sentinel row": rows - 1,
    }.get(bad, bad)
    alloc.free(torch.tensor([int(held[0]), bad_id]))
    with pytest.raises((DoubleFreeError, InvalidSlotError)):
        alloc.check_frees()
    assert torch.equal(table, before)
    alloc.free(held)  # the refused call freed nothing: every slot is still held
    alloc.check_frees()
