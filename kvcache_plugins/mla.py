"""Multi-head latent attention pool: one latent row ``[nope | rope]`` per token and layer.

Per layer the pool keeps ``[size + P, 1, kv_lora_rank + qk_rope_head_dim]``. MLA has no separate
V: the key buffer is the whole latent and the value buffer is a *view* of its first
``kv_lora_rank`` columns, so kernels that read "V" see the same bytes without a copy.

The latent is reached through four small hooks (``_latent_write``, ``_latent_read``,
``_offload_parts``/``_load_parts``) so that DSA (latent + indexer keys) and HiSparse (latent store
+ device-resident subset) reuse every check and the offload path instead of re-implementing them.
"""

from __future__ import annotations

import torch

from kvcache_core import (
    Capability,
    KVSnapshot,
    KVWriteLoc,
    LayerLike,
    LayerRows,
    PagedSlotAllocator,
    PartLayout,
    PoolConfig,
    PoolSpec,
    UnsupportedDtypeError,
    check_rows,
    check_slots,
    expect_snapshot,
    hookimpl,
    storage_dtype,
    unwrap_write_loc,
)

from ._layers import check_loc, layer_id_of, local_layer, write_slots

__all__ = ["MLATokenToKVPool", "create", "kvcache_pool_specs", "require"]


def require(value: int | None, name: str, kind: str) -> int:
    """A kind-specific ``PoolConfig`` field that must be set: a clear error beats a guessed
    geometry that only fails (or silently mis-reads) at the first kernel call."""
    if value is None or isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise ValueError(
            f"a {kind!r} pool needs PoolConfig.{name} as a positive int, got {value!r}"
        )
    return value


class MLATokenToKVPool:
    """Token-to-KV pool for MLA layers (one latent buffer per layer)."""

    kind = "mla"

    def __init__(
        self,
        size: int,
        page_size: int,
        dtype: torch.dtype,
        kv_lora_rank: int,
        qk_rope_head_dim: int,
        layer_num: int,
        device: torch.device | str = "cpu",
        *,
        start_layer: int = 0,
        check_write_slots: bool | None = None,
    ) -> None:
        dims = (size, page_size, layer_num, kv_lora_rank, qk_rope_head_dim)
        if any(d <= 0 for d in dims):
            raise ValueError(
                "size, page_size, layer_num, kv_lora_rank and qk_rope_head_dim must be positive"
            )
        self.size = size
        self.page_size = page_size
        self.dtype = dtype
        self.device = torch.device(device)
        self.layer_num = layer_num
        self.kv_lora_rank = kv_lora_rank
        self.qk_rope_head_dim = qk_rope_head_dim
        self.start_layer = start_layer
        self.check_write_slots = (
            self.device.type == "cpu" if check_write_slots is None else check_write_slots
        )
        self.store_dtype = storage_dtype(dtype)
        self._latent = LayerRows(
            layer_num,
            self.rows,
            (1, self.latent_dim),
            dtype,
            self._latent_device(),
            page_size=page_size,
        )

    @property
    def rows(self) -> int:
        """Rows per layer buffer: ``size`` usable slots plus the reserved first page."""
        return self.size + self.page_size

    @property
    def latent_dim(self) -> int:
        return self.kv_lora_rank + self.qk_rope_head_dim

    def _latent_device(self) -> torch.device:
        """Where the latent rows live (HiSparse keeps its logical store elsewhere)."""
        return self.device

    def _local(self, layer_id: int) -> int:
        return local_layer(layer_id, self.start_layer, self.layer_num)

    def _slots(self, loc: torch.Tensor, name: str = "loc") -> torch.Tensor:
        """Slots a write (or a read) addresses: padding slot 0 allowed, range checked on CPU."""
        return write_slots(
            loc, limit=self.rows, check_values=self.check_write_slots, device=self.device, name=name
        )

    # -- buffers ---------------------------------------------------------------------------
    def get_key_buffer(self, layer_id: int) -> torch.Tensor:
        """The whole latent of a layer, ``[rows, 1, kv_lora_rank + qk_rope_head_dim]``."""
        return self._latent.layer(self._local(layer_id))

    def get_value_buffer(self, layer_id: int) -> torch.Tensor:
        """The nope part of the latent, as a view (writes through it reach the latent)."""
        return self.get_key_buffer(layer_id)[..., : self.kv_lora_rank]

    def get_kv_buffer(self, layer_id: int) -> tuple[torch.Tensor, torch.Tensor]:
        key = self.get_key_buffer(layer_id)
        return key, key[..., : self.kv_lora_rank]

    def get_kv_size_bytes(self) -> int:
        return self._latent.nbytes

    # -- latent hooks (overridden by HiSparse) ----------------------------------------------
    def _latent_write(self, local: int, slots: torch.Tensor, rows: torch.Tensor) -> None:
        """Scatter stored-representation latent ``rows`` (``[n, 1, dim]``) at ``slots``."""
        self._latent.write(local, slots, rows)

    def _latent_read(self, local: int, slots: torch.Tensor) -> torch.Tensor:
        """Latent rows at ``slots`` in the storage dtype, on ``self.device`` (a copy)."""
        return self._latent.data[local].index_select(0, slots)

    # -- writes ----------------------------------------------------------------------------
    def set_kv_buffer(
        self,
        layer: LayerLike,
        loc: KVWriteLoc | torch.Tensor,
        cache_k: torch.Tensor,
        cache_v: torch.Tensor,
        k_scale: float | None = None,
        v_scale: float | None = None,
    ) -> None:
        """Store the latent ``cache_k`` (``[n, 1, dim]`` or ``[n, dim]``) at ``loc``.

        ``cache_v`` is ignored and not validated: in MLA the value is part of the latent, and
        engines pass whatever they have at hand there. ``k_scale``/``v_scale`` are ignored too,
        as in the engines this pool mirrors: MLA kernels apply the layer's scale when they read,
        so dividing here would apply it twice. A ``KVWriteLoc`` is unwrapped to its full slots
        (an MLA pool keeps no window).
        """
        local = self._local(layer_id_of(layer))
        check_loc(loc)
        full, _ = unwrap_write_loc(loc)
        slots = self._slots(full)
        k = check_rows(cache_k, name="cache_k", rows=slots.numel(), row_shape=(1, self.latent_dim))
        self._latent_write(local, slots, self._latent.to_storage(k))

    def set_mla_kv_buffer(
        self,
        layer: LayerLike,
        loc: KVWriteLoc | torch.Tensor,
        cache_k_nope: torch.Tensor,
        cache_k_rope: torch.Tensor,
    ) -> None:
        """Store ``[nope | rope]`` at ``loc``; both halves are checked before anything is written.

        A ``KVWriteLoc`` is unwrapped to its full slots.
        """
        local = self._local(layer_id_of(layer))
        check_loc(loc)
        full, _ = unwrap_write_loc(loc)
        slots = self._slots(full)
        n = slots.numel()
        nope = check_rows(
            cache_k_nope, name="cache_k_nope", rows=n, row_shape=(1, self.kv_lora_rank)
        )
        rope = check_rows(
            cache_k_rope, name="cache_k_rope", rows=n, row_shape=(1, self.qk_rope_head_dim)
        )
        latent = torch.cat([nope.to(self.device, self.dtype), rope.to(self.device, self.dtype)], -1)
        self._latent_write(local, slots, self._latent.to_storage(latent))

    def get_mla_kv_buffer(
        self,
        layer: LayerLike,
        loc: torch.Tensor,
        dst_dtype: torch.dtype | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """``(nope [n, 1, kv_lora_rank], rope [n, 1, qk_rope_head_dim])`` at ``loc``, copied."""
        local = self._local(layer_id_of(layer))
        dst = self.dtype if dst_dtype is None else dst_dtype
        if not isinstance(dst, torch.dtype) or not dst.is_floating_point:
            raise UnsupportedDtypeError(f"dst_dtype must be a floating torch.dtype, got {dst!r}")
        rows = self._latent_read(local, self._slots(loc))
        if self.store_dtype != self.dtype:
            rows = rows.view(self.dtype)
        rows = rows.to(dst)
        nope = rows[..., : self.kv_lora_rank].contiguous()
        rope = rows[..., self.kv_lora_rank :].contiguous()
        return nope, rope

    # -- offload ---------------------------------------------------------------------------
    def _meta(self) -> dict[str, object]:
        # The rank is meta, not shape: latents split 6+2 and 4+4 have the same row width.
        return {
            "layer_num": self.layer_num,
            "start_layer": self.start_layer,
            "kv_lora_rank": self.kv_lora_rank,
        }

    def _offload_parts(self, slots: torch.Tensor) -> dict[str, torch.Tensor]:
        """Host copies of every per-slot buffer at ``slots`` (token rows, all layers)."""
        return {"latent": self._latent.gather(slots.to(self._latent.device))}

    def _offload_layout(self, count: int) -> dict[str, PartLayout]:
        return {"latent": self._latent.part_layout(count)}

    def _load_parts(self, slots: torch.Tensor, parts: dict[str, torch.Tensor]) -> None:
        self._latent.scatter(slots.to(self._latent.device), parts["latent"])

    def _offload_slots(self, indices: torch.Tensor) -> torch.Tensor:
        return check_slots(indices, limit=self.rows, allow_duplicates=False, device=self.device)

    def get_cpu_copy(
        self, indices: torch.Tensor, mamba_indices: torch.Tensor | None = None
    ) -> KVSnapshot:
        """Copy the latent rows at ``indices`` of every layer to the host.

        ``mamba_indices`` is accepted (it is part of the contract) and ignored: this pool holds
        no per-request recurrent state.
        """
        slots = self._offload_slots(indices)
        return KVSnapshot(
            pool_kind=self.kind,
            dtype=self.dtype,
            token_count=slots.numel(),
            parts=self._offload_parts(slots),
            meta=self._meta(),
        )

    def load_cpu_copy(
        self,
        snapshot: KVSnapshot,
        indices: torch.Tensor,
        mamba_indices: torch.Tensor | None = None,
    ) -> None:
        """Write ``snapshot`` at the newly allocated ``indices`` (same count and order).

        Everything is checked before the first byte is written. ``mamba_indices`` is ignored.
        """
        slots = self._offload_slots(indices)
        n = slots.numel()
        expect_snapshot(
            snapshot,
            kind=self.kind,
            dtype=self.dtype,
            token_count=n,
            parts=self._offload_layout(n),
            meta=self._meta(),
        )
        self._load_parts(slots, dict(snapshot.parts))


def create(config: PoolConfig) -> tuple[MLATokenToKVPool, PagedSlotAllocator]:
    """Build an MLA pool and its allocator (token-granular when ``page_size`` is 1)."""
    pool = MLATokenToKVPool(
        size=config.size,
        page_size=config.page_size,
        dtype=config.dtype,
        kv_lora_rank=require(config.kv_lora_rank, "kv_lora_rank", "mla"),
        qk_rope_head_dim=require(config.qk_rope_head_dim, "qk_rope_head_dim", "mla"),
        layer_num=config.layer_num,
        device=config.device,
        start_layer=config.start_layer,
        check_write_slots=config.checks_write_slots,
    )
    return pool, PagedSlotAllocator(config.size, config.page_size, pool)


@hookimpl
def kvcache_pool_specs() -> list[PoolSpec]:
    return [
        PoolSpec(
            name="mla",
            pool_class=MLATokenToKVPool,
            allocator_class=PagedSlotAllocator,
            factory=create,
            capabilities=frozenset({Capability.OFFLOAD, Capability.MLA, Capability.PAGED}),
            description="multi-head latent attention: one [nope | rope] latent buffer per layer",
        )
    ]
