"""An MLA-like pool whose write paths index with ``loc`` as it arrives.

With a bare slot tensor this works; with the engine's ``KVWriteLoc`` record it raises (or, with
a tensor subclass, writes the wrong rows): scaled MLA prefill broke exactly like this.
"""

from __future__ import annotations

import torch

from kvcache_core import KVWriteLoc, LayerLike, unwrap_write_loc

from ._reference import ReferencePool


class MLALikePool(ReferencePool):
    def __init__(self) -> None:
        super().__init__()
        self.kv_lora_rank = 2
        self.qk_rope_head_dim = 2

    def set_kv_buffer(
        self,
        layer: LayerLike,
        loc: KVWriteLoc | torch.Tensor,
        cache_k: torch.Tensor,
        cache_v: torch.Tensor,
        k_scale: float | None = None,
        v_scale: float | None = None,
    ) -> None:
        if k_scale is not None:
            cache_k = cache_k / k_scale
        self.k[layer.layer_id][loc] = cache_k  # expect: writeloc-not-unwrapped MLALikePool.set_kv_buffer

    def set_mla_kv_buffer(
        self,
        layer: LayerLike,
        loc: KVWriteLoc | torch.Tensor,
        cache_k_nope: torch.Tensor,
        cache_k_rope: torch.Tensor,
    ) -> None:
        rows = torch.cat([cache_k_nope, cache_k_rope], dim=-1)
        self.k[layer.layer_id].index_copy_(0, loc, rows)  # expect: writeloc-not-unwrapped MLALikePool.set_mla_kv_buffer

    def get_mla_kv_buffer(
        self,
        layer: LayerLike,
        loc: torch.Tensor,
        dst_dtype: torch.dtype | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        rows = self.k[layer.layer_id][loc]
        return rows[..., :2], rows[..., 2:]


class MLALikePoolFixed(MLALikePool):
    def set_kv_buffer(
        self,
        layer: LayerLike,
        loc: KVWriteLoc | torch.Tensor,
        cache_k: torch.Tensor,
        cache_v: torch.Tensor,
        k_scale: float | None = None,
        v_scale: float | None = None,
    ) -> None:
        if isinstance(loc, KVWriteLoc):
            loc = loc.full
        self.k[layer.layer_id][loc] = cache_k

    def set_mla_kv_buffer(
        self,
        layer: LayerLike,
        loc: KVWriteLoc | torch.Tensor,
        cache_k_nope: torch.Tensor,
        cache_k_rope: torch.Tensor,
    ) -> None:
        slots, _ = unwrap_write_loc(loc)
        rows = torch.cat([cache_k_nope, cache_k_rope], dim=-1)
        self.k[layer.layer_id].index_copy_(0, slots, rows)
