"""Multi-head attention pool: per-layer K ``[size + P, H, D]`` and V ``[size + P, H, Dv]``.

The reference pool every other kind is measured against. Offload gathers every layer's rows with
one ``index_select`` per layer into a snapshot allocated once (pinned on CUDA); reload scatters
with ``index_copy_``. Every input is checked before the first byte is written.
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
    PoolConfig,
    PoolSpec,
    check_rows,
    check_slots,
    expect_snapshot,
    hookimpl,
    unwrap_write_loc,
)

from ._layers import check_loc, head_major_option, layer_id_of, local_layer, write_slots

__all__ = ["MHATokenToKVPool", "create", "kvcache_pool_specs"]


class MHATokenToKVPool:
    """Token-to-KV pool for multi-head attention layers."""

    kind = "mha"

    def __init__(
        self,
        size: int,
        page_size: int,
        dtype: torch.dtype,
        head_num: int,
        head_dim: int,
        layer_num: int,
        device: torch.device | str = "cpu",
        *,
        v_head_dim: int | None = None,
        start_layer: int = 0,
        check_write_slots: bool | None = None,
        head_major: bool = False,
    ) -> None:
        if size <= 0 or page_size <= 0 or layer_num <= 0 or head_num <= 0 or head_dim <= 0:
            raise ValueError("size, page_size, layer_num, head_num and head_dim must be positive")
        self.size = size
        self.page_size = page_size
        self.dtype = dtype
        self.device = torch.device(device)
        self.layer_num = layer_num
        self.head_num = head_num
        self.head_dim = head_dim
        self.v_head_dim = v_head_dim if v_head_dim is not None else head_dim
        self.start_layer = start_layer
        self.check_write_slots = (
            self.device.type == "cpu" if check_write_slots is None else check_write_slots
        )
        rows = size + page_size
        self.head_major = head_major
        self._k = LayerRows(
            layer_num,
            rows,
            (head_num, head_dim),
            dtype,
            self.device,
            page_size=page_size,
            head_major=head_major,
        )
        self._v = LayerRows(
            layer_num,
            rows,
            (head_num, self.v_head_dim),
            dtype,
            self.device,
            page_size=page_size,
            head_major=head_major,
        )
        self.store_dtype = self._k.store_dtype

    @property
    def rows(self) -> int:
        """Rows per layer buffer: ``size`` usable slots plus the reserved first page."""
        return self.size + self.page_size

    # -- buffers ---------------------------------------------------------------------------
    def _local(self, layer_id: int) -> int:
        return local_layer(layer_id, self.start_layer, self.layer_num)

    def get_key_buffer(self, layer_id: int) -> torch.Tensor:
        return self._k.layer(self._local(layer_id))

    def get_value_buffer(self, layer_id: int) -> torch.Tensor:
        return self._v.layer(self._local(layer_id))

    def get_kv_buffer(self, layer_id: int) -> tuple[torch.Tensor, torch.Tensor]:
        local = self._local(layer_id)
        return self._k.layer(local), self._v.layer(local)

    def get_kv_size_bytes(self) -> int:
        return self._k.nbytes + self._v.nbytes

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
        k_rows, v_rows = self._k, self._v
        local = getattr(layer, "layer_id", None)
        if type(local) is int:
            local -= self.start_layer
        if (  # the hot path (checked slots, rows as stored): write at once, nothing to convert
            type(local) is int
            and 0 <= local < self.layer_num
            and type(loc) is torch.Tensor
            and not self.check_write_slots
            and loc.dtype == torch.int64
            and loc.dim() == 1
            and loc.device == self.device
            and type(cache_k) is torch.Tensor
            and type(cache_v) is torch.Tensor
            and cache_k.dtype == cache_v.dtype == k_rows.store_dtype == self.dtype
            and cache_k.device == cache_v.device == self.device
            and cache_k.shape[0] == cache_v.shape[0] == loc.shape[0]
            and cache_k.shape[1:] == k_rows.row_shape
            and cache_v.shape[1:] == v_rows.row_shape
        ):
            k_rows.write(local, loc, cache_k)
            v_rows.write(local, loc, cache_v)
            return
        local = self._local(layer_id_of(layer))
        check_loc(loc)
        full, _ = unwrap_write_loc(loc)  # an MHA pool keeps no window: swa_loc is not ours
        slots = write_slots(
            full, limit=self.rows, check_values=self.check_write_slots, device=self.device
        )
        n = slots.numel()
        k = check_rows(cache_k, name="cache_k", rows=n, row_shape=self._k.row_shape)
        v = check_rows(cache_v, name="cache_v", rows=n, row_shape=self._v.row_shape)
        k_store = self._k.to_storage(k, k_scale)
        v_store = self._v.to_storage(v, v_scale)
        self._k.write(local, slots, k_store)
        self._v.write(local, slots, v_store)

    def move_kv_cache(self, tgt_loc: torch.Tensor, src_loc: torch.Tensor) -> None:
        """Copy rows ``src_loc`` to ``tgt_loc`` in every layer (speculative decoding)."""
        src = check_slots(src_loc, limit=self.rows, name="src_loc", device=self.device)
        tgt = check_slots(tgt_loc, limit=self.rows, name="tgt_loc", device=self.device)
        if src.numel() != tgt.numel():
            raise ValueError(f"move_kv_cache: {tgt.numel()} targets for {src.numel()} sources")
        for rows in (self._k, self._v):
            rows.data[:, tgt] = rows.data[:, src]

    # -- offload ---------------------------------------------------------------------------
    def _offload_slots(self, indices: torch.Tensor) -> torch.Tensor:
        return check_slots(indices, limit=self.rows, allow_duplicates=False, device=self.device)

    def _meta(self) -> dict[str, object]:
        return {"layer_num": self.layer_num, "start_layer": self.start_layer}

    def get_cpu_copy(
        self, indices: torch.Tensor, mamba_indices: torch.Tensor | None = None
    ) -> KVSnapshot:
        """Copy slots ``indices`` of every layer to the host.

        ``mamba_indices`` is accepted (it is part of the contract) and ignored: an MHA pool holds
        no per-request recurrent state.
        """
        slots = self._offload_slots(indices)
        return KVSnapshot(
            pool_kind=self.kind,
            dtype=self.dtype,
            token_count=slots.numel(),
            parts={"k": self._k.gather(slots), "v": self._v.gather(slots)},
            meta=self._meta(),
        )

    def check_snapshot(self, snapshot: object, token_count: int) -> KVSnapshot:
        """Check that ``snapshot`` fits this pool for ``token_count`` tokens; write nothing.

        Composite pools (SWA, hybrid Mamba) check every part with this before loading any, so
        a bad second part cannot leave the first one loaded and the second one not.
        """
        n = token_count
        return expect_snapshot(
            snapshot,
            kind=self.kind,
            dtype=self.dtype,
            token_count=n,
            parts={"k": self._k.part_layout(n), "v": self._v.part_layout(n)},
            meta=self._meta(),
        )

    def load_cpu_copy(
        self,
        snapshot: KVSnapshot,
        indices: torch.Tensor,
        mamba_indices: torch.Tensor | None = None,
    ) -> None:
        """Write ``snapshot`` into the newly allocated slots ``indices`` (same count, order)."""
        slots = self._offload_slots(indices)
        self.load_checked(self.check_snapshot(snapshot, slots.numel()), slots)

    def load_checked(self, snapshot: KVSnapshot, slots: torch.Tensor) -> None:
        """Write a snapshot that ``check_snapshot`` returned into ``slots`` (1-D int64 on the
        pool's device, checked, as many as the snapshot's tokens). Nothing is checked again:
        composite pools check every part of a reload once, before the first write, then load
        each part through this."""
        self._k.scatter(slots, snapshot.parts["k"])
        self._v.scatter(slots, snapshot.parts["v"])


def create(config: PoolConfig) -> tuple[MHATokenToKVPool, PagedSlotAllocator]:
    """Build an MHA pool and its allocator (token-granular when ``page_size`` is 1).

    ``config.options["head_major"]`` (a bool, default False) keeps each layer's rows
    head-major in memory (see [`LayerRows`][kvcache_core.LayerRows]): the buffers, writes and
    snapshots are the same, attention that reads runs of slots in place is faster, offloads
    are slower.
    """
    pool = MHATokenToKVPool(
        size=config.size,
        page_size=config.page_size,
        dtype=config.dtype,
        head_num=config.head_num,
        head_dim=config.head_dim,
        layer_num=config.layer_num,
        device=config.device,
        v_head_dim=config.v_head_dim,
        start_layer=config.start_layer,
        check_write_slots=config.checks_write_slots,
        head_major=head_major_option(config),
    )
    return pool, PagedSlotAllocator(config.size, config.page_size, pool)


@hookimpl
def kvcache_pool_specs() -> list[PoolSpec]:
    return [
        PoolSpec(
            name="mha",
            pool_class=MHATokenToKVPool,
            allocator_class=PagedSlotAllocator,
            factory=create,
            capabilities=frozenset({Capability.OFFLOAD, Capability.PAGED}),
            description="multi-head attention: per-layer K and V buffers",
        )
    ]
