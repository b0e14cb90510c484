"""Annotations wider or narrower than the contract's.

A parameter may accept more than the contract's (``Any``, ``object``, a union that includes the
contract's type): mypy accepts it, and so must the checker. Accepting less is a conflict; so is a
return that promises less.
"""

from __future__ import annotations

from typing import Any

import torch

from kvcache_core import KVSnapshot, KVWriteLoc, unwrap_write_loc

from ._reference import ReferencePool


class WideningPool(ReferencePool):
    def set_kv_buffer(
        self,
        layer: Any,
        loc: KVWriteLoc | torch.Tensor | list[int],
        cache_k: torch.Tensor,
        cache_v: object,
        k_scale: float | str | None = None,
        v_scale: float | int | None = None,
    ) -> None:
        slots, _ = unwrap_write_loc(loc) if not isinstance(loc, list) else (torch.tensor(loc), None)
        self.k[layer.layer_id][slots] = cache_k
        if isinstance(cache_v, torch.Tensor):
            self.v[layer.layer_id][slots] = cache_v

    def get_cpu_copy(
        self, indices: object, mamba_indices: torch.Tensor | None = None
    ) -> KVSnapshot:
        assert isinstance(indices, torch.Tensor)
        return super().get_cpu_copy(indices, mamba_indices)

    def get_kv_size_bytes(self) -> bool:  # narrower than int: fine for a return
        return True


class NarrowingPool(ReferencePool):
    def get_cpu_copy(self, indices: torch.Tensor, mamba_indices: torch.Tensor = torch.empty(0)) -> KVSnapshot:  # expect: annotation-mismatch NarrowingPool.get_cpu_copy; default-changed NarrowingPool.get_cpu_copy
        return super().get_cpu_copy(indices, mamba_indices)

    def get_kv_size_bytes(self) -> object:  # expect: return-mismatch NarrowingPool.get_kv_size_bytes
        return 0
