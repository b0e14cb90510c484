"""``int8-mha``: an MHA pool that stores K and V as int8 with one scale per token.

Why this pool exists in the wild: int8 halves (against bf16) the memory a token's K and V take,
so twice as many tokens fit, and a scale per token keeps outliers in one token from costing
precision in every other. It is here as the smallest complete example of a third-party pool:
the contract, input checks before any write, a self-describing snapshot (values and scales),
the plugin hook, and nothing imported but ``kvcache_core``'s public names.

What the getters return (docs/contract.md, "Quantised pools"): ``get_key_buffer`` and
``get_value_buffer`` return a *dequantised copy* in the pool's compute dtype ``dtype``; writing
into it changes nothing. Kernels that read int8 directly use :meth:`Int8MHAPool.get_key_storage`
and :meth:`Int8MHAPool.get_value_storage` (live views of the values and their scales).
"""

from __future__ import annotations

import torch

from kvcache_core import (
    Capability,
    InvalidLayerError,
    KVSnapshot,
    KVWriteLoc,
    LayerLike,
    PagedSlotAllocator,
    PoolConfig,
    PoolSpec,
    QuantizedLayerRows,
    check_rows,
    check_slots,
    expect_snapshot,
    hookimpl,
    unwrap_write_loc,
)

__all__ = ["Int8MHAPool", "create", "kvcache_pool_specs"]


class Int8MHAPool:
    """K and V of every layer as ``[size + page_size, H, D]`` int8 plus ``[size + page_size, 1]``
    float32 scales (one per token)."""

    kind = "int8-mha"

    def __init__(self, config: PoolConfig) -> None:
        self.size = config.size
        self.page_size = config.page_size
        self.dtype = config.dtype
        self.device = config.device
        self.layer_num = config.layer_num
        self.start_layer = config.start_layer  # layer ids are global (pipeline stages)
        self.head_num = config.head_num
        self.head_dim = config.head_dim
        self._k, self._v = (
            QuantizedLayerRows(
                config.layer_num,
                config.size + config.page_size,
                (config.head_num, config.head_dim),
                dtype=config.dtype,
                device=config.device,
                quant_dtype=torch.int8,
                page_size=config.page_size,
            )
            for _ in range(2)
        )

    def _check_layer(self, layer_id: int) -> int:
        """Global layer id -> index into this pool's rows (a pipeline stage holds
        ``start_layer .. start_layer + layer_num - 1``)."""
        local = layer_id - self.start_layer
        if not 0 <= local < self.layer_num:
            last = self.start_layer + self.layer_num - 1
            raise InvalidLayerError(f"layer {layer_id} is not in {self.start_layer}..{last}")
        return local

    def get_key_buffer(self, layer_id: int) -> torch.Tensor:
        """Layer ``layer_id``'s keys, dequantised into a new tensor of ``dtype``."""
        return self._k.dequantize(self._check_layer(layer_id))

    def get_value_buffer(self, layer_id: int) -> torch.Tensor:
        """Layer ``layer_id``'s values, dequantised into a new tensor of ``dtype``."""
        return self._v.dequantize(self._check_layer(layer_id))

    def get_kv_buffer(self, layer_id: int) -> tuple[torch.Tensor, torch.Tensor]:
        return self.get_key_buffer(layer_id), self.get_value_buffer(layer_id)

    def get_key_storage(self, layer_id: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Live int8 keys and their per-token scales, for kernels that dequantise themselves."""
        return self._k.layer(self._check_layer(layer_id))

    def get_value_storage(self, layer_id: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Live int8 values and their per-token scales."""
        return self._v.layer(self._check_layer(layer_id))

    def get_kv_size_bytes(self) -> int:
        return self._k.nbytes + self._v.nbytes

    def set_kv_buffer(
        self,
        layer: LayerLike,
        loc: KVWriteLoc | torch.Tensor,
        cache_k: torch.Tensor,
        cache_v: torch.Tensor,
        k_scale: float | None = None,
        v_scale: float | None = None,
    ) -> None:
        """Quantise and write; ``k_scale``/``v_scale`` divide first (an int8 write always
        casts). Everything is checked before anything is written."""
        layer_id = self._check_layer(layer.layer_id)
        slots, _ = unwrap_write_loc(loc)
        slots = check_slots(slots, limit=self.size + self.page_size, allow_zero=True, name="loc")
        shape = (self.head_num, self.head_dim)
        k = check_rows(cache_k, name="cache_k", rows=slots.numel(), row_shape=shape)
        v = check_rows(cache_v, name="cache_v", rows=slots.numel(), row_shape=shape)
        qk, sk = self._k.quantize(k, k_scale)
        qv, sv = self._v.quantize(v, v_scale)
        slots = slots.to(self.device)
        self._k.write(layer_id, slots, qk, sk)
        self._v.write(layer_id, slots, qv, sv)

    def get_cpu_copy(
        self, indices: torch.Tensor, mamba_indices: torch.Tensor | None = None
    ) -> KVSnapshot:
        """Host copy of ``indices`` (int8 values and scales, bit for bit); ``mamba_indices`` is
        accepted and ignored (the pool keeps no recurrent state)."""
        slots = check_slots(indices, limit=self.size + self.page_size, allow_duplicates=False)
        slots = slots.to(self.device)
        k, k_scale = self._k.gather(slots)
        v, v_scale = self._v.gather(slots)
        parts = {"k": k, "k_scale": k_scale, "v": v, "v_scale": v_scale}
        return KVSnapshot(self.kind, self.dtype, slots.numel(), parts)

    def load_cpu_copy(
        self,
        snapshot: KVSnapshot,
        indices: torch.Tensor,
        mamba_indices: torch.Tensor | None = None,
    ) -> None:
        """Write a snapshot back at new ``indices``; ``mamba_indices`` is ignored."""
        slots = check_slots(indices, limit=self.size + self.page_size, allow_duplicates=False)
        n = slots.numel()
        expect_snapshot(
            snapshot,
            kind=self.kind,
            dtype=self.dtype,
            token_count=n,
            parts={**self._k.part_layouts("k", n), **self._v.part_layouts("v", n)},
        )
        slots = slots.to(self.device)
        parts = snapshot.parts
        self._k.scatter(slots, parts["k"], parts["k_scale"])
        self._v.scatter(slots, parts["v"], parts["v_scale"])


def create(config: PoolConfig) -> tuple[Int8MHAPool, PagedSlotAllocator]:
    pool = Int8MHAPool(config)
    return pool, PagedSlotAllocator(config.size, config.page_size, pool)


@hookimpl
def kvcache_pool_specs() -> list[PoolSpec]:
    return [
        PoolSpec(
            name="int8-mha",
            pool_class=Int8MHAPool,
            allocator_class=PagedSlotAllocator,
            factory=create,
            capabilities=frozenset({Capability.OFFLOAD, Capability.PAGED}),
            description="example third-party pool: int8 K and V with one scale per token",
        )
    ]
