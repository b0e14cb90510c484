"""A backend pool in another folder, reaching its base by an absolute import of the engine's
package: only the file's module path (``srt/mem_cache/memory_pool``) says where it is."""

from __future__ import annotations

import torch

import sglang.srt.mem_cache.memory_pool as pools
from sglang.srt.layers.npu_ops import NPUPagedBase  # not among the paths given
from sglang.srt.mem_cache.memory_pool import MHATokenToKVPool

from ...mem_cache.memory_pool import MHATokenToKVPool as RelativeBase


class NPUMHATokenToKVPool(MHATokenToKVPool):
    def get_cpu_copy(self, indices: torch.Tensor) -> object:  # expect[drift]: missing-parameter NPUMHATokenToKVPool.get_cpu_copy
        return indices


class NPUModulePool(pools.MHATokenToKVPool):
    def load_cpu_copy(self, kv_cache_cpu: object, indices: torch.Tensor) -> None:  # expect[drift]: missing-parameter NPUModulePool.load_cpu_copy
        return None


class NPUPagedPool(NPUPagedBase):  # expect[drift]: unresolved-base NPUPagedPool
    def get_cpu_copy(self, indices: torch.Tensor) -> object:
        return indices


class NPUGoodPool(MHATokenToKVPool):
    def get_cpu_copy(
        self, indices: torch.Tensor, mamba_indices: torch.Tensor | None = None
    ) -> object:
        return super().get_cpu_copy(indices, mamba_indices=mamba_indices)


class NPURelativePool(RelativeBase):
    def get_cpu_copy(self, indices: torch.Tensor, mamba_indices: torch.Tensor | None) -> object:  # expect[drift]: became-required NPURelativePool.get_cpu_copy
        return indices


from .memory_pool import NPUPagedPoolBase  # noqa: E402  (this folder's memory_pool.py)


class NPUPagedSubPool(NPUPagedPoolBase):
    def load_cpu_copy(self, kv_cache_cpu: object, indices: torch.Tensor) -> None:  # expect[drift]: missing-parameter NPUPagedSubPool.load_cpu_copy
        return None
