"""An allocator pass-through that accepts ``mamba_indices`` and drops it.

This is the drift that silently lost recurrent state on resume: the signature is perfect, so
only a look at the body can see it.
"""

from __future__ import annotations

import torch

from kvcache_core import KVSnapshot

from ._reference import ReferenceAllocator


class DroppingAllocator(ReferenceAllocator):
    def get_cpu_copy(
        self, indices: torch.Tensor, mamba_indices: torch.Tensor | None = None
    ) -> KVSnapshot:
        return self._kvcache.get_cpu_copy(indices)  # expect: parameter-not-forwarded DroppingAllocator.get_cpu_copy

    def load_cpu_copy(
        self,
        snapshot: KVSnapshot,
        indices: torch.Tensor,
        mamba_indices: torch.Tensor | None = None,
    ) -> None:
        if mamba_indices is not None:
            print("resuming with", len(mamba_indices), "mamba slots")
        pool = self._kvcache
        pool.load_cpu_copy(snapshot, indices)  # expect: parameter-not-forwarded DroppingAllocator.load_cpu_copy


class DroppingAllocatorFixed(ReferenceAllocator):
    def get_cpu_copy(
        self, indices: torch.Tensor, mamba_indices: torch.Tensor | None = None
    ) -> KVSnapshot:
        slots = mamba_indices
        return self._kvcache.get_cpu_copy(indices, slots)

    def load_cpu_copy(
        self,
        snapshot: KVSnapshot,
        indices: torch.Tensor,
        mamba_indices: torch.Tensor | None = None,
    ) -> None:
        self._kvcache.load_cpu_copy(snapshot, indices, mamba_indices=mamba_indices)
