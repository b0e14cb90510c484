"""Composite allocators: a primary [`PagedSlotAllocator`][kvcache_core.PagedSlotAllocator]
whose free verdicts drive a second resource (public API, re-exported by ``kvcache_core``).

Why a base class: an allocator that pairs every slot with something else (SWA: a window slot;
HiSparse: a device page; yours: whatever your pool keeps per token) has one hard part, and it
is the same every time. ``free`` must not read the ids back (that would synchronise an
accelerator), so the primary side only queues the call and checks it later, in a batch; the
second resource must meanwhile be out of reach (nothing may read or write through it) but not
yet given back (the call may turn out to be a double free, and then nothing may change). So
the resource is *held* with the call until the primary's verdict: released when the call was
applied, put back when it was rejected. Written once here, with free groups (each collected
call keeps its own verdict) and the backup token (a state carries its owner's identity, so a
state of another allocator is refused before anything changes).

A subclass provides four hooks: `hold` (take the second resource of a call out of reach and
return what it holds), `settle_held` (the verdicts), and `backup_sides`/`restore_sides`/
`clear_sides` for its own state; optionally `own_free_call` (how a call is checked and
copied). It calls the primary's public planning and room methods for its ``alloc*`` calls.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar, Generic, TypeVar

import torch

from ..errors import AllocatorError
from ..validation import check_slots
from .free_group import FreeGroup, free_calls_one_by_one
from .paged import PagedSlotAllocator

__all__ = ["CompositeAllocator", "SettledCall"]

HeldT = TypeVar("HeldT")


@dataclass(frozen=True)
class SettledCall(Generic[HeldT]):
    """One queued free call of a composite, with the primary side's verdict on it."""

    call: torch.Tensor
    """The call as queued (1-D int64, on the primary's device; the tensor `hold` got)."""
    host: torch.Tensor
    """The same ids on the host (the same tensor for a host allocator)."""
    held: HeldT
    """What `hold` returned for the call."""
    rejected: bool
    """True when the primary side refused the call (a double free, slot 0, out of range): it
    changed nothing there, so whatever it held goes back. False: the call was applied."""


class CompositeAllocator(FreeGroup, Generic[HeldT]):
    """Base of an allocator whose primary side is a
    [`PagedSlotAllocator`][kvcache_core.PagedSlotAllocator] and whose frees hold a second
    resource until the primary's verdict (see the module doc).

    It provides ``free``, ``free_group_begin``/``free_group_end``, ``check_frees``,
    ``backup_state``/``restore_state`` and ``clear``; the subclass provides the ``alloc*``
    calls and the hooks. Every state it backs up is a tuple ``(state_tag, id(self), sides)``.
    """

    state_tag: ClassVar[str] = "composite-allocator"
    """The first item of every state this class backs up (a subclass names itself)."""

    def __init__(self, primary: PagedSlotAllocator) -> None:
        self.primary = primary
        """The side whose verdicts decide every free (it owns the slots ``alloc`` returns)."""
        # Queued primary free call, by identity -> (the call, what it holds). The entry keeps
        # the call alive, so its id stays unique until the verdict.
        self._held: dict[int, tuple[torch.Tensor, HeldT]] = {}
        primary.on_settled = self._settled
        self.free_call_device: torch.device = primary.device
        """Where `own_free_call` puts its copy (the primary's device unless a subclass keeps
        its tables elsewhere)."""

    # -- hooks a subclass provides -------------------------------------------------------------
    def own_free_call(self, indices: torch.Tensor) -> torch.Tensor:
        """A checked copy of a ``free`` argument: 1-D int64 on the primary's device, never
        written again. Only dtype and rank are checked (the values are the primary's settle's
        to check, in a batch); the copy is what makes a caller's reuse of ``indices`` safe."""
        device = self.free_call_device
        if (
            type(indices) is torch.Tensor
            and indices.dtype is torch.int64
            and indices.dim() == 1
            and indices.device == device
        ):
            return indices.clone()  # the common call: nothing to convert
        primary = self.primary
        return check_slots(
            indices,
            limit=primary.size + primary.page_size,
            allow_zero=True,
            check_values=False,
            device=device,
        ).clone()

    def hold(self, call: torch.Tensor) -> HeldT:
        """Take the second resource of ``call`` out of reach now, without reading the ids back,
        and return what it holds; `settle_held` gets it back with the verdict. Ids that are
        out of range or 0 must take no part (the primary rejects the call)."""
        raise NotImplementedError

    def settle_held(self, settled: list[SettledCall[HeldT]]) -> None:
        """Release what applied calls hold; put back what rejected calls hold. Called at every
        settle of the primary, before its error (if any) is raised, with the calls of the
        batch in queue order."""
        raise NotImplementedError

    def backup_sides(self) -> tuple[object, ...]:
        """This allocator's state beyond the held calls (called after the open free group was
        flushed); `restore_sides` gets it back."""
        raise NotImplementedError

    def restore_sides(self, sides: tuple[object, ...]) -> None:
        """Bring back what `backup_sides` returned (held calls are already dropped)."""
        raise NotImplementedError

    def clear_sides(self) -> None:
        """Free everything on every side (held calls are already dropped)."""
        raise NotImplementedError

    # -- held calls ----------------------------------------------------------------------------
    def held_calls(self) -> list[tuple[torch.Tensor, HeldT]]:
        """Every queued call still waiting for its verdict, with what it holds, in queue order
        (for a subclass that must take a held resource away early, as SWA's ``free_swa``)."""
        return list(self._held.values())

    def replace_held(self, call: torch.Tensor, held: HeldT) -> None:
        """Change what a call from `held_calls` holds (what it gave up early is no longer
        released or put back at its verdict)."""
        key = id(call)
        if self._held.get(key, (None,))[0] is not call:
            raise AllocatorError("replace_held got a call that is not waiting for its verdict")
        self._held[key] = (call, held)

    def _settled(
        self, calls: list[torch.Tensor], host: list[torch.Tensor], rejected: frozenset[int]
    ) -> None:
        settled: list[SettledCall[HeldT]] = []
        pop = self._held.pop
        for number, call in enumerate(calls):
            entry = pop(id(call), None)
            if entry is not None and entry[0] is call:
                settled.append(SettledCall(call, host[number], entry[1], number in rejected))
        if settled:
            self.settle_held(settled)

    # -- freeing -------------------------------------------------------------------------------
    def free(self, indices: torch.Tensor) -> None:
        """Release ``indices`` on the primary side and, at its verdict, what they hold.

        No host sync: the call is copied, its second resource held (`hold`), and the copy
        queued on the primary, which checks it at the next settle (range, slot 0, double
        frees); a bad call raises there and changes nothing on either side."""
        if self._collect(indices):
            return
        self._free_one(indices, settle_if_due=True)

    def _free_one(self, indices: torch.Tensor, *, settle_if_due: bool) -> None:
        call = self.own_free_call(indices)
        if call.numel() == 0:
            return
        self._held[id(call)] = (call, self.hold(call))
        self.primary.queue_free(call, settle_if_due=settle_if_due)

    def _free_calls(self, calls: list[torch.Tensor]) -> None:
        """End of a free group: every call on its own, the queue settled at most once."""
        free_calls_one_by_one(
            calls,
            lambda call: self._free_one(call, settle_if_due=False),
            self.primary.settle_if_due,
        )

    def check_frees(self) -> None:
        """Check queued frees now, raising on a bad one (the primary's verdicts run first)."""
        self.primary.check_frees()

    # -- state ---------------------------------------------------------------------------------
    def backup_state(self) -> object:
        """A state that `restore_state` brings back exactly. An open free group's calls are
        freed first (they are part of the state); a bad one raises here, after the good ones
        were applied, and no state is returned (call again)."""
        self._flush_group()
        return (self.state_tag, id(self), self.backup_sides())

    def restore_state(self, state: object) -> None:
        """Undo every alloc and free since `backup_state` returned ``state``; a state of any
        other allocator is refused before anything changes."""
        if not (
            isinstance(state, tuple)
            and len(state) == 3
            and state[0] == self.state_tag
            and state[1] == id(self)
            and isinstance(state[2], tuple)
        ):
            raise AllocatorError("restore_state got a state this allocator did not back up")
        self._held.clear()
        self.restore_sides(state[2])
        self._forget_collected()

    def clear(self) -> None:
        """Free every slot on every side; an open free group is dropped."""
        self._group = None
        self._held.clear()
        self.clear_sides()
