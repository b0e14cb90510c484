"""The engine's pool hierarchy (no ``__init__.py`` anywhere under ``srt/``)."""

from __future__ import annotations

import abc

import torch


class KVCache(abc.ABC):
    @abc.abstractmethod
    def get_cpu_copy(
        self, indices: torch.Tensor, mamba_indices: torch.Tensor | None = None
    ) -> object:
        raise NotImplementedError

    @abc.abstractmethod
    def load_cpu_copy(
        self, kv_cache_cpu: object, indices: torch.Tensor, mamba_indices: torch.Tensor | None = None
    ) -> None:
        raise NotImplementedError


class MHATokenToKVPool(KVCache):
    def get_cpu_copy(
        self, indices: torch.Tensor, mamba_indices: torch.Tensor | None = None
    ) -> object:
        return indices

    def load_cpu_copy(
        self, kv_cache_cpu: object, indices: torch.Tensor, mamba_indices: torch.Tensor | None = None
    ) -> None:
        return None
