"""Engine-side code that retracts requests: passes ``mamba_indices=`` by keyword."""

from __future__ import annotations

import torch

from .base import TreeBasePool


def retract(pool: TreeBasePool, slots: torch.Tensor, state: torch.Tensor | None) -> object:
    return pool.get_cpu_copy(slots, mamba_indices=state)  # a related location of TreeNarrowPool's finding


class Scheduler:
    def __init__(self, pool: TreeBasePool) -> None:
        self.pool = pool

    def snapshot(self, slots: torch.Tensor) -> object:
        return self.pool.get_cpu_copy(slots)

    def snapshot_with_state(self, slots: torch.Tensor, state: torch.Tensor) -> object:
        return self.pool.get_cpu_copy(  # a related location of TreeNarrowPool's finding
            slots, mamba_indices=state
        )


def flush(pool: TreeBasePool, slots: torch.Tensor) -> object:
    # no implementation a TreeBasePool can be takes `stream=`: the call itself is wrong
    return pool.get_cpu_copy(slots, stream=None)  # expect[drift]: unaccepted-keyword flush.get_cpu_copy
