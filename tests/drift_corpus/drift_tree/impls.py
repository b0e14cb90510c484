"""Implementations of the in-house base; one narrows ``get_cpu_copy``."""

from __future__ import annotations

import torch

from kvcache_core import KVSnapshot

from .base import TreeBasePool


class TreeGoodPool(TreeBasePool):
    def get_cpu_copy(
        self, indices: torch.Tensor, mamba_indices: torch.Tensor | None = None
    ) -> KVSnapshot:
        return super().get_cpu_copy(indices, mamba_indices=mamba_indices)


class TreeNarrowPool(TreeBasePool):
    def get_cpu_copy(self, indices: torch.Tensor) -> KVSnapshot:  # expect: missing-parameter TreeNarrowPool.get_cpu_copy; expect[drift]: missing-parameter TreeNarrowPool.get_cpu_copy
        return super().get_cpu_copy(indices)
