"""Shared helpers for the MLA, DSA and HiSparse pool tests: configs, random writes, byte-exact
buffer captures and the "only these rows changed" assertion."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from hypothesis import strategies as st

from kvcache_core import KVSnapshot, KVWriteLoc, PoolConfig
from kvcache_plugins.dsa import DSATokenToKVPool
from kvcache_plugins.hisparse import HiSparseTokenToKVPool
from kvcache_plugins.mla import MLATokenToKVPool

DTYPES = (torch.float32, torch.bfloat16, torch.float16)
FP8 = torch.float8_e4m3fn
WRITE_MODES = ("bare", "writeloc", "mla", "mla-writeloc")


@dataclass(frozen=True)
class Layer:
    layer_id: int


def raw(t: torch.Tensor) -> torch.Tensor:
    """The bytes of ``t`` (so that comparisons are bit-exact, NaN payloads and -0.0 included)."""
    t = t.contiguous()
    return t.view(torch.uint8) if t.dim() else t.reshape(1).view(torch.uint8)


def same_bytes(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.dtype == b.dtype and a.shape == b.shape and torch.equal(raw(a), raw(b))


def config(kind: str = "dsa", **overrides: object) -> PoolConfig:
    """A small valid config of ``kind``; kind-specific fields are ignored by the others."""
    base: dict[str, object] = dict(
        size=16,
        layer_num=2,
        page_size=2,
        dtype=torch.float32,
        kv_lora_rank=6,
        qk_rope_head_dim=2,
        index_head_dim=4,
        start_layer=1,
    )
    base.update(overrides)
    return PoolConfig(**base)  # type: ignore[arg-type]


@st.composite
def configs(draw: st.DrawFn, *, indexer: bool = False, hisparse: bool = False) -> PoolConfig:
    page_size = draw(st.sampled_from([1, 2, 4]))
    dtype = draw(st.sampled_from(DTYPES))
    options: dict[str, object] = {}
    if indexer:
        options["index_dtype"] = draw(st.sampled_from([FP8, torch.bfloat16, dtype]))
    return PoolConfig(
        size=draw(st.integers(4, 7)) * page_size,
        layer_num=draw(st.integers(1, 3)),
        page_size=page_size,
        dtype=dtype,
        kv_lora_rank=draw(st.integers(1, 9)),
        qk_rope_head_dim=draw(st.integers(1, 5)),
        index_head_dim=draw(st.integers(1, 9)) if indexer else None,
        hisparse_ratio=draw(st.integers(2, 3)) if hisparse else 2,
        start_layer=draw(st.integers(0, 2)),
        options=options,
    )


def layer_ids(pool: MLATokenToKVPool) -> range:
    return range(pool.start_layer, pool.start_layer + pool.layer_num)


def write_latent(
    pool: MLATokenToKVPool, layer_id: int, slots: torch.Tensor, mode: str, gen: torch.Generator
) -> torch.Tensor:
    """Write random latents at ``slots`` through one of the four write paths; return them as
    the pool's dtype (what a read must give back)."""
    n, rank = slots.numel(), pool.kv_lora_rank
    latent = torch.randn(n, 1, pool.latent_dim, generator=gen).to(pool.dtype)
    loc: torch.Tensor | KVWriteLoc = slots
    if mode.endswith("writeloc"):
        # swa_loc is nonsense on purpose: an MLA pool keeps no window and must not look at it.
        loc = KVWriteLoc(loc=slots, swa_loc=torch.full_like(slots, -7))
    if mode.startswith("mla"):
        nope, rope = latent[..., :rank], latent[..., rank:]
        pool.set_mla_kv_buffer(Layer(layer_id), loc, nope, rope.reshape(n, -1))
    else:
        garbage_v = torch.full((n, 3), float("nan"))
        pool.set_kv_buffer(Layer(layer_id), loc, latent.reshape(n, -1), garbage_v)
    return latent


def write_index(
    pool: DSATokenToKVPool, layer_id: int, slots: torch.Tensor, gen: torch.Generator
) -> tuple[torch.Tensor, torch.Tensor]:
    keys = torch.randn(slots.numel(), pool.index_head_dim, generator=gen).to(pool.index_dtype)
    scales = torch.rand(slots.numel(), 1, generator=gen) + 0.5
    pool.set_index_k_scale_buffer(layer_id, slots, keys, scales)
    return keys, scales.reshape(-1)


def write_everything(
    pool: MLATokenToKVPool, slots: torch.Tensor, gen: torch.Generator, modes: list[str]
) -> None:
    """Random latents (and indexer keys) in every layer, one write path per layer."""
    for i, layer_id in enumerate(layer_ids(pool)):
        write_latent(pool, layer_id, slots, modes[i % len(modes)], gen)
        if isinstance(pool, DSATokenToKVPool):
            write_index(pool, layer_id, slots, gen)


def slot_buffers(pool: MLATokenToKVPool) -> dict[str, tuple[str, torch.Tensor]]:
    """Byte copies of every buffer, each ``[layers, rows, bytes]`` with rows indexed by slot.

    The tag says which slot space indexes the rows: ``logical`` (the only one outside
    HiSparse) or ``device``.
    """

    def stack(ts: list[torch.Tensor]) -> torch.Tensor:
        return torch.stack([raw(t).reshape(t.shape[0], -1) for t in ts]).clone()

    ids = layer_ids(pool)
    out: dict[str, tuple[str, torch.Tensor]] = {}
    if isinstance(pool, HiSparseTokenToKVPool):
        out["store"] = ("logical", stack([pool.get_logical_key_buffer(i) for i in ids]))
        out["device"] = ("device", stack([pool.get_key_buffer(i) for i in ids]))
    else:
        out["latent"] = ("logical", stack([pool.get_key_buffer(i) for i in ids]))
    if isinstance(pool, DSATokenToKVPool):
        pages = [pool.get_index_k_pages(i) for i in ids]
        out["index_k"] = ("logical", stack([k.reshape(-1, pool.index_head_dim) for k, _ in pages]))
        out["index_k_scale"] = ("logical", stack([s.reshape(-1, 1) for _, s in pages]))
    return out


def assert_only_rows_changed(
    before: dict[str, tuple[str, torch.Tensor]],
    pool: MLATokenToKVPool,
    changed: dict[str, torch.Tensor] | None = None,
) -> None:
    """Every row not in ``changed[space]`` is byte-identical to ``before``."""
    after = slot_buffers(pool)
    assert after.keys() == before.keys()
    for name, (space, old) in before.items():
        new = after[name][1]
        keep = torch.ones(old.shape[1], dtype=torch.bool)
        if changed and space in changed:
            keep[changed[space]] = False
        assert torch.equal(old[:, keep], new[:, keep]), f"{name}: rows outside the target changed"


def mla_reads(pool: MLATokenToKVPool, slots: torch.Tensor) -> list[torch.Tensor]:
    """Every public per-slot read of ``slots``: latent halves (and indexer keys and scales)."""
    out: list[torch.Tensor] = []
    for layer_id in layer_ids(pool):
        out.extend(pool.get_mla_kv_buffer(Layer(layer_id), slots))
        if isinstance(pool, DSATokenToKVPool):
            out.extend(pool.get_index_k_scale_buffer(layer_id, slots))
    return out


def all_same_bytes(a: list[torch.Tensor], b: list[torch.Tensor]) -> bool:
    return len(a) == len(b) and all(same_bytes(x, y) for x, y in zip(a, b, strict=True))


def offload_round_trip(pool, alloc, data: st.DataObject, seed: int) -> None:
    """Write, offload a random subset, free, reload into different slots: every byte equal at
    the new slots, nothing else touched. Shared by the MLA and DSA suites."""
    gen = torch.Generator().manual_seed(seed)
    P = pool.page_size
    pages = data.draw(st.integers(1, pool.size // P // 2), label="pages")
    old = alloc.alloc(pages * P)
    modes = data.draw(st.lists(st.sampled_from(WRITE_MODES), min_size=1, max_size=3))
    write_everything(pool, old, gen, modes)
    order = data.draw(st.permutations(range(old.numel())), label="order")
    k = data.draw(st.integers(1, old.numel()), label="k")
    taken = old[torch.tensor(order[:k], dtype=torch.int64)]
    mamba = data.draw(st.sampled_from([None, torch.tensor([1, 2])]), label="mamba_indices")
    expected = mla_reads(pool, taken)
    snap = pool.get_cpu_copy(taken, mamba_indices=mamba)
    assert isinstance(snap, KVSnapshot) and snap.pool_kind == pool.kind and snap.token_count == k
    fresh = alloc.alloc(-(-k // P) * P)
    alloc.free(old)
    new_order = data.draw(st.permutations(range(fresh.numel())), label="new_order")
    new = fresh[torch.tensor(new_order[:k], dtype=torch.int64)]
    before = slot_buffers(pool)
    pool.load_cpu_copy(snap, new, mamba_indices=mamba)
    assert all_same_bytes(mla_reads(pool, new), expected)
    assert_only_rows_changed(before, pool, {"logical": new})
