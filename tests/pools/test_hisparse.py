"""HiSparse pool and allocator: logical slots, page-granular device residency, write-through,
``load_to_device``, and offload that captures every logical slot bit-exactly, resident or not."""

from __future__ import annotations

import json

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from kvcache_core import (
    AllocatorError,
    DoubleFreeError,
    HiSparsePool,
    IndexerKeyPool,
    InvalidSlotError,
    KVWriteLoc,
    MLAPool,
    OffloadablePool,
    PagedAllocator,
    ShapeMismatchError,
    SnapshotMismatchError,
    TokenAllocator,
    discover,
)
from kvcache_core.cli import main as cli_main
from kvcache_plugins import dsa, hisparse
from kvcache_plugins.hisparse import HiSparseSlotAllocator, HiSparseTokenToKVPool

from ._helpers_mla import (
    WRITE_MODES,
    Layer,
    all_same_bytes,
    assert_only_rows_changed,
    config,
    configs,
    layer_ids,
    mla_reads,
    same_bytes,
    slot_buffers,
    write_everything,
    write_latent,
)


def make(**overrides: object) -> tuple[HiSparseTokenToKVPool, HiSparseSlotAllocator]:
    """8 device slots (pages of 2), 16 logical: logical rows 18, device rows 10."""
    defaults: dict[str, object] = {"size": 8, "page_size": 2, "hisparse_ratio": 2}
    return hisparse.create(config("hisparse", **{**defaults, **overrides}))


def table(pool: HiSparseTokenToKVPool) -> torch.Tensor:
    return pool.translate_loc_to_device(torch.arange(pool.rows)).clone()


def store_latents(pool: HiSparseTokenToKVPool, slots: torch.Tensor) -> list[torch.Tensor]:
    return [pool.get_logical_key_buffer(i)[slots] for i in layer_ids(pool)]


def filled():
    """Resident slots 2..5 (two pages) and non-resident slots 6..9, all written."""
    pool, alloc = make()
    resident = alloc.alloc(4)
    cold = alloc.alloc_logical_only(4)
    both = torch.cat([resident, cold])
    write_everything(pool, both, torch.Generator().manual_seed(0), list(WRITE_MODES))
    return pool, alloc, resident, cold


# -- registration and layout ------------------------------------------------------------------
def test_discovered_and_built_from_config(capsys):
    pool, alloc = discover().create("hisparse", config("hisparse", size=8, hisparse_ratio=3))
    assert isinstance(pool, HiSparseTokenToKVPool) and isinstance(pool, HiSparsePool)
    assert isinstance(pool, MLAPool) and isinstance(pool, IndexerKeyPool)
    assert isinstance(pool, OffloadablePool)
    assert isinstance(alloc, TokenAllocator) and isinstance(alloc, PagedAllocator)
    assert (pool.size, pool.device_size, alloc.size, alloc.device_size) == (24, 8, 24, 8)
    assert alloc.get_kvcache() is pool
    assert cli_main(["list", "--format", "json"]) in (0, 1)
    rows = {r["pool"]: r for r in json.loads(capsys.readouterr().out)["plugins"]}
    assert rows["hisparse"]["status"] == "accepted"
    assert {"hisparse", "mla", "indexer", "offload", "paged"} <= set(
        rows["hisparse"]["capabilities"]
    )


def test_layout_device_latent_logical_store_and_indexer():
    pool, _ = make()
    assert pool.get_key_buffer(1).shape == (10, 1, 8)  # device slots
    assert pool.get_value_buffer(1).shape == (10, 1, 6)
    assert pool.get_logical_key_buffer(1).shape == (18, 1, 8)  # logical slots
    assert pool.get_index_k_pages(1)[0].shape == (9, 2, 4)  # the indexer covers logical space
    assert pool.get_kv_size_bytes() == 2 * (18 * 8 * 4 + 18 * 4 + 18 * 4 + 10 * 8 * 4)
    assert table(pool)[0] == 0 and bool((table(pool)[1:] == -1).all())
    assert int(pool.translate_loc_to_device(torch.tensor(-1))) == -1


def test_config_needs_the_indexer_geometry():
    with pytest.raises(ValueError, match="index_head_dim"):
        make(index_head_dim=None)
    with pytest.raises(ValueError, match="ratio"):
        make(hisparse_ratio=0)


# -- allocator --------------------------------------------------------------------------------
def test_alloc_is_resident_by_page_with_offsets_kept():
    pool, alloc = make()
    slots = alloc.alloc(4)
    dev = pool.translate_loc_to_device(slots)
    assert bool((dev > 0).all()) and torch.equal(dev % 2, slots % 2)
    assert alloc.available_size() == 4
    assert (alloc.logical_available_size(), alloc.device_available_size()) == (12, 4)
    assert torch.equal(alloc.translate_loc_to_device(slots), dev)


def test_alloc_needs_both_sides_and_consumes_nothing_otherwise():
    pool, alloc = make()
    assert alloc.alloc(8) is not None
    assert alloc.available_size() == 0 and alloc.logical_available_size() == 8
    before = table(pool)
    assert alloc.alloc(2) is None
    assert alloc.alloc_extend(torch.tensor([0]), torch.tensor([1]), torch.tensor([-1]), 1) is None
    assert alloc.alloc_decode(torch.tensor([1]), torch.tensor([-1])) is None
    assert alloc.logical_available_size() == 8 and torch.equal(table(pool), before)
    cold = alloc.alloc_logical_only(8)
    assert cold is not None and bool((pool.translate_loc_to_device(cold) == -1).all())
    with pytest.raises(AllocatorError):
        alloc.alloc(3)  # not whole pages


def test_device_residency_can_be_dropped_and_granted_again():
    pool, alloc = make()
    cold = alloc.alloc_logical_only(4)
    assert alloc.alloc_device(torch.empty(0, dtype=torch.int64)) is not None
    dev = alloc.alloc_device(cold[[0, 3]])  # two pages -> both whole pages resident
    assert dev is not None and torch.equal(dev, pool.translate_loc_to_device(cold[[0, 3]]))
    assert bool((pool.translate_loc_to_device(cold) >= 0).all())
    assert alloc.device_available_size() == 4
    alloc.free_device(cold[1:2])  # drops the whole first page only
    assert pool.translate_loc_to_device(cold).tolist()[:2] == [-1, -1]
    assert bool((pool.translate_loc_to_device(cold[2:]) >= 0).all())
    assert alloc.device_available_size() == 6
    alloc.free(cold)
    assert (alloc.logical_available_size(), alloc.device_available_size()) == (16, 8)
    assert bool((table(pool)[1:] == -1).all())


def test_device_full_refuses_alloc_device_without_consuming():
    pool, alloc = make()
    alloc.alloc(8)
    cold = alloc.alloc_logical_only(2)
    assert alloc.alloc_device(cold) is None
    assert bool((pool.translate_loc_to_device(cold) == -1).all())


def test_partial_page_of_a_non_resident_request_becomes_resident_again():
    pool, alloc = make(page_size=4, size=8)
    req = alloc.alloc_extend(torch.tensor([0]), torch.tensor([3]), torch.tensor([-1]), 3)
    assert req is not None and req.tolist() == [4, 5, 6]
    alloc.free_device(req)
    assert alloc.device_available_size() == 8
    nxt = alloc.alloc_decode(torch.tensor([4]), req[-1:])
    assert nxt is not None and nxt.tolist() == [7]
    dev = pool.translate_loc_to_device(torch.cat([req, nxt]))
    assert bool((dev > 0).all()) and torch.equal(dev % 4, torch.tensor([0, 1, 2, 3]))
    assert alloc.device_available_size() == 4
    more = alloc.alloc_extend(torch.tensor([4]), torch.tensor([6]), nxt, 2)
    assert more is not None and more.tolist() == [8, 9] and alloc.device_available_size() == 0
    last = alloc.alloc_decode(torch.tensor([7]), more[-1:])  # same resident page: no device
    assert last is not None and int(pool.translate_loc_to_device(last)) % 4 == 2
    assert alloc.alloc_decode(torch.tensor([5]), nxt) is None  # a new page: device is full


@pytest.mark.parametrize("how", ["decode", "extend", "alloc_device"])
def test_a_page_granted_again_serves_what_was_stored_not_a_stale_device_row(how):
    """Issue 7: a page made resident again must never expose a row it did not receive."""
    pool, alloc = make(size=8, page_size=2, layer_num=1, start_layer=0)
    gen = torch.Generator().manual_seed(7)
    req = alloc.alloc_extend(torch.tensor([0]), torch.tensor([3]), torch.tensor([-1]), 3)
    assert req is not None and req.tolist() == [2, 3, 4]
    write_everything(pool, req, gen, ["bare"])  # the device rows now hold these
    alloc.free_device(req)
    write_everything(pool, req, gen, ["mla-writeloc"])  # store only: nothing is resident
    expected = mla_reads(pool, req)
    snapshot_rows = pool.get_cpu_copy(req).parts["latent"].clone()
    if how == "decode":
        assert alloc.alloc_decode(torch.tensor([4]), req[-1:]) is not None
    elif how == "extend":
        assert alloc.alloc_extend(torch.tensor([3]), torch.tensor([5]), req[-1:], 2) is not None
    else:
        assert alloc.alloc_device(req) is not None
    assert int(pool.translate_loc_to_device(req[-1:])) > 0  # token 4's page is resident again
    assert all_same_bytes(mla_reads(pool, req), expected)
    assert same_bytes(pool.get_cpu_copy(req).parts["latent"], snapshot_rows)
    dev = pool.translate_loc_to_device(req)
    resident = dev >= 0
    for i, layer_id in enumerate(layer_ids(pool)):  # what a kernel reads by device slot
        kernel_rows = pool.get_key_buffer(layer_id)[dev[resident]]
        assert same_bytes(kernel_rows, pool.get_logical_key_buffer(layer_id)[req[resident]]), i


def test_backup_restore_clear_and_free_groups():
    pool, alloc = make()
    first = alloc.alloc(2)
    state = alloc.backup_state()
    saved = table(pool)
    extra = alloc.alloc(4)
    alloc.free_device(first)
    alloc.restore_state(state)
    assert torch.equal(table(pool), saved) and alloc.available_size() == 6
    with pytest.raises(AllocatorError):
        alloc.restore_state(("something", "else"))
    alloc.free_group_begin()
    alloc.free(first)
    assert alloc.device_available_size() == 6  # collected, not yet freed
    alloc.free_group_end()
    assert alloc.device_available_size() == 8 and extra is not None
    alloc.alloc(4)
    alloc.clear()
    assert alloc.available_size() == 8 and alloc.logical_available_size() == 16
    assert table(pool)[0] == 0 and bool((table(pool)[1:] == -1).all())


def test_bad_frees_change_nothing():
    """A bad free is refused as a whole and leaves both sides and the table as they were. Not
    a tensor: at the call. Bad values: at the next settle (``free`` reads nothing back), and
    a held slot named in the same call gets its residency back."""
    pool, alloc = make()
    slots = alloc.alloc(4)
    saved = table(pool)
    with pytest.raises(InvalidSlotError):
        alloc.free([2])  # type: ignore[arg-type]
    for bad, error in (
        (torch.tensor([0]), DoubleFreeError),
        (torch.tensor([-1]), InvalidSlotError),
        (torch.tensor([18]), InvalidSlotError),
        (torch.tensor([int(slots[0]), 18]), InvalidSlotError),
        (torch.tensor([int(slots[0]), 1]), DoubleFreeError),  # slot 1 lies in page 0
    ):
        alloc.free(bad)
        assert int(table(pool)[int(slots[0])]) == -1 or bad.numel() == 1  # dropped at once
        with pytest.raises(error):
            alloc.check_frees()
        assert torch.equal(table(pool), saved) and alloc.device_available_size() == 4
    assert slots.numel() == 4


def test_offload_calls_are_forwarded_by_keyword(monkeypatch):
    pool, alloc = make()
    calls: list[tuple[str, tuple[object, ...], dict[str, object]]] = []
    monkeypatch.setattr(pool, "get_cpu_copy", lambda *a, **k: calls.append(("get", a, k)))
    monkeypatch.setattr(pool, "load_cpu_copy", lambda *a, **k: calls.append(("load", a, k)))
    idx, mamba = torch.tensor([2, 3]), torch.tensor([1])
    alloc.get_cpu_copy(idx, mamba_indices=mamba)
    alloc.load_cpu_copy("snap", idx, mamba)  # type: ignore[arg-type]
    assert calls[0][2]["mamba_indices"] is mamba and calls[1][2]["mamba_indices"] is mamba
    assert calls[1][1] == ("snap", idx)


# -- pool: write-through, translation, load_to_device ------------------------------------------
def test_writes_go_through_to_store_and_resident_device_rows_only():
    pool, alloc, resident, cold = filled()
    dev = pool.translate_loc_to_device(resident)
    for i in layer_ids(pool):
        assert same_bytes(pool.get_key_buffer(i)[dev], pool.get_logical_key_buffer(i)[resident])
    before = slot_buffers(pool)
    write_latent(pool, 1, cold, "mla-writeloc", torch.Generator().manual_seed(5))
    # only the store rows of `cold` change; the device buffer is only hit at padding slot 0
    assert_only_rows_changed(before, pool, {"logical": cold, "device": torch.tensor([0])})
    assert alloc.device_available_size() == 4


def test_writeloc_and_bare_tensor_land_identically():
    (a, alloc_a), (b, alloc_b) = make(), make()
    slots = torch.cat([alloc_a.alloc(2), alloc_a.alloc_logical_only(2)])
    assert torch.equal(slots, torch.cat([alloc_b.alloc(2), alloc_b.alloc_logical_only(2)]))
    latent = torch.randn(4, 8)
    a.set_kv_buffer(Layer(1), slots, latent, latent)
    b.set_kv_buffer(Layer(1), KVWriteLoc(loc=slots, swa_loc=slots), latent, latent)
    a.set_mla_kv_buffer(Layer(2), slots, latent[:, :6], latent[:, 6:])
    b.set_mla_kv_buffer(Layer(2), KVWriteLoc(loc=slots), latent[:, :6], latent[:, 6:])
    for name, (_, data) in slot_buffers(a).items():
        assert torch.equal(data, slot_buffers(b)[name][1]), name


def test_load_to_device_copies_and_records():
    pool, alloc, _, cold = filled()
    dev = alloc.alloc_device(cold[:2])
    assert dev is not None
    pool.load_to_device(cold[:2], dev)
    assert torch.equal(pool.translate_loc_to_device(cold[:2]), dev)
    for i in layer_ids(pool):
        assert same_bytes(pool.get_key_buffer(i)[dev], pool.get_logical_key_buffer(i)[cold[:2]])


def test_a_kernel_write_to_the_device_buffer_is_what_reads_and_offload_see():
    pool, _, resident, _ = filled()
    dev = pool.translate_loc_to_device(resident[:1])
    pool.get_key_buffer(2)[dev] = 3.0  # an attention kernel writing the device cache in place
    nope, rope = pool.get_mla_kv_buffer(Layer(2), resident[:1])
    assert bool((nope == 3.0).all()) and bool((rope == 3.0).all())
    assert bool((pool.get_cpu_copy(resident[:1]).parts["latent"][1] == 3.0).all())


@pytest.mark.parametrize(
    ("logical", "device", "error"),
    [
        pytest.param([6, 7], [8], ShapeMismatchError, id="count"),
        pytest.param([6, 7], [8, 10], InvalidSlotError, id="device-out-of-range"),
        pytest.param([6, 7], [8, 8], InvalidSlotError, id="device-duplicate"),
        pytest.param([6, 0], [8, 9], InvalidSlotError, id="logical-slot-0"),
        pytest.param([6, 18], [8, 9], InvalidSlotError, id="logical-out-of-range"),
        pytest.param([6, 7], [1, 9], InvalidSlotError, id="device-page-0"),
        pytest.param([6, 7], [2, 9], InvalidSlotError, id="device-slot-held"),
    ],
)
def test_bad_load_to_device_changes_nothing(logical, device, error):
    pool, _, _, _ = filled()
    before, saved = slot_buffers(pool), table(pool)
    with pytest.raises(error):
        pool.load_to_device(torch.tensor(logical), torch.tensor(device))
    assert_only_rows_changed(before, pool)
    assert torch.equal(table(pool), saved)


def test_register_and_translate_are_checked():
    pool, _ = make()
    with pytest.raises(ShapeMismatchError):
        pool.register_logical_to_device(torch.full((18,), -1, dtype=torch.int64))
    with pytest.raises(ShapeMismatchError):
        pool.register_logical_to_device(torch.full((19,), -1, dtype=torch.int32))
    with pytest.raises(InvalidSlotError):
        pool.register_logical_to_device(torch.full((19,), 10, dtype=torch.int64))
    with pytest.raises(InvalidSlotError, match="end with -1"):
        pool.register_logical_to_device(torch.zeros(19, dtype=torch.int64))
    with pytest.raises(InvalidSlotError):
        pool.translate_loc_to_device(torch.tensor([18]))
    with pytest.raises(InvalidSlotError):
        pool.translate_loc_to_device(torch.tensor([-2]))
    with pytest.raises(InvalidSlotError):
        pool.translate_loc_to_device(torch.tensor([1.0]))


# -- offload ----------------------------------------------------------------------------------
@settings(max_examples=25, deadline=None)
@given(cfg=configs(indexer=True, hisparse=True), data=st.data(), seed=st.integers(0, 2**16))
def test_offload_round_trip_is_bit_exact_resident_or_not(cfg, data, seed):
    pool, alloc = hisparse.create(cfg)
    P, device_pages = pool.page_size, pool.device_size // pool.page_size
    gen = torch.Generator().manual_seed(seed)
    # at most half the logical pages hold data, so that new slots fit while the old are live
    hot_pages = data.draw(st.integers(1, device_pages), label="hot pages")
    cold_pages = data.draw(st.integers(0, pool.size // P // 2 - hot_pages), label="cold pages")
    hot = alloc.alloc(hot_pages * P)
    cold = alloc.alloc_logical_only(cold_pages * P)
    old = torch.cat([hot, cold])
    modes = data.draw(st.lists(st.sampled_from(WRITE_MODES), min_size=1, max_size=3))
    write_everything(pool, old, gen, modes)
    if data.draw(st.booleans(), label="evict some"):
        alloc.free_device(hot[:P])
    order = data.draw(st.permutations(range(old.numel())), label="order")
    taken = old[torch.tensor(order[: data.draw(st.integers(1, old.numel()), label="k")])]
    k = taken.numel()
    expected, expected_store = mla_reads(pool, taken), store_latents(pool, taken)
    mamba = data.draw(st.sampled_from([None, torch.tensor([3])]), label="mamba_indices")
    snap = pool.get_cpu_copy(taken, mamba_indices=mamba)
    assert snap.pool_kind == "hisparse" and snap.token_count == k
    fresh = alloc.alloc_logical_only(-(-k // P) * P)
    alloc.free(old)
    new = fresh[torch.tensor(data.draw(st.permutations(range(fresh.numel())))[:k])]
    warm = data.draw(st.lists(st.sampled_from(new.tolist()), max_size=k), label="warm")
    if warm:  # None (nothing made resident) when the device lacks pages: also a valid case
        alloc.alloc_device(torch.tensor(warm))
    before = slot_buffers(pool)
    pool.load_cpu_copy(snap, new, mamba_indices=mamba)
    assert all_same_bytes(mla_reads(pool, new), expected)
    assert all_same_bytes(store_latents(pool, new), expected_store)
    dev = pool.translate_loc_to_device(new)
    for i, layer_id in enumerate(layer_ids(pool)):
        rows = pool.get_key_buffer(layer_id)[dev[dev >= 0]]
        assert same_bytes(rows, expected_store[i][dev >= 0])
    assert_only_rows_changed(before, pool, {"logical": new, "device": dev[dev >= 0]})
    # the store alone is enough: drop residency, the logical content is unchanged
    alloc.free_device(new)
    assert all_same_bytes(mla_reads(pool, new), expected)


def test_offload_of_cold_and_hot_slots_reloads_into_hot_slots():
    pool, alloc, resident, cold = filled()
    taken = torch.cat([cold[:2], resident[1:3]])
    expected, expected_store = mla_reads(pool, taken), store_latents(pool, taken)
    snap = pool.get_cpu_copy(taken)
    alloc.free(torch.cat([resident, cold]))
    new = alloc.alloc(4)
    pool.load_cpu_copy(snap, new)
    assert all_same_bytes(mla_reads(pool, new), expected)
    assert all_same_bytes(store_latents(pool, new), expected_store)
    dev = pool.translate_loc_to_device(new)
    for i in layer_ids(pool):
        assert same_bytes(pool.get_key_buffer(i)[dev], pool.get_logical_key_buffer(i)[new])


def test_bad_snapshots_and_indices_are_refused():
    pool, _, resident, cold = filled()
    snap = pool.get_cpu_copy(resident[:3])
    other_pool, other_alloc = dsa.create(config("dsa", size=16, page_size=2))
    dsa_snap = other_pool.get_cpu_copy(other_alloc.alloc(4)[:3])
    before, saved = slot_buffers(pool), table(pool)
    targets = cold[:3]
    with pytest.raises(SnapshotMismatchError, match="'dsa'"):
        pool.load_cpu_copy(dsa_snap, targets)
    with pytest.raises(SnapshotMismatchError, match="entries"):
        pool.load_cpu_copy(snap, cold)
    wider, _ = make(qk_rope_head_dim=3)
    wider_alloc_slots = torch.tensor([2, 3, 4])
    with pytest.raises(SnapshotMismatchError):
        pool.load_cpu_copy(wider.get_cpu_copy(wider_alloc_slots), targets)
    for bad in ([0, 6, 7], [6, 6, 7], [6, 7, 18], [-1, 6, 7]):
        with pytest.raises(InvalidSlotError):
            pool.load_cpu_copy(snap, torch.tensor(bad))
        with pytest.raises(InvalidSlotError):
            pool.get_cpu_copy(torch.tensor(bad))
    assert_only_rows_changed(before, pool)
    assert torch.equal(table(pool), saved)


# -- allocator invariants under random operation sequences ---------------------------------------
def check_residency_invariants(pool: HiSparseTokenToKVPool, alloc: HiSparseSlotAllocator) -> None:
    """Whole pages, offsets kept, one owner per device page, and the free count adds up."""
    P = pool.page_size
    full = table(pool)
    assert full[0] == 0 and int(pool.translate_loc_to_device(torch.tensor(-1))) == -1
    pages = full[P:].reshape(-1, P)
    resident = pages[:, 0] >= 0
    assert bool((pages[~resident] == -1).all())
    owned = pages[resident]
    assert torch.equal(owned, owned[:, :1] + torch.arange(P)) and bool((owned[:, 0] % P == 0).all())
    assert owned[:, 0].unique().numel() == owned.shape[0] and bool((owned >= P).all())
    assert alloc.device_available_size() + owned.numel() == pool.device_size


OPS = st.lists(
    st.tuples(st.sampled_from(["alloc", "cold", "device", "evict", "free"]), st.integers(0, 99)),
    max_size=25,
)


@settings(max_examples=60, deadline=None)
@given(page_size=st.sampled_from([1, 2, 4]), ops=OPS)
def test_random_operation_sequences_keep_residency_consistent(page_size, ops):
    pool, alloc = make(page_size=page_size, size=4 * page_size, hisparse_ratio=3)
    live: list[torch.Tensor] = []
    for op, pick in ops:
        if op in ("alloc", "cold"):
            take = alloc.alloc if op == "alloc" else alloc.alloc_logical_only
            got = take(page_size * (1 + pick % 2))
            if got is not None:
                live.append(got)
        elif live:
            chosen = live[pick % len(live)]
            if op == "device":
                alloc.alloc_device(chosen[pick % chosen.numel() :])
            elif op == "evict":
                alloc.free_device(chosen[: 1 + pick % chosen.numel()])
            else:
                alloc.free(live.pop(pick % len(live)))
        check_residency_invariants(pool, alloc)
    held = sum(t.numel() for t in live)
    assert alloc.logical_available_size() + held == pool.size


@pytest.mark.parametrize(
    ("call", "corruption"),
    [
        ("load_cpu_copy", "past the device buffer"),
        ("load_cpu_copy", "twice"),
        ("load_cpu_copy", "page 0"),
        # A write may target padding rows, shared by every non-resident slot: only the range
        # of its device rows can be wrong.
        ("set_kv_buffer", "past the device buffer"),
        ("set_mla_kv_buffer", "past the device buffer"),
    ],
)
def test_store_and_device_are_one_write_checked_before_either(corruption, call):
    """Issue 7: a HiSparse write or reload is one composite write (logical store, indexer,
    device rows); a device target the table cannot honour refuses it before any byte."""
    pool, alloc = make()
    gen = torch.Generator().manual_seed(5)
    req = alloc.alloc(4)
    write_everything(pool, req, gen, ["bare"])
    snap = pool.get_cpu_copy(req)
    new = alloc.alloc(4)
    l2d = alloc.logical_to_device
    if corruption == "past the device buffer":
        l2d[new[1]] = pool.device_rows + 3
    elif corruption == "twice":
        l2d[new[1]] = l2d[new[0]]
    else:
        l2d[new[1]] = 1
    before = slot_buffers(pool)
    latent = torch.randn(4, 1, pool.latent_dim, generator=gen)
    rank = pool.kv_lora_rank
    with pytest.raises(InvalidSlotError):
        if call == "load_cpu_copy":
            pool.load_cpu_copy(snap, new)
        elif call == "set_kv_buffer":
            pool.set_kv_buffer(Layer(1), new, latent, latent)
        else:
            pool.set_mla_kv_buffer(Layer(1), new, latent[..., :rank], latent[..., rank:])
    assert_only_rows_changed(before, pool)


@pytest.mark.parametrize("how", ["free_device", "free"])
def test_restore_never_exposes_a_device_row_reused_since_the_backup(how):
    """A page resident at the backup, made non-resident after it, whose device page another
    request then took and wrote: ``restore_state`` makes it resident again at that device page,
    which must then hold this page's rows again, for reads, offload and kernels alike."""
    pool, alloc = make(size=4, page_size=2, layer_num=1, start_layer=0)
    gen = torch.Generator().manual_seed(11)
    a = alloc.alloc(2)
    assert a is not None
    write_everything(pool, a, gen, ["bare"])
    expected = mla_reads(pool, a)
    state = alloc.backup_state()
    dev_at_backup = pool.translate_loc_to_device(a).clone()
    if how == "free_device":
        alloc.free_device(a)
    else:
        alloc.free(a)
    b = alloc.alloc(4)  # every device page, the one ``a`` had included
    assert b is not None
    write_everything(pool, b, gen, ["bare"])
    alloc.restore_state(state)
    dev = pool.translate_loc_to_device(a)
    assert torch.equal(dev, dev_at_backup)
    for layer_id in layer_ids(pool):  # what a kernel reads by device slot equals the store
        kernel_rows = pool.get_key_buffer(layer_id)[dev]
        assert same_bytes(kernel_rows, pool.get_logical_key_buffer(layer_id)[a])
    if how == "free_device":  # the logical rows were never rewritten: the original content
        assert all_same_bytes(mla_reads(pool, a), expected)
        assert same_bytes(
            pool.get_cpu_copy(a).parts["latent"],
            torch.stack(store_latents(pool, a)),
        )


def test_restore_keeps_device_rows_of_pages_whose_residency_did_not_change():
    """Only pages whose device page changed are refilled: a page resident at the same device
    page before and after the restore keeps its device rows (a kernel's in-place device write
    is not overwritten from the store)."""
    pool, alloc = make(size=4, page_size=2, layer_num=1, start_layer=0)
    gen = torch.Generator().manual_seed(12)
    a = alloc.alloc(2)
    assert a is not None
    write_everything(pool, a, gen, ["bare"])
    state = alloc.backup_state()
    dev = pool.translate_loc_to_device(a)
    kernel_write = torch.full_like(pool.get_key_buffer(0)[dev], 3.0)
    pool.get_key_buffer(0)[dev] = kernel_write
    alloc.restore_state(state)
    assert same_bytes(pool.get_key_buffer(0)[dev], kernel_write)


def _device_full() -> tuple[HiSparseTokenToKVPool, HiSparseSlotAllocator, torch.Tensor]:
    """Every device page taken; logical room left; one request of 3 tokens (slots 2..4 when
    P=2: its last page is partial)."""
    pool, alloc = make()
    req = alloc.alloc_extend(torch.tensor([0]), torch.tensor([3]), torch.tensor([-1]), 3)
    assert req is not None
    assert alloc.alloc(alloc.device_available_size()) is not None
    assert alloc.device_available_size() == 0 and alloc.logical_available_size() > 0
    return pool, alloc, req


BAD_EXTENDS = {
    "count-mismatch": ([0], [4], [-1], 3),
    "lengths-differ": ([0, 0], [2], [-1], 2),
    "seq-shorter-than-prefix": ([4], [2], [7], -2),
    "stale-last-loc": ([3], [5], [13], 2),  # page 6 was never allocated
    "last-loc-at-wrong-offset": ([3], [5], [3], 2),
}


@pytest.mark.parametrize("case", sorted(BAD_EXTENDS))
def test_bad_alloc_extend_raises_even_when_the_device_is_full(case):
    """Bad arguments get their own error first, not a None that reads as "no room"."""
    pool, alloc, _ = _device_full()
    prefix, seq, last, n = BAD_EXTENDS[case]
    saved = (table(pool), alloc.logical_available_size(), alloc.device_available_size())
    with pytest.raises(AllocatorError):
        alloc.alloc_extend(torch.tensor(prefix), torch.tensor(seq), torch.tensor(last), n)
    assert torch.equal(table(pool), saved[0])
    assert (alloc.logical_available_size(), alloc.device_available_size()) == saved[1:]


BAD_DECODES = {
    "lengths-differ": ([3, 2], [4]),
    "seq-zero": ([0], [-1]),
    "stale-last-loc": ([4], [13]),
}


@pytest.mark.parametrize("case", sorted(BAD_DECODES))
def test_bad_alloc_decode_raises_even_when_the_device_is_full(case):
    _pool, alloc, _ = _device_full()
    seq, last = BAD_DECODES[case]
    with pytest.raises(AllocatorError):
        alloc.alloc_decode(torch.tensor(seq), torch.tensor(last))


@pytest.mark.parametrize("need", [3, -2])
def test_bad_alloc_sizes_raise_even_when_the_device_is_full(need):
    _, alloc, _ = _device_full()
    with pytest.raises(AllocatorError):
        alloc.alloc(need)
    with pytest.raises(AllocatorError):
        alloc.alloc_logical_only(need)


@pytest.mark.parametrize("full", [False, True], ids=["room", "device-full"])
@pytest.mark.parametrize("bad", ["free-slots", "page-0", "freed", "out-of-range", "float"], ids=str)
def test_alloc_device_refuses_slots_that_are_not_allocated(full, bad):
    """``alloc_device`` makes *allocated* logical slots resident: slots of a free page (never
    allocated, or freed) or of the padding page are refused with an error, device full or not,
    and nothing changes (a free page marked resident would be handed out later still holding
    a device page)."""
    pool, alloc = make()
    cold = alloc.alloc_logical_only(2)
    gone = alloc.alloc_logical_only(2)
    assert cold is not None and gone is not None
    if full:
        assert alloc.alloc(alloc.device_available_size()) is not None
    alloc.free(gone)  # still queued: alloc_device must settle it to see the page is free
    arg = {
        "free-slots": torch.tensor([14, 15]),
        "page-0": torch.tensor([1]),
        "freed": gone,
        "out-of-range": torch.tensor([18]),
        "float": torch.tensor([2.0]),
    }[bad]
    saved = (table(pool), alloc.logical_available_size(), alloc.device_available_size())
    with pytest.raises((AllocatorError, InvalidSlotError)):
        alloc.alloc_device(arg)
    assert torch.equal(table(pool), saved[0])
    assert (alloc.logical_available_size(), alloc.device_available_size()) == saved[1:]
