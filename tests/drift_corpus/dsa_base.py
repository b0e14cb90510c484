"""A correct DSA-like base pool (latent + indexer keys); ``dsa_sub`` subclasses it."""

from __future__ import annotations

import torch

from kvcache_core import KVWriteLoc, LayerLike, unwrap_write_loc

from ._reference import ReferencePool


class DSABasePool(ReferencePool):
    def __init__(self) -> None:
        super().__init__()
        self.kv_lora_rank = 2
        self.qk_rope_head_dim = 2
        self.index_head_dim = 4
        self.index_dtype = torch.float32
        self.index_k = torch.zeros(self.layer_num, self.size + 1, 4)

    def set_mla_kv_buffer(
        self,
        layer: LayerLike,
        loc: KVWriteLoc | torch.Tensor,
        cache_k_nope: torch.Tensor,
        cache_k_rope: torch.Tensor,
    ) -> None:
        slots, _ = unwrap_write_loc(loc)
        self.k[layer.layer_id].index_copy_(0, slots, torch.cat([cache_k_nope, cache_k_rope], -1))

    def get_mla_kv_buffer(
        self,
        layer: LayerLike,
        loc: torch.Tensor,
        dst_dtype: torch.dtype | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        rows = self.k[layer.layer_id][loc]
        return rows[..., :2], rows[..., 2:]

    def set_index_k_scale_buffer(
        self,
        layer_id: int,
        loc: torch.Tensor,
        index_k: torch.Tensor,
        index_k_scale: torch.Tensor,
    ) -> None:
        self.index_k[layer_id][loc] = index_k

    def get_index_k_scale_buffer(
        self, layer_id: int, loc: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        return self.index_k[layer_id][loc], self.index_k[layer_id][loc]
