"""The in-house base every pool of this tree derives from."""

from __future__ import annotations

import torch

from kvcache_core import KVSnapshot

from .._reference import ReferencePool


class TreeBasePool(ReferencePool):
    def get_cpu_copy(
        self, indices: torch.Tensor, mamba_indices: torch.Tensor | None = None
    ) -> KVSnapshot:
        return super().get_cpu_copy(indices, mamba_indices=mamba_indices)
