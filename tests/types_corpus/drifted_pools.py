"""Pools that drifted from the contract, for the types level's tests (type-checked, never run).

Each class documents the drift it carries; tests/types_level asserts that mypy reports every
conflicting member, with the member, the parameter and both signatures.
"""

from __future__ import annotations

import torch

from kvcache_core import KVSnapshot, KVWriteLoc, LayerLike


class _GoodBuffers:
    """Correct buffer accessors, shared by the drifted pools below."""

    size: int
    page_size: int
    dtype: torch.dtype
    device: torch.device
    layer_num: int

    def get_key_buffer(self, layer_id: int) -> torch.Tensor:
        raise NotImplementedError

    def get_value_buffer(self, layer_id: int) -> torch.Tensor:
        raise NotImplementedError

    def get_kv_buffer(self, layer_id: int) -> tuple[torch.Tensor, torch.Tensor]:
        raise NotImplementedError

    def set_kv_buffer(
        self,
        layer: LayerLike,
        loc: KVWriteLoc | torch.Tensor,
        cache_k: torch.Tensor,
        cache_v: torch.Tensor,
        k_scale: float | None = None,
        v_scale: float | None = None,
    ) -> None:
        raise NotImplementedError

    def get_kv_size_bytes(self) -> int:
        raise NotImplementedError

    def get_cpu_copy(
        self, indices: torch.Tensor, mamba_indices: torch.Tensor | None = None
    ) -> KVSnapshot:
        raise NotImplementedError

    def load_cpu_copy(
        self,
        snapshot: KVSnapshot,
        indices: torch.Tensor,
        mamba_indices: torch.Tensor | None = None,
    ) -> None:
        raise NotImplementedError


class ManyConflictsPool:
    """Four conflicting members and one missing: mypy's own message would name only two."""

    size: str  # conflict 1: the contract says int
    page_size: int
    dtype: torch.dtype
    device: torch.device
    layer_num: int

    def get_key_buffer(self, layer_id: str) -> torch.Tensor:  # conflict 2: parameter type
        raise NotImplementedError

    def get_value_buffer(self, layer_id: int) -> torch.Tensor:
        raise NotImplementedError

    def get_kv_buffer(self, layer_id: int) -> list[torch.Tensor]:  # conflict 3: return type
        raise NotImplementedError

    def set_kv_buffer(  # conflict 4: no v_scale
        self,
        layer: LayerLike,
        loc: KVWriteLoc | torch.Tensor,
        cache_k: torch.Tensor,
        cache_v: torch.Tensor,
        k_scale: float | None = None,
    ) -> None:
        raise NotImplementedError

    # conflict 5: get_kv_size_bytes is missing


class RenamedParameterPool(_GoodBuffers):
    """``indices`` is called ``idx``: a caller passing ``indices=`` by keyword gets a TypeError."""

    def get_cpu_copy(
        self, idx: torch.Tensor, mamba_indices: torch.Tensor | None = None
    ) -> KVSnapshot:
        raise NotImplementedError


class WrongReturnPool(_GoodBuffers):
    """``get_cpu_copy`` returns a dict of tensors instead of a ``KVSnapshot``."""

    def get_cpu_copy(
        self, indices: torch.Tensor, mamba_indices: torch.Tensor | None = None
    ) -> dict[str, torch.Tensor]:
        raise NotImplementedError


class NoMambaIndicesPool(_GoodBuffers):
    """Written against contract 1: neither offload method accepts ``mamba_indices``."""

    def get_cpu_copy(self, indices: torch.Tensor) -> KVSnapshot:
        raise NotImplementedError

    def load_cpu_copy(self, snapshot: KVSnapshot, indices: torch.Tensor) -> None:
        raise NotImplementedError


class InheritsDriftPool(NoMambaIndicesPool):
    """Defines nothing itself: the findings must point at the base class's methods."""


class CleanPool(_GoodBuffers):
    """Satisfies KVPool and OffloadablePool."""
