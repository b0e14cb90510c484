"""Body drifts the first body rules missed: an alias of ``loc``, a validator fed the record, a
test of the wrong name taken for an unwrap, dead code after ``raise NotImplementedError``, and
a parameter that is only validated before being dropped."""

from __future__ import annotations

import torch

from kvcache_core import KVSnapshot, KVWriteLoc, LayerLike, check_slots, unwrap_write_loc

from ._reference import ReferenceAllocator, ReferencePool


class AliasingPool(ReferencePool):
    def set_kv_buffer(
        self,
        layer: LayerLike,
        loc: KVWriteLoc | torch.Tensor,
        cache_k: torch.Tensor,
        cache_v: torch.Tensor,
        k_scale: float | None = None,
        v_scale: float | None = None,
    ) -> None:
        if isinstance(layer, KVWriteLoc):  # tests `layer`, not `loc`
            return
        slots = loc
        self.k[layer.layer_id][slots] = cache_k  # expect: writeloc-not-unwrapped AliasingPool.set_kv_buffer
        self.v[layer.layer_id][slots] = cache_v


class ValidatingPool(ReferencePool):
    def set_kv_buffer(
        self,
        layer: LayerLike,
        loc: KVWriteLoc | torch.Tensor,
        cache_k: torch.Tensor,
        cache_v: torch.Tensor,
        k_scale: float | None = None,
        v_scale: float | None = None,
    ) -> None:
        slots = check_slots(loc, limit=self.size + 1)  # expect: writeloc-not-unwrapped ValidatingPool.set_kv_buffer
        self.k[layer.layer_id][slots] = cache_k
        self.v[layer.layer_id][slots] = cache_v


class ValidatingPoolFixed(ReferencePool):
    def set_kv_buffer(
        self,
        layer: LayerLike,
        loc: KVWriteLoc | torch.Tensor,
        cache_k: torch.Tensor,
        cache_v: torch.Tensor,
        k_scale: float | None = None,
        v_scale: float | None = None,
    ) -> None:
        full, _ = unwrap_write_loc(loc)
        slots = check_slots(full, limit=self.size + 1)
        self.k[layer.layer_id][slots] = cache_k
        self.v[layer.layer_id][slots] = cache_v


class DeadCodePool(ReferencePool):
    def get_cpu_copy(self, indices: torch.Tensor, mamba_indices: torch.Tensor | None = None) -> KVSnapshot:  # expect: not-implemented DeadCodePool.get_cpu_copy
        raise NotImplementedError("offload comes in 2.1")
        return super().get_cpu_copy(indices, mamba_indices)  # never runs


class ValidateThenDropAllocator(ReferenceAllocator):
    def get_cpu_copy(
        self, indices: torch.Tensor, mamba_indices: torch.Tensor | None = None
    ) -> KVSnapshot:
        if mamba_indices is not None:
            check_slots(mamba_indices, limit=4, name="mamba_indices")
        return self._kvcache.get_cpu_copy(indices)  # expect: parameter-not-forwarded ValidateThenDropAllocator.get_cpu_copy


class ValidateThenDropAllocatorFixed(ReferenceAllocator):
    def get_cpu_copy(
        self, indices: torch.Tensor, mamba_indices: torch.Tensor | None = None
    ) -> KVSnapshot:
        if mamba_indices is not None:
            mamba_indices = check_slots(mamba_indices, limit=4, name="mamba_indices")
        return self._kvcache.get_cpu_copy(indices, mamba_indices=mamba_indices)
