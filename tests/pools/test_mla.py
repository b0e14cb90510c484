"""MLA pool: latent layout, the four write paths, bit-exact offload round trips, rejection of bad
input before any write, and registration through the entry point."""

from __future__ import annotations

import json

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from kvcache_core import (
    InvalidLayerError,
    InvalidSlotError,
    KVSnapshot,
    KVWriteLoc,
    MLAPool,
    OffloadablePool,
    PagedAllocator,
    ShapeMismatchError,
    SnapshotMismatchError,
    UnsupportedDtypeError,
    discover,
)
from kvcache_core.cli import main as cli_main
from kvcache_plugins import mla
from kvcache_plugins.mla import MLATokenToKVPool

from ._helpers_mla import (
    DTYPES,
    WRITE_MODES,
    Layer,
    assert_only_rows_changed,
    config,
    configs,
    layer_ids,
    offload_round_trip,
    same_bytes,
    slot_buffers,
    write_everything,
    write_latent,
)


def filled(dtype: torch.dtype = torch.float32, **overrides: object):
    pool, alloc = mla.create(config("mla", dtype=dtype, **overrides))
    slots = alloc.alloc(8)
    write_everything(pool, slots, torch.Generator().manual_seed(0), list(WRITE_MODES))
    return pool, alloc, slots


# -- registration and layout ------------------------------------------------------------------
def test_discovered_and_built_from_config(capsys):
    pool, alloc = discover().create("mla", config("mla"))
    assert isinstance(pool, MLATokenToKVPool)
    assert isinstance(pool, MLAPool) and isinstance(pool, OffloadablePool)
    assert isinstance(alloc, PagedAllocator) and alloc.get_kvcache() is pool
    assert cli_main(["list", "--format", "json"]) in (0, 1)
    rows = {r["pool"]: r for r in json.loads(capsys.readouterr().out)["plugins"]}
    assert rows["mla"]["status"] == "accepted"
    assert {"mla", "offload", "paged"} <= set(rows["mla"]["capabilities"])


@pytest.mark.parametrize("missing", ["kv_lora_rank", "qk_rope_head_dim"])
def test_config_without_latent_geometry_is_refused(missing):
    with pytest.raises(ValueError, match=missing):
        mla.create(config("mla", **{missing: None}))


def test_latent_layout_and_value_view():
    pool, _ = mla.create(config("mla", size=8, page_size=4, dtype=torch.bfloat16))
    key = pool.get_key_buffer(1)
    assert key.shape == (12, 1, 8) and key.dtype == torch.bfloat16
    value = pool.get_value_buffer(1)
    assert value.shape == (12, 1, 6)
    assert value.data_ptr() == key.data_ptr()  # a view of the nope columns, not a copy
    slots = torch.tensor([5, 9])
    latent = write_latent(pool, 1, slots, "bare", torch.Generator().manual_seed(1))
    assert same_bytes(pool.get_value_buffer(1)[slots], latent[..., :6])
    k2, v2 = pool.get_kv_buffer(1)
    assert k2.data_ptr() == key.data_ptr() and same_bytes(v2, pool.get_value_buffer(1))
    assert pool.get_kv_size_bytes() == 2 * 12 * 8 * 2


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("mode", WRITE_MODES)
def test_every_write_path_reads_back(dtype, mode):
    pool, _ = mla.create(config("mla", dtype=dtype))
    slots = torch.tensor([3, 12, 7])
    latent = write_latent(pool, 2, slots, mode, torch.Generator().manual_seed(2))
    nope, rope = pool.get_mla_kv_buffer(Layer(2), slots)
    assert same_bytes(nope, latent[..., :6]) and same_bytes(rope, latent[..., 6:])
    assert same_bytes(pool.get_key_buffer(2)[slots], latent)
    as_f32 = pool.get_mla_kv_buffer(Layer(2), slots, dst_dtype=torch.float32)
    assert as_f32[0].dtype == torch.float32 and torch.equal(as_f32[0], nope.float())


def test_writeloc_and_bare_tensor_land_identically():
    a, _ = mla.create(config("mla", dtype=torch.bfloat16))
    b, _ = mla.create(config("mla", dtype=torch.bfloat16))
    slots = torch.tensor([4, 0, 9])
    latent = torch.randn(3, 8)
    a.set_kv_buffer(Layer(1), slots, latent, latent)
    b.set_kv_buffer(
        Layer(1), KVWriteLoc(loc=torch.tensor([1, 2, 3]), full_loc=slots), latent, latent
    )
    nope, rope = latent[:, :6], latent[:, 6:]
    a.set_mla_kv_buffer(Layer(2), slots, nope, rope)
    b.set_mla_kv_buffer(Layer(2), KVWriteLoc(loc=slots, swa_loc=slots + 1), nope, rope)
    for name, (_, data) in slot_buffers(a).items():
        assert torch.equal(data, slot_buffers(b)[name][1]), name


def test_scales_and_cache_v_are_ignored():
    a, _ = mla.create(config("mla"))
    b, _ = mla.create(config("mla"))
    slots, latent = torch.tensor([2, 3]), torch.randn(2, 1, 8)
    a.set_kv_buffer(Layer(1), slots, latent, latent)
    b.set_kv_buffer(Layer(1), slots, latent, torch.empty(0), k_scale=4.0, v_scale=0.5)
    assert torch.equal(a.get_key_buffer(1), b.get_key_buffer(1))


def test_fp8_latent_is_stored_as_uint8():
    pool, _ = mla.create(config("mla", dtype=torch.float8_e4m3fn))
    slots, latent = torch.tensor([2, 5]), torch.randn(2, 8)
    pool.set_kv_buffer(Layer(1), slots, latent, latent)
    assert pool.store_dtype == torch.uint8
    assert pool.get_key_buffer(1).dtype == torch.float8_e4m3fn
    nope, rope = pool.get_mla_kv_buffer(Layer(1), slots)
    want = latent.to(torch.float8_e4m3fn).reshape(2, 1, 8)
    assert same_bytes(torch.cat([nope, rope], -1), want)
    snap = pool.get_cpu_copy(slots)
    assert snap.parts["latent"].dtype == torch.uint8 and snap.dtype == torch.float8_e4m3fn


# -- offload round trips ----------------------------------------------------------------------
@settings(max_examples=25, deadline=None)
@given(cfg=configs(), data=st.data(), seed=st.integers(0, 2**16))
def test_offload_round_trip_is_bit_exact(cfg, data, seed):
    pool, alloc = mla.create(cfg)
    offload_round_trip(pool, alloc, data, seed)


def test_empty_offload_round_trips():
    pool, _, _ = filled()
    before = slot_buffers(pool)
    empty = torch.empty(0, dtype=torch.int64)
    snap = pool.get_cpu_copy(empty)
    assert snap.token_count == 0
    pool.load_cpu_copy(snap, empty)
    assert_only_rows_changed(before, pool)


# -- bad input: a specific error, and nothing written ------------------------------------------
BAD_SLOTS = [
    pytest.param(torch.tensor([3, 18]), id="out-of-range"),
    pytest.param(torch.tensor([3, -1]), id="negative"),
    pytest.param(torch.tensor([[3, 4]]), id="2-d"),
    pytest.param(torch.tensor([3.0, 4.0]), id="float"),
]


@pytest.mark.parametrize("slots", BAD_SLOTS)
def test_bad_write_slots_are_refused_before_writing(slots):
    pool, _, _ = filled()
    before = slot_buffers(pool)
    latent = torch.randn(2, 8)
    with pytest.raises(InvalidSlotError):
        pool.set_kv_buffer(Layer(1), slots, latent, latent)
    with pytest.raises(InvalidSlotError):
        pool.set_mla_kv_buffer(Layer(1), KVWriteLoc(loc=slots), latent[:, :6], latent[:, 6:])
    assert_only_rows_changed(before, pool)


@pytest.mark.parametrize(
    ("k", "nope", "rope"),
    [
        pytest.param(torch.randn(2, 7), None, None, id="latent-width"),
        pytest.param(torch.randn(3, 8), None, None, id="latent-rows"),
        pytest.param(torch.ones(2, 8, dtype=torch.int32), None, None, id="latent-int"),
        pytest.param(None, torch.randn(2, 6), torch.randn(2, 3), id="rope-width"),
        pytest.param(None, torch.randn(2, 5), torch.randn(2, 2), id="nope-width"),
        pytest.param(None, torch.randn(2, 6), torch.ones(2, 2, dtype=torch.long), id="rope-int"),
    ],
)
def test_bad_shapes_and_dtypes_are_refused_before_writing(k, nope, rope):
    pool, _, _ = filled()
    before = slot_buffers(pool)
    slots = torch.tensor([3, 4])
    with pytest.raises(ShapeMismatchError):
        if k is not None:
            pool.set_kv_buffer(Layer(1), slots, k, k)
        else:
            pool.set_mla_kv_buffer(Layer(1), slots, nope, rope)
    assert_only_rows_changed(before, pool)


def test_bad_layer_and_dst_dtype():
    pool, _, slots = filled()
    with pytest.raises(InvalidLayerError):
        pool.set_kv_buffer(Layer(0), slots, torch.randn(8, 8), torch.randn(8, 8))
    with pytest.raises(InvalidLayerError):
        pool.get_key_buffer(3)
    with pytest.raises(UnsupportedDtypeError):
        pool.get_mla_kv_buffer(Layer(1), slots, dst_dtype=torch.int32)
    with pytest.raises(TypeError):
        pool.set_kv_buffer(object(), slots, torch.randn(8, 8), torch.randn(8, 8))  # type: ignore[arg-type]


@pytest.mark.parametrize(
    "indices",
    [
        pytest.param(torch.tensor([2, 0]), id="slot-0"),
        pytest.param(torch.tensor([2, -3]), id="negative"),
        pytest.param(torch.tensor([2, 18]), id="out-of-range"),
        pytest.param(torch.tensor([2, 2]), id="duplicate"),
    ],
)
def test_bad_offload_indices_are_refused(indices):
    pool, _, slots = filled()
    snap = pool.get_cpu_copy(slots[:2])
    before = slot_buffers(pool)
    with pytest.raises(InvalidSlotError):
        pool.get_cpu_copy(indices)
    with pytest.raises(InvalidSlotError):
        pool.load_cpu_copy(snap, indices)
    assert_only_rows_changed(before, pool)


@pytest.mark.parametrize(
    "other",
    [
        pytest.param({"kv_lora_rank": 4, "qk_rope_head_dim": 4}, id="same-width-other-rank"),
        pytest.param({"qk_rope_head_dim": 3}, id="wider-latent"),
        pytest.param({"dtype": torch.bfloat16}, id="dtype"),
        pytest.param({"layer_num": 3}, id="layer-count"),
        pytest.param({"start_layer": 0}, id="start-layer"),
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
    pool, _, slots = filled()
    before = slot_buffers(pool)
    snap = pool.get_cpu_copy(slots[:3])
    with pytest.raises(SnapshotMismatchError, match="entries"):
        pool.load_cpu_copy(snap, torch.tensor([10, 11]))
    forged = KVSnapshot("mha", snap.dtype, 3, dict(snap.parts), meta=dict(snap.meta))
    with pytest.raises(SnapshotMismatchError, match="'mha'"):
        pool.load_cpu_copy(forged, torch.tensor([10, 11, 12]))
    with pytest.raises(SnapshotMismatchError):
        pool.load_cpu_copy("not a snapshot", torch.tensor([10, 11, 12]))  # type: ignore[arg-type]
    assert_only_rows_changed(before, pool)


def test_offload_ignores_mamba_indices():
    pool, _, slots = filled()
    plain = pool.get_cpu_copy(slots[:4])
    with_mamba = pool.get_cpu_copy(slots[:4], mamba_indices=torch.tensor([5]))
    assert plain.layout() == with_mamba.layout()
    assert all(torch.equal(plain.parts[n], with_mamba.parts[n]) for n in plain.parts)
    assert list(layer_ids(pool)) == [1, 2]
