"""Positional parameters renamed: plain mypy accepts it, callers passing by keyword get TypeError.

mypy does not compare the names of positional-or-keyword parameters, neither when it checks a
class against a Protocol nor when it checks an override, so a plain ``mypy --strict`` run is
clean here; the signature comparison sees ``indices=`` stop working.
"""

from __future__ import annotations

import torch

from kvcache_core import KVSnapshot

from ._reference import ReferenceAllocator, ReferencePool


class RenamedPool(ReferencePool):
    def get_cpu_copy(self, idx: torch.Tensor, mamba_indices: torch.Tensor | None = None) -> KVSnapshot:  # expect: renamed-parameter RenamedPool.get_cpu_copy
        return super().get_cpu_copy(idx, mamba_indices=mamba_indices)


class RenamedAllocator(ReferenceAllocator):
    def load_cpu_copy(self, snap: KVSnapshot, indices: torch.Tensor, mamba_indices: torch.Tensor | None = None) -> None:  # expect: renamed-parameter RenamedAllocator.load_cpu_copy
        self._kvcache.load_cpu_copy(snap, indices, mamba_indices=mamba_indices)


class RenamedPoolFixed(ReferencePool):
    def get_cpu_copy(
        self, indices: torch.Tensor, mamba_indices: torch.Tensor | None = None
    ) -> KVSnapshot:
        return super().get_cpu_copy(indices, mamba_indices=mamba_indices)
