"""Offload "declared" by defining the methods, which only raise NotImplementedError.

Engines probe ``hasattr(pool, "get_cpu_copy")`` and retract; the first retraction crashes. The
subclass inherits the raising methods, so its findings point at the base.
"""

from __future__ import annotations

import abc

import torch

from kvcache_core import KVSnapshot

from ._reference import ReferencePool


class RaisingPool(ReferencePool):
    def get_cpu_copy(self, indices: torch.Tensor, mamba_indices: torch.Tensor | None = None) -> KVSnapshot:  # expect: not-implemented RaisingPool.get_cpu_copy; not-implemented InheritsRaising.get_cpu_copy
        """Not supported yet."""
        raise NotImplementedError("offload is not supported by this pool")

    def load_cpu_copy(self, snapshot: KVSnapshot, indices: torch.Tensor, mamba_indices: torch.Tensor | None = None) -> None:  # expect: not-implemented RaisingPool.load_cpu_copy; not-implemented InheritsRaising.load_cpu_copy
        raise NotImplementedError


class InheritsRaising(RaisingPool):
    label = "inherits"


class AbstractOffload(abc.ABC):
    """Abstract: never served, so never checked on its own."""

    @abc.abstractmethod
    def get_cpu_copy(
        self, indices: torch.Tensor, mamba_indices: torch.Tensor | None = None
    ) -> KVSnapshot:
        raise NotImplementedError


class ImplementsAbstract(ReferencePool, AbstractOffload):
    def get_cpu_copy(
        self, indices: torch.Tensor, mamba_indices: torch.Tensor | None = None
    ) -> KVSnapshot:
        return ReferencePool.get_cpu_copy(self, indices, mamba_indices)
