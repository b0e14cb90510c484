"""DeepSeek sparse attention (DSA) pool: the MLA latent plus a paged indexer-key buffer per layer.

Indexer layout (clearer than the engines' packed byte rows, same addressing): per layer a key
tensor ``[num_pages, P, index_head_dim]`` in ``index_dtype`` (fp8 stored as uint8) and a scale
tensor ``[num_pages, P]`` float32, with ``num_pages = ceil((size + P) / P)``. Slot ``s`` is page
``s // P``, offset ``s % P``. Both are kept as *token rows* (``[num_pages * P, ...]``), of which
the page view is a free reshape, so per-token reads, writes and offload are plain row gathers.

Offload gathers the indexer key and scale **per token**, like the latent, and reload scatters them
per token at the new slots. Engines copy whole page rows (page ids ``indices[::P] // P``), which
is only right when the indices are one request's slots starting at a page boundary; a per-token
copy is right for any slot set, costs the same bytes, and never touches a token that was not named.
"""

from __future__ import annotations

import torch

from kvcache_core import (
    Capability,
    LayerRows,
    PagedSlotAllocator,
    PartLayout,
    PoolConfig,
    PoolSpec,
    check_rows,
    hookimpl,
    storage_dtype,
)

from .mla import MLATokenToKVPool, require

__all__ = ["DSATokenToKVPool", "create", "default_index_dtype", "kvcache_pool_specs"]


def default_index_dtype() -> torch.dtype:
    """fp8 (e4m3) when this torch has it, as the engines store indexer keys; else bfloat16."""
    fp8 = getattr(torch, "float8_e4m3fn", None)
    return fp8 if isinstance(fp8, torch.dtype) else torch.bfloat16


class DSATokenToKVPool(MLATokenToKVPool):
    """MLA latent + per-layer indexer keys and float32 scales, page-indexed."""

    kind = "dsa"

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
        index_head_dim: int,
        index_dtype: torch.dtype | None = None,
        start_layer: int = 0,
        check_write_slots: bool | None = None,
    ) -> None:
        super().__init__(
            size,
            page_size,
            dtype,
            kv_lora_rank,
            qk_rope_head_dim,
            layer_num,
            device,
            start_layer=start_layer,
            check_write_slots=check_write_slots,
        )
        if index_head_dim <= 0:
            raise ValueError(f"index_head_dim must be positive, got {index_head_dim}")
        self.index_head_dim = index_head_dim
        self.index_dtype = default_index_dtype() if index_dtype is None else index_dtype
        self.index_store_dtype = storage_dtype(self.index_dtype)
        self.num_index_pages = -(-self.rows // page_size)
        token_rows = self.num_index_pages * page_size
        self._index_k = LayerRows(
            layer_num,
            token_rows,
            (index_head_dim,),
            self.index_dtype,
            self.device,
            page_size=page_size,
        )
        self._index_scale = LayerRows(
            layer_num, token_rows, (), torch.float32, self.device, page_size=page_size
        )

    def get_kv_size_bytes(self) -> int:
        return super().get_kv_size_bytes() + self._index_k.nbytes + self._index_scale.nbytes

    # -- indexer ---------------------------------------------------------------------------
    def get_index_k_pages(self, layer_id: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Kernel view of a layer: keys ``[pages, P, D]`` (``index_dtype``), scales ``[pages, P]``.

        Views, not copies: this is what an indexer kernel reads by page id.
        """
        local = self._local(layer_id)
        pages, p = self.num_index_pages, self.page_size
        keys = self._index_k.layer(local).view(pages, p, self.index_head_dim)
        return keys, self._index_scale.layer(local).view(pages, p)

    def set_index_k_scale_buffer(
        self,
        layer_id: int,
        loc: torch.Tensor,
        index_k: torch.Tensor,
        index_k_scale: torch.Tensor,
    ) -> None:
        """Store per-token indexer keys (``[n, D]``) and scales (``[n]`` or ``[n, 1]``) at ``loc``.

        Keys are cast to ``index_dtype`` (pass them already quantized for fp8: a plain cast does
        not scale), scales to float32. Both are checked before either is written.
        """
        local = self._local(layer_id)
        slots = self._slots(loc)
        n = slots.numel()
        keys = check_rows(index_k, name="index_k", rows=n, row_shape=(self.index_head_dim,))
        scales = check_rows(index_k_scale, name="index_k_scale", rows=n, row_shape=())
        key_rows = self._index_k.to_storage(keys)
        scale_rows = self._index_scale.to_storage(scales)
        self._index_k.write(local, slots, key_rows)
        self._index_scale.write(local, slots, scale_rows)

    def get_index_k_scale_buffer(
        self, layer_id: int, loc: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Copies of the keys (``[n, D]``, ``index_dtype``) and scales (``[n]``) at ``loc``."""
        local = self._local(layer_id)
        slots = self._slots(loc)
        keys = self._index_k.data[local].index_select(0, slots)
        if self.index_store_dtype != self.index_dtype:
            keys = keys.view(self.index_dtype)
        return keys, self._index_scale.data[local].index_select(0, slots)

    # -- offload: the latent plus the indexer, per token -------------------------------------
    def _meta(self) -> dict[str, object]:
        return {**super()._meta(), "index_dtype": str(self.index_dtype)}

    def _offload_parts(self, slots: torch.Tensor) -> dict[str, torch.Tensor]:
        return {**super()._offload_parts(slots), **self._index_parts(slots)}

    def _index_parts(self, slots: torch.Tensor) -> dict[str, torch.Tensor]:
        """Host copies of the indexer keys and scales at ``slots``."""
        return {
            "index_k": self._index_k.gather(slots),
            "index_k_scale": self._index_scale.gather(slots),
        }

    def _offload_layout(self, count: int) -> dict[str, PartLayout]:
        layout = super()._offload_layout(count)
        layout["index_k"] = self._index_k.part_layout(count)
        layout["index_k_scale"] = self._index_scale.part_layout(count)
        return layout

    def _load_parts(self, slots: torch.Tensor, parts: dict[str, torch.Tensor]) -> None:
        super()._load_parts(slots, parts)
        self._index_k.scatter(slots, parts["index_k"])
        self._index_scale.scatter(slots, parts["index_k_scale"])


def index_dtype_of(config: PoolConfig) -> torch.dtype | None:
    """``PoolConfig.options["index_dtype"]`` (a ``torch.dtype``), or None for the default."""
    value = config.options.get("index_dtype")
    if value is not None and not isinstance(value, torch.dtype):
        raise TypeError(f"PoolConfig.options['index_dtype'] must be a torch.dtype, got {value!r}")
    return value


def create(config: PoolConfig) -> tuple[DSATokenToKVPool, PagedSlotAllocator]:
    """Build a DSA pool and its allocator (token-granular when ``page_size`` is 1)."""
    pool = DSATokenToKVPool(
        size=config.size,
        page_size=config.page_size,
        dtype=config.dtype,
        kv_lora_rank=require(config.kv_lora_rank, "kv_lora_rank", "dsa"),
        qk_rope_head_dim=require(config.qk_rope_head_dim, "qk_rope_head_dim", "dsa"),
        layer_num=config.layer_num,
        device=config.device,
        index_head_dim=require(config.index_head_dim, "index_head_dim", "dsa"),
        index_dtype=index_dtype_of(config),
        start_layer=config.start_layer,
        check_write_slots=config.checks_write_slots,
    )
    return pool, PagedSlotAllocator(config.size, config.page_size, pool)


@hookimpl
def kvcache_pool_specs() -> list[PoolSpec]:
    return [
        PoolSpec(
            name="dsa",
            pool_class=DSATokenToKVPool,
            allocator_class=PagedSlotAllocator,
            factory=create,
            capabilities=frozenset(
                {Capability.OFFLOAD, Capability.MLA, Capability.INDEXER, Capability.PAGED}
            ),
            description="DSA: MLA latent plus paged fp8/bf16 indexer keys and fp32 scales",
        )
    ]
