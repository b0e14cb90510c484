"""Host memory on CPU (issue 9): the snapshot block cache, huge-page pool buffers, and the
whole-page offload path.

The block cache may only reuse a block once no tensor views it; these tests hold views of
snapshot parts on purpose and check that nothing else is ever written into them.
"""

from __future__ import annotations

import gc
import threading
from collections.abc import Iterator

import pytest
import torch

from kvcache_core import LayerRows, QuantizedLayerRows, hostmem
from kvcache_core import storage as storage_module
from kvcache_core.storage import gather_rows, scatter_rows, whole_pages
from kvcache_plugins.mha import MHATokenToKVPool

MIB = 1 << 20
needs_hugepage_advice = pytest.mark.skipif(
    hostmem._advice() is None, reason="no MADV_HUGEPAGE on this system"
)


@pytest.fixture(autouse=True)
def _fresh_cache() -> Iterator[None]:
    gc.collect()
    hostmem.release_host_cache()
    old = hostmem.set_host_cache_limit(1 << 30)
    yield
    gc.collect()
    hostmem.set_host_cache_limit(old)
    hostmem.release_host_cache()


def _span(t: torch.Tensor) -> tuple[int, int]:
    start = t.untyped_storage().data_ptr()
    return start, start + t.untyped_storage().nbytes()


def _overlaps(a: torch.Tensor, b: torch.Tensor) -> bool:
    (a0, a1), (b0, b1) = _span(a), _span(b)
    return a0 < b1 and b0 < a1


def _pool(page_size: int = 1, size: int = 2048) -> MHATokenToKVPool:
    """An MHA pool whose snapshot parts of 1024 slots are 4 MiB (two blocks of the cache)."""
    pool = MHATokenToKVPool(size, page_size, torch.float32, 4, 64, 2)
    gen = torch.Generator().manual_seed(1)
    for layer in range(2):
        for buf in (pool.get_key_buffer(layer), pool.get_value_buffer(layer)):
            buf.copy_(torch.randn(buf.shape, generator=gen))
    return pool


# ------------------------------------------------------------------------------ block cache


@needs_hugepage_advice
def test_a_dropped_block_is_reused_by_the_next_request_of_its_size() -> None:
    hits = hostmem.host_cache_stats()["hits"]
    a = hostmem.host_empty_cpu((4, MIB), torch.uint8)
    where = a.data_ptr()
    del a
    stats = hostmem.host_cache_stats()
    assert stats["cached_blocks"] == 1 and stats["cached_bytes"] == 4 * MIB
    b = hostmem.host_empty_cpu((MIB,), torch.float32)  # the same 4 MiB
    assert b.data_ptr() == where
    assert hostmem.host_cache_stats()["hits"] == hits + 1


@needs_hugepage_advice
def test_a_live_view_keeps_its_block_out_of_the_cache() -> None:
    a = hostmem.host_empty_cpu((4, MIB), torch.uint8)
    kept = a[0, :3]
    kept.fill_(7)
    del a
    gc.collect()
    assert hostmem.host_cache_stats()["cached_blocks"] == 0
    b = hostmem.host_empty_cpu((4, MIB), torch.uint8)
    assert not _overlaps(b, kept)
    b.fill_(1)
    assert kept.tolist() == [7, 7, 7]
    del kept
    assert hostmem.host_cache_stats()["cached_blocks"] == 1


@needs_hugepage_advice
def test_a_kept_view_of_a_snapshot_part_is_never_overwritten() -> None:
    pool = _pool()
    slots = torch.arange(1, 1025)
    a = pool.get_cpu_copy(slots)
    assert a.parts["k"].nbytes >= 2 * MIB  # the parts come from the block cache
    kept = a.parts["k"][0, :3]
    want = kept.clone()
    del a
    gc.collect()
    b = pool.get_cpu_copy(torch.arange(1025, 2049))
    assert all(not _overlaps(part, kept) for part in b.parts.values())
    assert torch.equal(kept, want)
    for layer in range(2):  # writes into the pool do not reach the kept view either
        pool.get_key_buffer(layer).fill_(-3.0)
    c = pool.get_cpu_copy(slots)
    assert torch.equal(kept, want)
    assert bool((c.parts["k"] == -3.0).all())
    del b, c
    assert torch.equal(kept, want)


@needs_hugepage_advice
def test_snapshots_are_independent_of_the_pool_and_of_each_other() -> None:
    pool = _pool()
    slots = torch.arange(1, 1025)
    first = pool.get_cpu_copy(slots)
    second = pool.get_cpu_copy(slots)
    assert not _overlaps(first.parts["k"], second.parts["k"])
    want = first.parts["k"].clone()
    second.parts["k"].zero_()
    pool.get_key_buffer(0).zero_()
    assert torch.equal(first.parts["k"], want)


@needs_hugepage_advice
def test_the_cache_never_holds_more_than_its_limit() -> None:
    hostmem.set_host_cache_limit(6 * MIB)
    unmaps = hostmem.host_cache_stats()["unmaps"]
    blocks = [hostmem.host_empty_cpu((4 * MIB,), torch.uint8) for _ in range(3)]
    del blocks
    stats = hostmem.host_cache_stats()
    assert stats["cached_bytes"] <= 6 * MIB and stats["cached_blocks"] == 1
    assert stats["unmaps"] == unmaps + 2
    big = hostmem.host_empty_cpu((8 * MIB,), torch.uint8)  # larger than the limit
    del big
    assert hostmem.host_cache_stats()["cached_bytes"] <= 6 * MIB
    assert hostmem.set_host_cache_limit(0) == 6 * MIB  # lowering it unmaps at once
    assert hostmem.host_cache_stats()["cached_bytes"] == 0
    again = hostmem.host_empty_cpu((4 * MIB,), torch.uint8)
    del again
    assert hostmem.host_cache_stats()["cached_blocks"] == 0


def test_the_limit_is_validated_and_read_from_the_environment(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    with pytest.raises(ValueError, match=">= 0"):
        hostmem.set_host_cache_limit(-1)
    monkeypatch.setenv("KVCACHE_HOST_CACHE_BYTES", "12345")
    assert hostmem._limit_from_env() == 12345
    monkeypatch.setenv("KVCACHE_HOST_CACHE_BYTES", "lots")
    assert hostmem._limit_from_env() == hostmem._DEFAULT_LIMIT


@needs_hugepage_advice
def test_blocks_are_not_reused_for_much_smaller_requests() -> None:
    hits = hostmem.host_cache_stats()["hits"]
    a = hostmem.host_empty_cpu((16 * MIB,), torch.uint8)
    del a
    b = hostmem.host_empty_cpu((4 * MIB,), torch.uint8)
    assert hostmem.host_cache_stats()["hits"] == hits  # 4 MiB would waste 12 of a 16 MiB block
    del b


@needs_hugepage_advice
def test_snapshots_taken_and_dropped_in_several_threads_stay_correct() -> None:
    pool = _pool()
    want = {
        start: pool.get_cpu_copy(torch.arange(start, start + 1024)).parts["k"].clone()
        for start in (1, 513, 1025)
    }
    live_before = hostmem.host_cache_stats()["live_blocks"]
    errors: list[str] = []

    def work(start: int) -> None:
        for _ in range(20):
            snap = pool.get_cpu_copy(torch.arange(start, start + 1024))
            if not torch.equal(snap.parts["k"], want[start]):
                errors.append(f"thread at {start} read a wrong snapshot")
            del snap

    threads = [threading.Thread(target=work, args=(s,)) for s in want for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    gc.collect()
    assert errors == []
    assert hostmem.host_cache_stats()["live_blocks"] == live_before


# ------------------------------------------------------------------------- pool buffers


@needs_hugepage_advice
def test_pool_buffers_are_zeroed_mappings_and_sized_as_before() -> None:
    rows = LayerRows(2, 4096, (4, 64), torch.bfloat16, torch.device("cpu"))
    assert rows.nbytes == 2 * 4096 * 4 * 64 * 2
    assert bool((rows.data == 0).all())
    before = hostmem.host_cache_stats()["maps"]
    q = QuantizedLayerRows(
        2, 4096, (4, 64), dtype=torch.bfloat16, device=torch.device("cpu"), page_size=4
    )
    assert bool((q.scales == 1).all()) and bool((q.data == 0).all())
    assert hostmem.host_cache_stats()["maps"] == before  # pool buffers are not cache blocks
    pool = MHATokenToKVPool(4096, 1, torch.bfloat16, 4, 64, 2)
    assert pool.get_kv_size_bytes() == 2 * 2 * 4097 * 4 * 64 * 2


def test_without_hugepage_advice_everything_falls_back_to_torch(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(hostmem, "_advice", lambda: None)
    before = hostmem.host_cache_stats()
    part = hostmem.host_empty_cpu((4 * MIB,), torch.uint8)
    zeros = hostmem.host_zeros_cpu((4 * MIB,), torch.uint8)
    assert bool((zeros == 0).all())
    del part
    assert hostmem.host_cache_stats()["maps"] == before["maps"]
    assert hostmem.host_cache_stats()["cached_blocks"] == 0
    pool = _pool()
    slots = torch.arange(1, 1025)
    snap = pool.get_cpu_copy(slots)
    pool.load_cpu_copy(snap, torch.arange(1025, 2049))
    assert torch.equal(pool.get_key_buffer(1)[1025:2049], snap.parts["k"][1])
    assert hostmem.host_cache_stats()["maps"] == before["maps"]


def test_small_tensors_never_use_a_block() -> None:
    before = hostmem.host_cache_stats()["maps"]
    small = hostmem.host_empty_cpu((1000,), torch.float32)
    tiny = hostmem.host_zeros_cpu((3, 5), torch.bfloat16)
    assert small.shape == (1000,) and bool((tiny == 0).all())
    assert hostmem.host_cache_stats()["maps"] == before


# --------------------------------------------------------------------- whole-page offload


@pytest.mark.parametrize(
    ("slots", "page", "rows", "want"),
    [
        ([4, 5, 6, 7, 12, 13, 14, 15], 4, 32, [1, 3]),
        ([12, 13, 14, 15, 4, 5, 6, 7], 4, 32, [3, 1]),  # pages in any order
        ([4, 5, 6, 7, 4, 5, 6, 7], 4, 32, [1, 1]),  # a page twice is still whole pages
        ([5, 6, 7, 8], 4, 32, None),  # a run of 4 not starting at a page boundary
        ([4, 5, 7, 6], 4, 32, None),  # a whole page, rows out of order
        ([4, 5, 6, 7, 8, 9], 4, 32, None),  # a page and a half
        ([4, 5, 6], 4, 32, None),  # part of a page
        ([4, 5, 6, 7, 9, 10, 11, 12], 4, 32, None),  # a page, then an unaligned run
        ([4, 5, 6, 7, 8, 9, 10, 12], 4, 32, None),  # second page with a hole
        ([0, 1, 2, 3], 4, 30, None),  # buffer rows not a multiple of the page size
        ([4, 5, 6, 7], 1, 32, None),  # page size 1: always the row path
        ([], 4, 32, None),
    ],
)
def test_whole_pages_are_detected_exactly(
    slots: list[int], page: int, rows: int, want: list[int] | None
) -> None:
    for dtype in (torch.int64, torch.int32):
        got = whole_pages(torch.tensor(slots, dtype=dtype), page, rows)
        assert (None if got is None else got.tolist()) == want


def test_two_dimensional_slots_take_the_row_path() -> None:
    assert whole_pages(torch.arange(4, 12).view(2, 4), 4, 32) is None


def _row_path(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(storage_module, "whole_pages", lambda *args: None)


@pytest.mark.parametrize(
    ("row_shape", "dtype", "page"),
    [
        ((4, 64), torch.float32, 64),  # 64 KiB pages, viewed as int64 for the scatter
        ((4, 64), torch.bfloat16, 16),  # 8 KiB pages
        ((3,), torch.uint8, 4),  # 3-byte rows: no wider view
        ((), torch.float32, 8),  # scalar rows (a per-token scale)
    ],
)
def test_page_path_and_row_path_agree_bit_for_bit(
    monkeypatch: pytest.MonkeyPatch, row_shape: tuple[int, ...], dtype: torch.dtype, page: int
) -> None:
    rows = 16 * page
    gen = torch.Generator().manual_seed(3)
    data = torch.randint(0, 255, (3, rows, *row_shape), generator=gen, dtype=torch.uint8)
    if dtype != torch.uint8:
        data = torch.randn((3, rows, *row_shape), generator=gen).to(dtype)
    pages = torch.tensor([5, 2, 3, 9, 10, 11, 1])
    slots = (pages[:, None] * page + torch.arange(page)).reshape(-1)
    assert whole_pages(slots, page, rows) is not None
    by_page = gather_rows(data, slots, page)
    with monkeypatch.context() as m:
        _row_path(m)
        by_row = gather_rows(data, slots, page)
    assert torch.equal(by_page.view(torch.uint8), by_row.view(torch.uint8))
    assert torch.equal(by_row, data[:, slots])
    targets = (torch.tensor([7, 8, 14, 0, 4, 12, 13])[:, None] * page + torch.arange(page)).view(-1)
    paged_into, rowed_into = data.clone(), data.clone()
    scatter_rows(paged_into, targets, by_row, page)  # a row-path snapshot, loaded by pages
    with monkeypatch.context() as m:
        _row_path(m)
        scatter_rows(rowed_into, targets, by_page, page)  # and the other way round
    assert torch.equal(paged_into.view(torch.uint8), rowed_into.view(torch.uint8))
    expected = data.clone()
    expected[:, targets] = by_row
    assert torch.equal(paged_into.view(torch.uint8), expected.view(torch.uint8))


@pytest.mark.parametrize("page", [4, 64])
def test_pool_snapshots_are_interchangeable_between_the_paths(
    monkeypatch: pytest.MonkeyPatch, page: int
) -> None:
    pool = _pool(page_size=page, size=2048)
    pages = torch.tensor([3, 1, 2, 7] if page == 64 else [3, 1, 2, 7, 8, 9, 30])
    slots = (pages[:, None] * page + torch.arange(page)).reshape(-1)
    targets = slots.flip(0).view(-1, page).flip(1).reshape(-1)  # the same pages, reversed
    assert whole_pages(slots, page, pool.rows) is not None
    fast = pool.get_cpu_copy(slots)
    with monkeypatch.context() as m:
        _row_path(m)
        slow = pool.get_cpu_copy(slots)
    assert fast.layout() == slow.layout()
    for name in ("k", "v"):
        assert torch.equal(fast.parts[name], slow.parts[name])
    other = _pool(page_size=page, size=2048)
    other.load_cpu_copy(slow, targets)  # row snapshot, page-aligned targets: page path
    with monkeypatch.context() as m:
        _row_path(m)
        pool.load_cpu_copy(fast, targets)  # page snapshot through the row path
    for layer in range(2):
        assert torch.equal(
            other.get_key_buffer(layer)[targets], pool.get_key_buffer(layer)[targets]
        )
        assert torch.equal(other.get_value_buffer(layer)[targets], fast.parts["v"][layer])


def test_a_partial_page_offload_takes_the_row_path_and_is_right() -> None:
    pool = _pool(page_size=4, size=256)
    slots = torch.tensor([4, 5, 6, 7, 9, 10, 11, 12, 17])
    snap = pool.get_cpu_copy(slots)
    for layer in range(2):
        assert torch.equal(snap.parts["k"][layer], pool.get_key_buffer(layer)[slots])
    targets = torch.tensor([20, 21, 22, 23, 33, 34, 35, 36, 41])
    untouched = pool.get_key_buffer(0).clone()
    pool.load_cpu_copy(snap, targets)
    assert torch.equal(pool.get_key_buffer(0)[targets], snap.parts["k"][0])
    others = torch.ones(untouched.shape[0], dtype=torch.bool)
    others[targets] = False
    assert torch.equal(pool.get_key_buffer(0)[others], untouched[others])


def test_an_unaligned_run_of_page_length_is_offloaded_row_by_row() -> None:
    pool = _pool(page_size=4, size=256)
    slots = torch.arange(5, 13)  # two pages' worth of slots, straddling three pages
    snap = pool.get_cpu_copy(slots)
    for layer in range(2):
        assert torch.equal(snap.parts["k"][layer], pool.get_key_buffer(layer)[slots])
    targets = torch.arange(21, 29)
    pool.load_cpu_copy(snap, targets)
    for layer in range(2):
        assert torch.equal(pool.get_value_buffer(layer)[targets], snap.parts["v"][layer])


@pytest.mark.parametrize("page", [1, 16])
def test_scatters_keep_every_bit_of_random_patterns(page: int) -> None:
    """Rows are scattered as wide elements (16 bytes): NaN payloads, signalling NaNs and
    denormals must arrive unchanged."""
    gen = torch.Generator().manual_seed(7)
    data = torch.zeros((2, 64 * 16, 8), dtype=torch.bfloat16)
    bits = torch.randint(-(2**15), 2**15, (2, 256, 8), generator=gen, dtype=torch.int16)
    bits[:, :8] = torch.tensor([0x7F81, 0xFF81, 0x7FC1, 0x0001, -1, 0x7F80, 0, 0x8000])
    values = bits.view(torch.bfloat16)
    slots = (torch.randperm(64, generator=gen)[:16][:, None] * 16 + torch.arange(16)).view(-1)
    if page == 1:
        slots = torch.randperm(64 * 16, generator=gen)[:256]
    scatter_rows(data, slots, values, page)
    assert torch.equal(data.view(torch.int16)[:, slots], bits)
    assert torch.equal(gather_rows(data, slots, page).view(torch.int16), bits)
