"""The allocator against a model: a hypothesis state machine drives it with random sequences of
alloc, free, free groups, double frees, backup/restore and clear (and the paged calls when
declared) and compares every observable answer with a few lines of plain Python bookkeeping.

Why a model: an allocator's bugs live in sequences (a free queued before a backup, a double free
inside a free group, a decode continuing a page that was already freed), and no hand-written
example list covers the orders an engine produces. Hypothesis explores them and shrinks a
failure to its shortest sequence, which the finding carries as a runnable snippet.

Why the double-free rule settles on the spot: the contract lets an allocator queue frees and
check them in a batch (``PagedSlotAllocator``), so the ``DoubleFreeError`` may come from
the ``free`` itself, from ``free_group_end`` or from the next settle point. The rule calls
``available_size()`` (a documented settle point) right after, and requires exactly one error
naming the bad slot (or its page) across those calls, with every other free applied.
"""

from __future__ import annotations

import re
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import torch
from hypothesis import HealthCheck, Phase, Verbosity, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    precondition,
    rule,
    run_state_machine_as_test,
)

from ....contracts.spec import Capability
from ....errors import DoubleFreeError, InvalidSlotError, KVCacheError
from .._check import BehaviourFailure, behaviour_check
from .._context import CheckContext

__all__ = ["AllocatorModel", "ModelViolation", "allocator_machine"]

#: Small on purpose: the whole battery must stay within seconds; a fixed seed (derandomize)
#: makes the same pool fail the same way on every run and machine.
MAX_EXAMPLES = 15
STEPS = 20
#: Seconds hypothesis may spend shrinking a failure (its own default is 300). Shrinking is where
#: a failing pool's time goes; half a second finds the short sequences these bugs have. Applied
#: through hypothesis's engine constant when this hypothesis version has it.
SHRINK_SECONDS = 0.5

#: Per-side free-space methods of composite allocators, checked when present.
SIDE_SIZES = (
    "full_available_size",
    "swa_available_size",
    "logical_available_size",
    "device_available_size",
)

_PREAMBLE = [
    "from kvcache_core import DoubleFreeError, InvalidSlotError",
    "",
    "def reported(*calls):",
    "    '''The free errors raised by ``calls``, in order (slot 0 may be InvalidSlotError).'''",
    "    errors = []",
    "    for call in calls:",
    "        try:",
    "            call()",
    "        except (DoubleFreeError, InvalidSlotError) as exc:",
    "            errors.append(str(exc))",
    "    return errors",
    "",
]


class ModelViolation(AssertionError):
    """The allocator disagreed with the model (hypothesis shrinks on it)."""


@dataclass
class AllocatorModel:
    """What a correct allocator's free space is: pages held by requests, nothing else.

    ``requests`` maps a request id to its slots in order (a paged request may end inside a
    page); ``stale`` keeps the slots of freed requests, to drive the calls that must be refused.
    """

    page_size: int
    pages: int
    requests: dict[int, list[int]] = field(default_factory=dict)
    stale: list[list[int]] = field(default_factory=list)
    next_id: int = 0

    def held_pages(self) -> set[int]:
        return {s // self.page_size for slots in self.requests.values() for s in slots}

    def held_slots(self) -> set[int]:
        return {s for slots in self.requests.values() for s in slots}

    def free_pages(self) -> int:
        return self.pages - len(self.held_pages())

    def available(self) -> int:
        return self.free_pages() * self.page_size

    def add(self, slots: list[int]) -> int:
        self.next_id += 1
        self.requests[self.next_id] = slots
        return self.next_id

    def copy(self) -> tuple[dict[int, list[int]], int]:
        return {k: list(v) for k, v in self.requests.items()}, self.next_id


def _t(values: list[int]) -> str:
    return f"torch.tensor({values})"


def _set(values: set[int]) -> str:
    return "{" + ", ".join(map(str, sorted(values))) + "}" if values else "set()"


def _names(message: str, *numbers: int) -> bool:
    return any(re.search(rf"(?<![\d-]){n}(?!\d)", message) for n in numbers)


def allocator_machine(ctx: CheckContext, log: list[list[str]]) -> type[RuleBasedStateMachine]:
    """The state machine class for ``ctx``'s spec; each run appends its step log to ``log``."""
    paged = Capability.PAGED in ctx.capabilities

    class AllocatorMachine(RuleBasedStateMachine):
        def __init__(self) -> None:
            super().__init__()
            self.pool, self.allocator = ctx.build()
            self.lines: list[str] = []
            log.append(self.lines)
            page = int(self.allocator.page_size)
            self.page = page
            self.limit = int(self.pool.size) + page  # slots are below this
            start = int(self.allocator.available_size())
            self.lines.append(f"assert allocator.available_size() == {start}")
            if start <= 0 or start % page:
                self.fail(
                    f"a fresh allocator reports available_size() {start}, not a positive "
                    f"multiple of page_size {page}"
                )
            self.model = AllocatorModel(page, start // page)
            # Composite allocators (SWA, HiSparse) report each side too; every call modelled
            # here takes and returns the same pages on every side, so each side's free space
            # is its fresh value minus the held pages. A side can hide a leak from the smaller
            # side's available_size().
            self.sides: dict[str, int] = {}
            for name in SIDE_SIZES:
                method = getattr(self.allocator, name, None)
                if callable(method):
                    self.sides[name] = int(method())
            self.saved: tuple[object, tuple[dict[int, list[int]], int]] | None = None

        # -- helpers ---------------------------------------------------------------------
        def fail(self, message: str) -> None:
            self.lines.append(f"# fails here: {message}")
            raise ModelViolation(message)

        def log(self, *lines: str) -> None:
            self.lines.extend(lines)

        def expect_available(self, when: str) -> None:
            want = self.model.available()
            self.log(f"assert allocator.available_size() == {want}")
            got = self.allocator.available_size()
            if got != want:
                self.fail(
                    f"{when}: available_size() is {got}, the model has {want} "
                    f"({self.model.free_pages()} free page(s) of {self.page})"
                )
            taken = self.page * (self.model.pages - self.model.free_pages())
            for name, fresh in self.sides.items():
                self.log(f"assert allocator.{name}() == {fresh - taken}")
                side = getattr(self.allocator, name)()
                if side != fresh - taken:
                    self.fail(
                        f"{when}: {name}() is {side}, the model has {fresh - taken} "
                        f"({fresh} fresh, {taken} held)"
                    )

        def check_new(self, out: Any, count: int, call: str) -> list[int]:
            """Slots a successful allocation returned: ``count`` of them, each in range, not
            already held, none twice."""
            if not isinstance(out, torch.Tensor):
                self.fail(f"{call} returned {type(out).__name__}, not a tensor or None")
            values = [int(x) for x in out.reshape(-1).tolist()]
            held = self.model.held_slots()
            self.log(
                f"assert out is not None and len(out) == {count}",
                f"assert not set(out.tolist()) & {_set(held)}, 'handed out a slot that is in use'",
                "assert len(set(out.tolist())) == len(out), 'handed out a slot twice'",
            )
            if len(values) != count:
                self.fail(f"{call} returned {len(values)} slot(s), expected {count}")
            if len(set(values)) != len(values):
                twice = sorted({v for v in values if values.count(v) > 1})
                self.fail(f"{call} handed out slot(s) {twice} twice in one call")
            again = sorted(set(values) & held)
            if again:
                self.fail(f"{call} handed out slot(s) {again}, which are still in use")
            bad = [v for v in values if not self.page <= v < self.limit]
            if bad:
                self.fail(f"{call} handed out slot(s) {bad} outside [{self.page}, {self.limit})")
            return values

        def ensure_request(self, tokens: int | None = None) -> None:
            """Allocate one more request (``tokens`` long through alloc_extend, else one page
            through alloc) when there is room: rules that need one do not wait for luck."""
            if self.model.free_pages() < 1:
                return
            if tokens is None:
                call = f"allocator.alloc({self.page})"
                self.log(f"out = {call}")
                out = self.allocator.alloc(self.page)
                count = self.page
            else:
                call = f"allocator.alloc_extend(torch.tensor([0]), {_t([tokens])}, " + (
                    f"torch.tensor([-1]), {tokens})"
                )
                self.log(f"out = {call}")
                out = self.allocator.alloc_extend(
                    torch.tensor([0]), torch.tensor([tokens]), torch.tensor([-1]), tokens
                )
                count = tokens
            if out is None:
                self.log("assert out is not None")
                self.fail(f"{call} returned None with {self.model.available()} slot(s) free")
            self.model.add(self.check_new(out, count, call))

        def free_one(self, rid: int) -> None:
            slots = self.model.requests.pop(rid)
            self.model.stale.append(slots)
            self.log(f"allocator.free({_t(slots)})")
            self.allocator.free(torch.tensor(slots, dtype=torch.int64))

        def pick(self, data: st.DataObject, label: str) -> int | None:
            if not self.model.requests:
                return None
            return data.draw(st.sampled_from(sorted(self.model.requests)), label=label)

        # -- rules -----------------------------------------------------------------------
        @initialize()
        def start(self) -> None:
            pass

        @rule(pages=st.integers(min_value=1, max_value=5))
        def alloc(self, pages: int) -> None:
            need = pages * self.page
            call = f"allocator.alloc({need})"
            self.log(f"out = {call}")
            out = self.allocator.alloc(need)
            if pages > self.model.free_pages():
                self.log("assert out is None")
                if out is not None:
                    self.fail(
                        f"{call} returned {out.numel()} slot(s) with only "
                        f"{self.model.available()} free: expected None"
                    )
                return
            if out is None:
                self.log("assert out is not None")
                self.fail(f"{call} returned None with {self.model.available()} slot(s) free")
            slots = self.check_new(out, need, call)
            pages_got = {s // self.page for s in slots}
            if len(pages_got) != pages:
                self.fail(f"{call} returned slots of {len(pages_got)} page(s), not {pages}")
            self.model.add(slots)

        @precondition(lambda self: self.page > 1)
        @rule(pages=st.integers(min_value=0, max_value=2), extra=st.integers(1, 63))
        def alloc_part_of_a_page(self, pages: int, extra: int) -> None:
            """``alloc`` of a count that is not a whole number of pages: refused with a
            ``KVCacheError`` (nothing taken), or exactly that many slots; never fewer (an
            empty tensor for a short page), never a silent partial allocation."""
            need = pages * self.page + 1 + extra % (self.page - 1)
            call = f"allocator.alloc({need})"
            self.log(
                "try:",
                f"    out = {call}",
                "except KVCacheError:",
                "    out = 'refused'",
                f"assert out == 'refused' or out is None or len(out) == {need}, "
                f"f'alloc({need}) returned {{len(out)}} slot(s)'",
            )
            try:
                out = self.allocator.alloc(need)
            except KVCacheError:
                self.expect_available(f"after a refused {call}")
                return
            if out is None:
                if -(-need // self.page) > self.model.free_pages():
                    return
                self.fail(f"{call} returned None with {self.model.available()} slot(s) free")
            self.model.add(self.check_new(out, need, call))

        @rule(data=st.data())
        def free(self, data: st.DataObject) -> None:
            rid = self.pick(data, "request")
            if rid is None:
                return
            slots = self.model.requests.pop(rid)
            self.model.stale.append(slots)
            self.log(f"allocator.free({_t(slots)})")
            self.allocator.free(torch.tensor(slots, dtype=torch.int64))

        @rule(count=st.integers(min_value=1, max_value=3))
        def free_group(self, count: int) -> None:
            chosen = sorted(self.model.requests)[:count]
            self.log("allocator.free_group_begin()")
            self.allocator.free_group_begin()
            for rid in chosen:
                slots = self.model.requests.pop(rid)
                self.model.stale.append(slots)
                self.log(f"allocator.free({_t(slots)})")
                self.allocator.free(torch.tensor(slots, dtype=torch.int64))
            self.log("allocator.free_group_end()")
            self.allocator.free_group_end()

        @rule(data=st.data(), in_group=st.booleans())
        def double_free(self, data: st.DataObject, in_group: bool) -> None:
            """Free a slot that is already free (or slot 0), between legitimate frees."""
            held = self.model.held_pages()
            free_pages = [p for p in range(1, self.model.pages + 1) if p not in held]
            bad_page = data.draw(st.sampled_from([*free_pages[:3], 0]), label="bad page")
            bad = bad_page * self.page
            calls: list[tuple[str, Any]] = []

            def free_call(slots: list[int]) -> None:
                tensor = torch.tensor(slots, dtype=torch.int64)
                calls.append(
                    (f"lambda: allocator.free({_t(slots)})", lambda: self.allocator.free(tensor))
                )

            if in_group and not self.model.requests and self.model.free_pages() > 1:
                # A group's point is its other frees: make sure there is one to lose.
                self.log(f"out = allocator.alloc({self.page})")
                out = self.allocator.alloc(self.page)
                if out is None:
                    self.log("assert out is not None")
                    self.fail(f"allocator.alloc({self.page}) returned None with room")
                self.model.add(self.check_new(out, self.page, f"allocator.alloc({self.page})"))
                held = self.model.held_pages()
                free_pages = [p for p in free_pages if p not in held]
                if bad_page and bad_page in held:
                    bad_page = free_pages[0]
                    bad = bad_page * self.page
            legit = sorted(self.model.requests)[:2] if in_group else []
            if in_group:
                calls.append(("allocator.free_group_begin", self.allocator.free_group_begin))
            if legit:
                first = self.model.requests.pop(legit[0])
                self.model.stale.append(first)
                free_call(first)
            free_call([bad])
            if len(legit) > 1:
                second = self.model.requests.pop(legit[1])
                self.model.stale.append(second)
                free_call(second)
            if in_group:
                calls.append(("allocator.free_group_end", self.allocator.free_group_end))
            calls.append(("allocator.available_size", self.allocator.available_size))
            self.log(f"errors = reported({', '.join(c for c, _ in calls)})")
            errors: list[str] = []
            # Slot 0 is "reserved": errors.py lists it under both DoubleFreeError and
            # InvalidSlotError, so either is accepted there; an already-free slot must be a
            # DoubleFreeError.
            expected: tuple[type[Exception], ...] = (
                (DoubleFreeError, InvalidSlotError) if bad == 0 else (DoubleFreeError,)
            )
            for _, call in calls:
                try:
                    call()
                except expected as exc:
                    errors.append(str(exc))
            where = "inside a free group" if in_group else "outside a free group"
            self.log(
                "assert len(errors) == 1, errors",
                f"assert {str(bad)!r} in errors[0] or {str(bad_page)!r} in errors[0], errors",
            )
            if len(errors) != 1:
                self.fail(
                    f"double free of slot {bad} {where}: expected exactly one DoubleFreeError "
                    f"by the next available_size(), got {len(errors)}: {errors}"
                )
            if not _names(errors[0], bad, bad_page):
                self.fail(
                    f"double free of slot {bad} {where}: the DoubleFreeError does not name the "
                    f"slot (or its page {bad_page}): {errors[0]!r}"
                )
            self.expect_available(
                f"after a double free of slot {bad} {where} between legitimate frees "
                "(every other free must be applied)"
            )

        @rule()
        def available(self) -> None:
            self.expect_available("available_size()")

        @rule()
        def backup(self) -> None:
            self.log("state = allocator.backup_state()")
            self.saved = (self.allocator.backup_state(), self.model.copy())

        @rule()
        def backup_inside_group(self) -> None:
            """A backup taken while a free group collects frees, restored right away: the
            frees called before the backup are part of the state it saved."""
            self.ensure_request()
            ids = sorted(self.model.requests)[:2]
            self.log("allocator.free_group_begin()")
            self.allocator.free_group_begin()
            if ids:
                self.free_one(ids[0])
            self.log("state = allocator.backup_state()")
            self.saved = (self.allocator.backup_state(), self.model.copy())
            if len(ids) > 1:
                self.free_one(ids[1])
            self.log("allocator.free_group_end()")
            self.allocator.free_group_end()
            self.restore()

        @precondition(lambda self: self.saved is not None)
        @rule()
        def restore(self) -> None:
            assert self.saved is not None
            state, (requests, next_id) = self.saved
            self.log("allocator.restore_state(state)")
            self.allocator.restore_state(state)
            self.model.requests = {k: list(v) for k, v in requests.items()}
            self.model.next_id = max(self.model.next_id, next_id)
            self.expect_available("after restore_state (it must undo every alloc and free since)")

        @rule()
        def clear(self) -> None:
            self.log("allocator.clear()")
            self.allocator.clear()
            self.model.stale.extend(self.model.requests.values())
            self.model.requests.clear()

        # -- paged calls -------------------------------------------------------------------
        @precondition(lambda self: paged)
        @rule(data=st.data(), grow=st.lists(st.integers(1, 9), min_size=1, max_size=2))
        def alloc_extend(self, data: st.DataObject, grow: list[int]) -> None:
            P = self.page
            owners: list[int | None] = []
            for _ in grow:
                rid = self.pick(data, "request to extend") if data.draw(st.booleans()) else None
                owners.append(None if rid in owners else rid)
            prefixes = [len(self.model.requests[r]) if r is not None else 0 for r in owners]
            lasts = [self.model.requests[r][-1] if r is not None else -1 for r in owners]
            seqs = [p + g for p, g in zip(prefixes, grow, strict=True)]
            total = sum(grow)
            need = sum(-(-s // P) - -(-p // P) for p, s in zip(prefixes, seqs, strict=True))
            call = f"allocator.alloc_extend({_t(prefixes)}, {_t(seqs)}, {_t(lasts)}, {total})"
            self.log(f"out = {call}")
            out = self.allocator.alloc_extend(
                torch.tensor(prefixes), torch.tensor(seqs), torch.tensor(lasts), total
            )
            if need > self.model.free_pages():
                self.log("assert out is None")
                if out is not None:
                    self.fail(
                        f"{call} needs {need} new page(s) with "
                        f"{self.model.free_pages()} free but did not return None"
                    )
                return
            if out is None:
                self.log("assert out is not None")
                self.fail(
                    f"{call} returned None with {self.model.free_pages()} free page(s) "
                    f"for {need} new page(s)"
                )
            values = self.check_new(out, total, call)
            cursor = 0
            for rid, p, g, last in zip(owners, prefixes, grow, lasts, strict=True):
                mine = values[cursor : cursor + g]
                cursor += g
                partial = min((-p) % P, g)
                want = list(range(last + 1, last + 1 + partial))
                if mine[:partial] != want:
                    self.fail(
                        f"{call}: a request ending at slot {last} must continue its page "
                        f"with slots {want}, got {mine[:partial]}"
                    )
                fresh = mine[partial:]
                for i in range(0, len(fresh), P):
                    chunk = fresh[i : i + P]
                    start = chunk[0]
                    if start % P or chunk != list(range(start, start + len(chunk))):
                        self.fail(
                            f"{call}: new tokens {chunk} do not fill a page from its first slot"
                        )
                if rid is None:
                    self.model.add(mine)
                else:
                    self.model.requests[rid] = self.model.requests[rid] + mine

        @precondition(lambda self: paged)
        @rule(data=st.data())
        def alloc_decode(self, data: st.DataObject) -> None:
            rid = self.pick(data, "request to decode")
            if rid is None:
                return
            P = self.page
            slots = self.model.requests[rid]
            call = f"allocator.alloc_decode({_t([len(slots) + 1])}, {_t([slots[-1]])})"
            self.log(f"out = {call}")
            out = self.allocator.alloc_decode(
                torch.tensor([len(slots) + 1]), torch.tensor([slots[-1]])
            )
            fresh = len(slots) % P == 0
            if fresh and self.model.free_pages() == 0:
                self.log("assert out is None")
                if out is not None:
                    self.fail(f"{call} needs a new page with none free but did not return None")
                return
            if out is None:
                self.log("assert out is not None")
                self.fail(f"{call} returned None with {self.model.free_pages()} free page(s)")
            (value,) = self.check_new(out, 1, call)
            if not fresh and value != slots[-1] + 1:
                self.fail(
                    f"{call} must continue the request's page at slot {slots[-1] + 1}, got {value}"
                )
            if fresh and value % P:
                self.fail(f"{call} must start a new page, got slot {value}")
            self.model.requests[rid] = [*slots, value]

        @precondition(lambda self: paged)
        @rule(data=st.data())
        def decode_after_free(self, data: st.DataObject) -> None:
            """A decode whose ``last_loc`` lies in a page that is free must be refused: it
            would hand out a slot of a free page (corrupting whoever gets that page next)."""
            P = self.page
            if P == 1:
                return
            held = self.model.held_pages()
            candidates = [s for s in self.model.stale if len(s) % P and s[-1] // P not in held]
            if not candidates:  # make one: a request ending inside its page, freed
                before = set(self.model.requests)
                self.ensure_request(tokens=data.draw(st.integers(1, P - 1), label="tokens"))
                new = sorted(set(self.model.requests) - before)
                if not new:
                    return
                self.free_one(new[0])
                candidates = [self.model.stale[-1]]
            slots = data.draw(st.sampled_from(candidates), label="freed request")
            call = f"allocator.alloc_decode({_t([len(slots) + 1])}, {_t([slots[-1]])})"
            self.log(
                "try:",
                f"    out = {call}",
                "except KVCacheError:",
                "    pass",
                "else:",
                f"    raise AssertionError(f'accepted last_loc {slots[-1]} in a free page: '",
                "                         f'{out}')",
            )
            try:
                out = self.allocator.alloc_decode(
                    torch.tensor([len(slots) + 1]), torch.tensor([slots[-1]])
                )
            except KVCacheError:
                self.expect_available(f"after a refused {call}")
                return
            self.fail(
                f"{call} was accepted (returned {out!r}) although last_loc {slots[-1]} lies in "
                f"page {slots[-1] // P}, which is free: raise AllocatorError"
            )

    return AllocatorMachine


_BUDGET_LOCK = threading.Lock()


@contextmanager
def _shrink_budget(seconds: float) -> Iterator[None]:
    """Bound hypothesis's shrinking time for this run (restored afterwards)."""
    from hypothesis.internal.conjecture import engine

    old = getattr(engine, "MAX_SHRINKING_SECONDS", None)
    # Another run holding it (or a hung check left behind on its thread) keeps its budget;
    # this run then shrinks under hypothesis's own limit rather than wait.
    if old is None or not _BUDGET_LOCK.acquire(blocking=False):
        yield
        return
    engine.MAX_SHRINKING_SECONDS = seconds  # type: ignore[assignment]
    try:
        yield
    finally:
        engine.MAX_SHRINKING_SECONDS = old
        _BUDGET_LOCK.release()


@behaviour_check(
    "allocator-state-machine",
    hint=(
        "keep the allocator's free set exact: alloc never partial and None when short, no slot "
        "handed out twice, a double free rejected with one DoubleFreeError naming it while "
        "every other free is applied, backup_state covering queued frees, and paged calls "
        "refusing a last_loc in a free page"
    ),
)
def allocator_state_machine(ctx: CheckContext) -> None:
    """Random sequences of allocator calls agree with a simple model of the free space."""
    log: list[list[str]] = []
    machine = allocator_machine(ctx, log)
    config = settings(
        derandomize=True,
        database=None,
        deadline=None,
        max_examples=MAX_EXAMPLES,
        stateful_step_count=STEPS,
        suppress_health_check=list(HealthCheck),
        verbosity=Verbosity.quiet,
        report_multiple_bugs=False,
        # No "explain" phase: it re-runs variations after the shrunk failure, and the step log
        # must be the failing run's.
        phases=(Phase.explicit, Phase.reuse, Phase.generate, Phase.target, Phase.shrink),
    )
    try:
        with _shrink_budget(SHRINK_SECONDS):
            run_state_machine_as_test(machine, settings=config)
    except Exception as exc:
        # The run that raised this very failure (the final replay of the shortest one found).
        marker = f"# fails here: {exc}"
        steps = next((run for run in reversed(log) if marker in run), log[-1] if log else [])
        what = (
            str(exc) if isinstance(exc, ModelViolation) else f"raised {type(exc).__name__}: {exc}"
        )
        calls = sum(1 for line in steps if line.startswith(("out =", "allocator.", "errors =")))
        raise BehaviourFailure(
            f"after {calls} allocator call(s) (shortest sequence found): {what}",
            reproduction=ctx.reproduction(
                ["from kvcache_core import KVCacheError", *_PREAMBLE, *steps]
            ),
        ) from exc
