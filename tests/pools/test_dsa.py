"""DSA pool: the MLA latent plus page-indexed indexer keys and scales. Offload must carry the
indexer per token for any slot set (not only page-aligned runs), and reject what does not fit."""

from __future__ import annotations

import json

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from kvcache_core import (
    IndexerKeyPool,
    InvalidLayerError,
    InvalidSlotError,
    KVWriteLoc,
    MLAPool,
    OffloadablePool,
    PagedAllocator,
    ShapeMismatchError,
    SnapshotMismatchError,
    discover,
)
from kvcache_core.cli import main as cli_main
from kvcache_plugins import dsa, mla
from kvcache_plugins.dsa import DSATokenToKVPool

from ._helpers_mla import (
    DTYPES,
    FP8,
    WRITE_MODES,
    Layer,
    all_same_bytes,
    assert_only_rows_changed,
    config,
    configs,
    mla_reads,
    offload_round_trip,
    same_bytes,
    slot_buffers,
    write_everything,
    write_index,
)


def filled(page_size: int = 2, **overrides: object):
    pool, alloc = dsa.create(config("dsa", page_size=page_size, **overrides))
    slots = alloc.alloc(8)
    write_everything(pool, slots, torch.Generator().manual_seed(0), list(WRITE_MODES))
    return pool, alloc, slots


# -- registration and layout ------------------------------------------------------------------
def test_discovered_and_built_from_config(capsys):
    pool, alloc = discover().create("dsa", config("dsa"))
    assert isinstance(pool, DSATokenToKVPool)
    assert isinstance(pool, IndexerKeyPool) and isinstance(pool, MLAPool)
    assert isinstance(pool, OffloadablePool) and isinstance(alloc, PagedAllocator)
    assert pool.index_dtype == FP8 and pool.index_head_dim == 4
    assert cli_main(["list", "--format", "json"]) in (0, 1)
    rows = {r["pool"]: r for r in json.loads(capsys.readouterr().out)["plugins"]}
    assert rows["dsa"]["status"] == "accepted"
    assert {"mla", "indexer", "offload", "paged"} <= set(rows["dsa"]["capabilities"])


def test_config_without_index_head_dim_is_refused():
    with pytest.raises(ValueError, match="index_head_dim"):
        dsa.create(config("dsa", index_head_dim=None))
    with pytest.raises(TypeError, match="index_dtype"):
        dsa.create(config("dsa", options={"index_dtype": "fp8"}))


@pytest.mark.parametrize("index_dtype", [FP8, torch.bfloat16])
def test_indexer_is_page_indexed(index_dtype):
    pool, _ = dsa.create(config("dsa", size=8, page_size=4, options={"index_dtype": index_dtype}))
    keys, scales = pool.get_index_k_pages(1)
    assert keys.shape == (3, 4, 4) and keys.dtype == index_dtype
    assert scales.shape == (3, 4) and scales.dtype == torch.float32
    slots = torch.tensor([6, 9])  # page 1 offset 2, page 2 offset 1
    written_k, written_s = write_index(pool, 1, slots, torch.Generator().manual_seed(3))
    keys, scales = pool.get_index_k_pages(1)  # views: they see the write
    assert same_bytes(keys[1, 2], written_k[0]) and same_bytes(keys[2, 1], written_k[1])
    assert scales[1, 2] == written_s[0] and scales[2, 1] == written_s[1]
    got_k, got_s = pool.get_index_k_scale_buffer(1, slots)
    assert same_bytes(got_k, written_k) and same_bytes(got_s, written_s.float())
    per_layer = 12 * 4 * keys.element_size() + 12 * 4 + 12 * 8 * 4  # keys, scales, f32 latent
    assert pool.get_kv_size_bytes() == 2 * per_layer


def test_index_keys_of_fp8_are_stored_as_uint8_and_snapshotted():
    pool, _, slots = filled()
    assert pool.index_store_dtype == torch.uint8
    snap = pool.get_cpu_copy(slots[:3])
    assert set(snap.parts) == {"latent", "index_k", "index_k_scale"}
    assert snap.parts["index_k"].dtype == torch.uint8 and snap.parts["index_k"].shape == (2, 3, 4)
    assert snap.parts["index_k_scale"].shape == (2, 3)


def test_writeloc_and_bare_tensor_land_identically():
    a, _ = dsa.create(config("dsa"))
    b, _ = dsa.create(config("dsa"))
    slots, latent = torch.tensor([4, 0, 9]), torch.randn(3, 8)
    a.set_kv_buffer(Layer(1), slots, latent, latent)
    b.set_kv_buffer(Layer(1), KVWriteLoc(loc=slots, swa_loc=slots), latent, latent)
    a.set_mla_kv_buffer(Layer(2), slots, latent[:, :6], latent[:, 6:])
    b.set_mla_kv_buffer(Layer(2), KVWriteLoc(loc=slots), latent[:, :6], latent[:, 6:])
    for name, (_, data) in slot_buffers(a).items():
        assert torch.equal(data, slot_buffers(b)[name][1]), name


# -- offload ----------------------------------------------------------------------------------
@settings(max_examples=25, deadline=None)
@given(cfg=configs(indexer=True), data=st.data(), seed=st.integers(0, 2**16))
def test_offload_round_trip_is_bit_exact(cfg, data, seed):
    pool, alloc = dsa.create(cfg)
    offload_round_trip(pool, alloc, data, seed)


@pytest.mark.parametrize("dtype", DTYPES)
def test_unaligned_indices_move_only_their_own_indexer_rows(dtype):
    """Slots from the middle of pages, across pages, out of order: a whole-page copy would drag
    the neighbours along (or miss tokens); the per-token copy moves exactly these."""
    pool, alloc = dsa.create(config("dsa", size=32, page_size=4, dtype=dtype))
    old = alloc.alloc(12)  # pages 1..3: slots 4..15
    write_everything(pool, old, torch.Generator().manual_seed(4), ["bare"])
    taken = torch.tensor([13, 6, 7, 9])
    expected = mla_reads(pool, taken)
    snap = pool.get_cpu_copy(taken, mamba_indices=torch.tensor([1]))
    new_pages = alloc.alloc(8)  # slots 16..23
    alloc.free(old)
    new = torch.tensor([23, 17, 18, 21])
    before = slot_buffers(pool)
    pool.load_cpu_copy(snap, new, mamba_indices=None)
    assert all_same_bytes(mla_reads(pool, new), expected)
    assert_only_rows_changed(before, pool, {"logical": new})
    assert new_pages.numel() == 8


# -- bad input --------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("keys", "scales"),
    [
        pytest.param(torch.randn(2, 5), torch.ones(2), id="key-width"),
        pytest.param(torch.randn(3, 4), torch.ones(3), id="key-rows"),
        pytest.param(torch.randn(2, 4), torch.ones(3), id="scale-rows"),
        pytest.param(torch.randn(2, 4), torch.ones(2, 2), id="scale-width"),
        pytest.param(torch.ones(2, 4, dtype=torch.uint8), torch.ones(2), id="key-int"),
        pytest.param(torch.randn(2, 4), torch.ones(2, dtype=torch.int32), id="scale-int"),
    ],
)
def test_bad_indexer_writes_are_refused_before_writing(keys, scales):
    pool, _, _ = filled()
    before = slot_buffers(pool)
    with pytest.raises(ShapeMismatchError):
        pool.set_index_k_scale_buffer(1, torch.tensor([3, 4]), keys, scales)
    assert_only_rows_changed(before, pool)


@pytest.mark.parametrize(
    "slots",
    [torch.tensor([3, 18]), torch.tensor([-2, 3]), torch.tensor([1.0, 2.0])],
    ids=["out-of-range", "negative", "float"],
)
def test_bad_indexer_slots_and_layers(slots):
    pool, _, _ = filled()
    before = slot_buffers(pool)
    with pytest.raises(InvalidSlotError):
        pool.set_index_k_scale_buffer(1, slots, torch.randn(2, 4), torch.ones(2))
    with pytest.raises(InvalidSlotError):
        pool.get_index_k_scale_buffer(1, slots)
    with pytest.raises(InvalidLayerError):
        pool.set_index_k_scale_buffer(7, torch.tensor([3, 4]), torch.randn(2, 4), torch.ones(2))
    assert_only_rows_changed(before, pool)


@pytest.mark.parametrize(
    "other",
    [
        pytest.param({"options": {"index_dtype": torch.float8_e5m2}}, id="other-fp8"),
        pytest.param({"options": {"index_dtype": torch.bfloat16}}, id="bf16-keys"),
        pytest.param({"index_head_dim": 8}, id="index-head-dim"),
        pytest.param({"kv_lora_rank": 5, "qk_rope_head_dim": 3}, id="same-width-other-rank"),
        pytest.param({"layer_num": 1}, id="layer-count"),
    ],
)
def test_snapshot_from_another_config_is_refused(other):
    source, _, slots = filled(**other)
    snap = source.get_cpu_copy(slots[:3])
    pool, _, _ = filled()
    before = slot_buffers(pool)
    with pytest.raises(SnapshotMismatchError):
        pool.load_cpu_copy(snap, torch.tensor([10, 11, 12]))
    assert_only_rows_changed(before, pool)


def test_snapshot_of_another_kind_or_count_is_refused():
    latent_only, alloc = mla.create(config("mla"))
    mla_snap = latent_only.get_cpu_copy(alloc.alloc(4)[:3])
    pool, _, slots = filled()
    before = slot_buffers(pool)
    with pytest.raises(SnapshotMismatchError, match="'mla'"):
        pool.load_cpu_copy(mla_snap, torch.tensor([10, 11, 12]))
    with pytest.raises(SnapshotMismatchError, match="'dsa'"):
        latent_only.load_cpu_copy(pool.get_cpu_copy(slots[:3]), torch.tensor([10, 11, 12]))
    with pytest.raises(SnapshotMismatchError, match="entries"):
        pool.load_cpu_copy(pool.get_cpu_copy(slots[:3]), torch.tensor([10, 11, 12, 13]))
    with pytest.raises(InvalidSlotError):
        pool.load_cpu_copy(pool.get_cpu_copy(slots[:2]), torch.tensor([0, 11]))
    assert_only_rows_changed(before, pool)
