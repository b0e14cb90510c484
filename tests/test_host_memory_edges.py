"""Two edges of host memory the main tests did not pin: the block cache evicts its *oldest*
blocks first (the newest are the likeliest to be asked for again by the next retraction), and
gathers of odd-width rows larger than the 32 KiB gather piece stay exact on every path."""

from __future__ import annotations

import gc
from collections.abc import Iterator

import pytest
import torch

from kvcache_core import hostmem
from kvcache_core.storage import gather_rows, scatter_rows, whole_pages

MIB = 1 << 20
needs_hugepage_advice = pytest.mark.skipif(
    hostmem._advice() is None, reason="no MADV_HUGEPAGE on this system"
)


@pytest.fixture
def fresh_cache() -> Iterator[None]:
    gc.collect()
    hostmem.release_host_cache()
    old = hostmem.set_host_cache_limit(1 << 30)
    yield
    gc.collect()
    hostmem.set_host_cache_limit(old)
    hostmem.release_host_cache()


@needs_hugepage_advice
@pytest.mark.usefixtures("fresh_cache")
def test_a_full_cache_evicts_its_oldest_block_first() -> None:
    hostmem.set_host_cache_limit(5 * MIB)  # two blocks of 2 MiB fit, three do not
    blocks = [hostmem.host_empty_cpu((2 * MIB,), torch.uint8) for _ in range(3)]
    where = [b.data_ptr() for b in blocks]
    for i in range(3):  # dropped oldest first: the third return overflows the limit
        blocks[i] = None  # type: ignore[call-overload]
    assert hostmem.host_cache_stats()["cached_blocks"] == 2
    kept = [hostmem.host_empty_cpu((2 * MIB,), torch.uint8) for _ in range(2)]
    assert sorted(t.data_ptr() for t in kept) == sorted(where[1:])  # the first one was unmapped
    del kept
    hostmem.set_host_cache_limit(2 * MIB)  # lowering the limit: oldest first again
    (survivor,) = [hostmem.host_empty_cpu((2 * MIB,), torch.uint8)]
    assert hostmem.host_cache_stats()["cached_blocks"] == 0
    assert survivor.data_ptr() in where[1:]


#: float32 rows of 8193 values: 32772 bytes, just over the 32 KiB gather piece, and odd
WIDTH = 8193


@pytest.mark.parametrize(
    ("page", "whole"),
    [(1, False), (2, False), (4, False), (2, True), (4, True)],
    ids=["rows-1", "rows-2", "rows-4", "whole-pages-2", "whole-pages-4"],
)
def test_odd_width_rows_over_the_gather_piece_round_trip_exactly(page: int, whole: bool) -> None:
    rows = 8 * page
    gen = torch.Generator().manual_seed(5)
    data = torch.randn((2, rows, WIDTH), generator=gen)
    if whole:
        pages = torch.tensor([3, 1, 6])
        slots = (pages[:, None] * page + torch.arange(page)).reshape(-1)
        assert whole_pages(slots, page, rows) is not None
    else:
        slots = torch.tensor([5, 2, 3 * page + 1, 1])
    got = gather_rows(data, slots, page)
    assert torch.equal(got, data[:, slots])
    target = torch.zeros_like(data)
    scatter_rows(target, slots, got, page)
    assert torch.equal(target[:, slots], data[:, slots])
    untouched = torch.ones(rows, dtype=torch.bool)
    untouched[slots] = False
    assert bool((target[:, untouched] == 0).all())
