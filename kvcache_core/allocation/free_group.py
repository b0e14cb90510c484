"""Free groups, shared by every allocator (built-in or third-party) that batches its frees.

Eviction frees many requests in a row; between ``free_group_begin()`` and ``free_group_end()``
the allocator only collects them and releases them together at the end.

Why the end does not concatenate the calls into one ``free``: a free call is checked as a whole,
so one bad call (a double free) would reject every legitimate free of the group, and with pages
two calls naming one page would pass as two slots of the same page. ``free_group_end`` therefore
hands the calls over one by one (`FreeGroup._free_calls`), keeping their boundaries: the bad
call is rejected with one error naming it, and every other call is applied.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from ..errors import AllocatorError, KVCacheError

__all__ = ["FreeGroup", "free_calls_one_by_one"]


def free_calls_one_by_one(
    calls: list[torch.Tensor],
    free_one: Callable[[torch.Tensor], None],
    settle: Callable[[], None] | None = None,
) -> None:
    """Run ``free_one`` on every call, even after one raised, then ``settle`` (if given), then
    raise the first error: one error for the group, every good call applied."""
    first: KVCacheError | None = None
    for call in calls:
        try:
            free_one(call)
        except KVCacheError as exc:  # rejects this call only
            first = first or exc
    if settle is not None:
        try:
            settle()
        except KVCacheError:
            if first is None:
                raise
    if first is not None:
        raise first


class FreeGroup:
    """Mixin: ``free_group_begin``/``free_group_end`` around the class's own ``free``.

    A subclass's ``free`` starts with ``if self._collect(indices): return`` and the subclass
    implements `_free_calls`.
    """

    _group: list[torch.Tensor] | None = None

    def free(self, indices: torch.Tensor) -> None:
        """The allocator's own free; it starts with ``if self._collect(indices): return`` so
        that a call inside a group is collected instead."""
        raise NotImplementedError  # provided by the allocator using this mixin

    def _free_calls(self, calls: list[torch.Tensor]) -> None:
        """Free each of ``calls`` as a call of its own: all of them, even after a bad one, then
        raise one error for the bad ones."""
        raise NotImplementedError  # provided by the allocator using this mixin

    def _collect(self, indices: torch.Tensor) -> bool:
        """Keep ``indices`` for the end of the group; False when no group is open."""
        if self._group is None:
            return False
        self._group.append(indices)
        return True

    def free_group_begin(self) -> None:
        """Collect frees until `free_group_end`, which releases them in one call."""
        if self._group is not None:
            raise AllocatorError("free_group_begin called twice without free_group_end")
        self._group = []

    def _flush_group(self) -> None:
        """Free what an open group collected so far, keeping the group open.

        ``backup_state`` calls this first: a free called before the backup is part of the state
        it saves, whether or not a group was open, so ``restore_state`` never loses it and
        ``free_group_end`` never frees it a second time. A bad call raises here, after every
        good one was applied (the group stays open and empty).
        """
        if self._group:
            calls, self._group = self._group, []
            self._free_calls(calls)

    def _forget_collected(self) -> None:
        """Drop the frees an open group collected (``restore_state`` undoes every free since
        the backup, which flushed the group); an open group stays open, so the caller's
        ``free_group_end`` still pairs with its ``free_group_begin``."""
        if self._group is not None:
            self._group = []

    def free_group_end(self) -> None:
        """Free the collected calls, each as its own call (see the module doc)."""
        group, self._group = self._group, None
        if group is None:
            raise AllocatorError("free_group_end called without free_group_begin")
        if group:
            self._free_calls(group)
