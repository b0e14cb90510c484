"""Free groups, shared by every built-in allocator.

Eviction frees many requests in a row; between ``free_group_begin()`` and ``free_group_end()``
the allocator only collects them and releases everything in one ``free`` at the end, so the
per-call cost (and, for composite allocators, the per-call table updates) is paid once.
"""

from __future__ import annotations

import torch

from kvcache_core import AllocatorError


class FreeGroup:
    """Mixin: ``free_group_begin``/``free_group_end`` around the class's own ``free``.

    A subclass's ``free`` starts with ``if self._collect(indices): return``.
    """

    _group: list[torch.Tensor] | None = None

    def free(self, indices: torch.Tensor) -> None:
        raise NotImplementedError  # provided by the allocator using this mixin

    def _collect(self, indices: torch.Tensor) -> bool:
        """Keep ``indices`` for the end of the group; False when no group is open."""
        if self._group is None:
            return False
        self._group.append(indices)
        return True

    def free_group_begin(self) -> None:
        """Collect frees until :meth:`free_group_end`, which releases them in one call."""
        if self._group is not None:
            raise AllocatorError("free_group_begin called twice without free_group_end")
        self._group = []

    def free_group_end(self) -> None:
        group, self._group = self._group, None
        if group is None:
            raise AllocatorError("free_group_end called without free_group_begin")
        if group:
            self.free(torch.cat([g.reshape(-1).to(torch.int64) for g in group]))
