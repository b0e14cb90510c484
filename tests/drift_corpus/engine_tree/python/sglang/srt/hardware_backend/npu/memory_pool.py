"""A backend module with the same file name as ``srt/mem_cache/memory_pool.py``: in namespace
packages, only the folders tell the two apart."""

from __future__ import annotations

import torch


class NPUPagedPoolBase:
    def load_cpu_copy(
        self, kv_cache_cpu: object, indices: torch.Tensor, mamba_indices: torch.Tensor | None = None
    ) -> None:
        return None
