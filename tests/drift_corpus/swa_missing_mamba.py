"""An SWA-like pool and its allocator written against contract 1: no ``mamba_indices``.

The engine passes ``mamba_indices=`` by keyword on every retraction, so both raise TypeError.
"""

from __future__ import annotations

import torch

from kvcache_core import KVSnapshot

from ._reference import ReferenceAllocator, ReferencePool


class SWALikePool(ReferencePool):
    def __init__(self) -> None:
        super().__init__()
        self.swa_layer_ids = (1,)
        self.window = ReferencePool()

    def get_cpu_copy(self, indices: torch.Tensor) -> KVSnapshot:  # expect: missing-parameter SWALikePool.get_cpu_copy
        full = super().get_cpu_copy(indices)
        return KVSnapshot("swa", self.dtype, indices.numel(), {}, children={"full": full})

    def load_cpu_copy(self, snapshot: KVSnapshot, indices: torch.Tensor) -> None:  # expect: missing-parameter SWALikePool.load_cpu_copy
        full = snapshot.children["full"]
        assert full is not None
        super().load_cpu_copy(full, indices)


class SWALikeAllocator(ReferenceAllocator):
    def get_cpu_copy(self, indices: torch.Tensor) -> KVSnapshot:  # expect: missing-parameter SWALikeAllocator.get_cpu_copy
        return self._kvcache.get_cpu_copy(indices)

    def load_cpu_copy(self, snapshot: KVSnapshot, indices: torch.Tensor) -> None:  # expect: missing-parameter SWALikeAllocator.load_cpu_copy
        self._kvcache.load_cpu_copy(snapshot, indices)


class SWALikePoolFixed(ReferencePool):
    def get_cpu_copy(
        self, indices: torch.Tensor, mamba_indices: torch.Tensor | None = None
    ) -> KVSnapshot:
        full = super().get_cpu_copy(indices, mamba_indices=mamba_indices)
        return KVSnapshot("swa", self.dtype, indices.numel(), {}, children={"full": full})

    def load_cpu_copy(
        self,
        snapshot: KVSnapshot,
        indices: torch.Tensor,
        mamba_indices: torch.Tensor | None = None,
    ) -> None:
        full = snapshot.children["full"]
        assert full is not None
        super().load_cpu_copy(full, indices, mamba_indices=mamba_indices)


class SWALikeAllocatorFixed(ReferenceAllocator):
    def get_cpu_copy(
        self, indices: torch.Tensor, mamba_indices: torch.Tensor | None = None
    ) -> KVSnapshot:
        return self._kvcache.get_cpu_copy(indices, mamba_indices=mamba_indices)

    def load_cpu_copy(
        self,
        snapshot: KVSnapshot,
        indices: torch.Tensor,
        mamba_indices: torch.Tensor | None = None,
    ) -> None:
        self._kvcache.load_cpu_copy(snapshot, indices, mamba_indices=mamba_indices)
