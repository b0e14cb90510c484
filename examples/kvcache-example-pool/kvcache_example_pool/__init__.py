"""``fused-mha``: an MHA pool keeping K and V of a layer in one ``[rows, 2, H, D]`` buffer.

Why this layout exists in the wild: one buffer per layer halves the number of gathers on
offload and lets a kernel read a token's K and V with one load. It is here as the smallest
complete example of a third-party pool: the contract, input checks before any write, a
self-describing snapshot, and the plugin hook.
"""

from __future__ import annotations

import torch

from kvcache_core import (
    Capability,
    InvalidLayerError,
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

__all__ = ["FusedMHAPool", "create", "kvcache_pool_specs"]


class FusedMHAPool:
    """K and V of every token side by side: ``[layers, size + page_size, 2, H, D]``."""

    kind = "fused-mha"

    def __init__(self, config: PoolConfig) -> None:
        self.size = config.size
        self.page_size = config.page_size
        self.dtype = config.dtype
        self.device = config.device
        self.layer_num = config.layer_num
        self.head_num = config.head_num
        self.head_dim = config.head_dim
        self._rows = LayerRows(
            config.layer_num,
            config.size + config.page_size,
            (2, config.head_num, config.head_dim),
            config.dtype,
            config.device,
        )

    def _layer(self, layer_id: int) -> torch.Tensor:
        if not 0 <= layer_id < self.layer_num:
            raise InvalidLayerError(f"layer {layer_id} is not in 0..{self.layer_num - 1}")
        return self._rows.layer(layer_id)

    def get_key_buffer(self, layer_id: int) -> torch.Tensor:
        return self._layer(layer_id)[:, 0]

    def get_value_buffer(self, layer_id: int) -> torch.Tensor:
        return self._layer(layer_id)[:, 1]

    def get_kv_buffer(self, layer_id: int) -> tuple[torch.Tensor, torch.Tensor]:
        return self.get_key_buffer(layer_id), self.get_value_buffer(layer_id)

    def get_kv_size_bytes(self) -> int:
        return self._rows.nbytes

    def set_kv_buffer(
        self,
        layer: LayerLike,
        loc: KVWriteLoc | torch.Tensor,
        cache_k: torch.Tensor,
        cache_v: torch.Tensor,
        k_scale: float | None = None,
        v_scale: float | None = None,
    ) -> None:
        self._layer(layer.layer_id)
        slots, _ = unwrap_write_loc(loc)
        slots = check_slots(slots, limit=self.size + self.page_size, allow_zero=True, name="loc")
        shape = (self.head_num, self.head_dim)
        k = check_rows(cache_k, name="cache_k", rows=slots.numel(), row_shape=shape)
        v = check_rows(cache_v, name="cache_v", rows=slots.numel(), row_shape=shape)
        k = k / k_scale if k_scale is not None else k
        v = v / v_scale if v_scale is not None else v
        both = self._rows.to_storage(torch.stack((k, v), dim=1))
        self._rows.write(layer.layer_id, slots.to(self.device), both)

    def get_cpu_copy(
        self, indices: torch.Tensor, mamba_indices: torch.Tensor | None = None
    ) -> KVSnapshot:
        """Host copy of ``indices``; ``mamba_indices`` is accepted and ignored (no state)."""
        slots = check_slots(indices, limit=self.size + self.page_size, allow_duplicates=False)
        parts = {"kv": self._rows.gather(slots.to(self.device))}
        return KVSnapshot(self.kind, self.dtype, slots.numel(), parts)

    def load_cpu_copy(
        self,
        snapshot: KVSnapshot,
        indices: torch.Tensor,
        mamba_indices: torch.Tensor | None = None,
    ) -> None:
        slots = check_slots(indices, limit=self.size + self.page_size, allow_duplicates=False)
        n = slots.numel()
        expect_snapshot(
            snapshot,
            kind=self.kind,
            dtype=self.dtype,
            token_count=n,
            parts={"kv": self._rows.part_layout(n)},
        )
        self._rows.scatter(slots.to(self.device), snapshot.parts["kv"])


def create(config: PoolConfig) -> tuple[FusedMHAPool, PagedSlotAllocator]:
    pool = FusedMHAPool(config)
    return pool, PagedSlotAllocator(config.size, config.page_size, pool)


@hookimpl
def kvcache_pool_specs() -> list[PoolSpec]:
    return [
        PoolSpec(
            name="fused-mha",
            pool_class=FusedMHAPool,
            allocator_class=PagedSlotAllocator,
            factory=create,
            capabilities=frozenset({Capability.OFFLOAD, Capability.PAGED}),
            description="example third-party pool: K and V of a layer in one buffer",
        )
    ]
