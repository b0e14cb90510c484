"""Engine-side code that retracts requests: passes ``mamba_indices=`` by keyword."""

from __future__ import annotations

import torch

from .base import TreeBasePool


def retract(pool: TreeBasePool, slots: torch.Tensor, state: torch.Tensor | None) -> object:
    return pool.get_cpu_copy(slots, mamba_indices=state)  # expect[drift]: unaccepted-keyword retract.get_cpu_copy


class Scheduler:
    def __init__(self, pool: TreeBasePool) -> None:
        self.pool = pool

    def snapshot(self, slots: torch.Tensor) -> object:
        return self.pool.get_cpu_copy(slots)

    def snapshot_with_state(self, slots: torch.Tensor, state: torch.Tensor) -> object:
        return self.pool.get_cpu_copy(  # expect[drift]: unaccepted-keyword snapshot_with_state.get_cpu_copy
            slots, mamba_indices=state
        )
