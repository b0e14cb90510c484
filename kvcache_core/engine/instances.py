"""Two engine instances and a snapshot store: retract on one, resume on the other.

Instance A serves every request within a token budget, as the single-instance demo does; when
memory runs out it retracts a request (``get_cpu_copy``), writes the snapshot's wire form to
the store and hands the request (its tokens so far and the store key, never the tensors) to
instance B. B reads the snapshot back, checks it, loads it into its own pool with
``load_cpu_copy`` and decodes the request to the end. The tokens must equal a single instance's
with ample memory, request by request.

Failure semantics, the point of the exercise: when A cannot store a snapshot (the store is
down) the request stays retracted on A, resumable where it is, and A resumes it itself; when B
cannot fetch, decode or load a snapshot (the store died after the put, the value is corrupted
or hostile, its layout does not fit B's pool) that request fails alone, its reason in the
report, the slots it was given released, and B goes on with the others. No request ever
continues from a snapshot that was not checked whole.

The instances run as two threads for ``memory:`` (an in-process store) and as two processes
otherwise (``dir:``, ``redis://``), exchanging only small messages over a queue.
"""

from __future__ import annotations

import contextlib
import multiprocessing
import queue
import threading
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from functools import partial
from typing import Any

import torch

from kvcache_core import (
    KVPool,
    Registry,
    SnapshotStore,
    StoreError,
    TokenAllocator,
    get_snapshot,
    open_store,
    put_snapshot,
)

from .model import TinyModel
from .runner import DemoSettings, choose_model, pool_config, single_thread
from .scheduler import EngineError, Request, Scheduler, make_requests

__all__ = [
    "Handoff",
    "InstanceReport",
    "ResumingScheduler",
    "RetractingScheduler",
    "TransferStats",
    "run_across_instances",
]

_END = "end"


@dataclass(frozen=True)
class Handoff:
    """What A sends B for one moved request: where it stands and the store key of its KV."""

    rid: int
    prompt: list[int]
    max_new: int
    output: list[int]
    tokens: int
    window_released: int
    key: str
    nbytes: int


@dataclass
class TransferStats:
    """What crossing instances cost one pool's run."""

    moved: int = 0
    bytes_moved: int = 0
    put_seconds: float = 0.0
    get_seconds: float = 0.0
    kept_local: int = 0  # puts that failed: the request stayed resumable on A
    failed: dict[int, str] = field(default_factory=dict)  # rid -> why B could not resume it

    @property
    def put_mb_per_s(self) -> float | None:
        """Snapshot -> bytes -> store, in MB/s."""
        return _rate(self.bytes_moved, self.put_seconds)

    @property
    def get_mb_per_s(self) -> float | None:
        """Store -> bytes -> checked snapshot, in MB/s."""
        return _rate(self.bytes_moved, self.get_seconds)


def _rate(nbytes: int, seconds: float) -> float | None:
    return round(nbytes / seconds / 1e6, 1) if nbytes and seconds > 0 else None


class RetractingScheduler(Scheduler):
    """Instance A: a retraction writes the snapshot to the store and hands the request on."""

    def __init__(
        self,
        *args: Any,
        store: SnapshotStore,
        key_prefix: str,
        send: Callable[[Handoff], None],
        after_put: Callable[[int], None] | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(*args, **kwargs)
        self.store, self.key_prefix, self.send, self.after_put = store, key_prefix, send, after_put
        self.transfer = TransferStats()

    def _retract(self, req: Request) -> None:
        super()._retract(req)  # snapshot on the host, slots freed, queued for a local resume
        assert req.snapshot is not None
        key = f"{self.key_prefix}{req.rid}"
        began = time.perf_counter()
        try:
            nbytes = put_snapshot(self.store, key, req.snapshot)
        except StoreError:
            self.transfer.kept_local += 1  # stays resumable here, from its host snapshot
            return
        self.transfer.put_seconds += time.perf_counter() - began
        self.retracted.remove(req)
        self.transfer.moved += 1
        self.transfer.bytes_moved += nbytes
        if self.after_put is not None:  # before B hears of it: a test may spoil the value
            self.after_put(self.transfer.moved)
        self.send(
            Handoff(
                req.rid,
                req.prompt,
                req.max_new,
                list(req.output),
                req.slots.numel(),
                req.window_released,
                key,
                nbytes,
            )
        )
        req.snapshot = None


@dataclass
class _Moved(Request):
    key: str = ""


class ResumingScheduler(Scheduler):
    """Instance B: takes handed-off requests, reads their snapshots back and finishes them."""

    def __init__(
        self,
        *args: Any,
        store: SnapshotStore,
        max_snapshot_bytes: int | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(*args, **kwargs)
        self.store = store
        self.max_snapshot_bytes = max_snapshot_bytes
        """Refuse (fail alone) a stored snapshot larger than this; None: no limit."""
        self.transfer = TransferStats()
        self.ended = False  # A said it is done with this pool

    def accept(self, handoff: Handoff) -> None:
        """Queue a moved request for resume (its snapshot is read when it fits)."""
        placeholder = torch.zeros(handoff.tokens, dtype=torch.int64)  # only its count is used
        req = _Moved(
            handoff.rid,
            handoff.prompt,
            handoff.max_new,
            list(handoff.output),
            slots=placeholder,
            window_released=handoff.window_released,
            key=handoff.key,
        )
        self.retracted.append(req)
        self.transfer.moved += 1

    def _resume(self, req: Request) -> bool:
        """Fetch, decode and load a moved request's snapshot. A failure of any of the three
        fails that request alone (its reason in ``transfer.failed``, the slots it was given
        released) and the run goes on; returning True drops it from the queue."""
        if not (isinstance(req, _Moved) and req.snapshot is None and req.key):
            return super()._resume(req)
        began = time.perf_counter()
        try:
            snapshot = get_snapshot(self.store, req.key, max_bytes=self.max_snapshot_bytes)
            if snapshot is None:
                raise StoreError(f"snapshot {req.key!r} is not in the store")
        except Exception as exc:  # fetch or decode: a store error, a bad blob, anything else
            self._fail(req, "fetching", exc)
            return True
        self.transfer.get_seconds += time.perf_counter() - began
        req.snapshot, placeholder = snapshot, req.slots
        try:
            resumed = super()._resume(req)
        except Exception as exc:  # the pool refused it (a layout that does not fit, ...)
            if req in self.running:
                self.running.remove(req)
            if req.slots is not placeholder:
                self._release(req)  # the slots (and Mamba slot) this resume was given
            req.snapshot = None
            self._fail(req, "loading", exc)
            return True
        if resumed:
            self.transfer.bytes_moved += snapshot.nbytes
            with contextlib.suppress(StoreError):  # read, checked and loaded: B's now
                self.store.delete(req.key)
            req.key = ""
        else:  # no room yet: read it again when it fits (nothing was loaded)
            req.snapshot = None
        return resumed

    def _fail(self, req: Request, step: str, exc: BaseException) -> None:
        """Record why ``req`` cannot resume here; it is dropped, never resumed half-way."""
        self.transfer.failed[req.rid] = f"{step} the snapshot: {type(exc).__name__}: {exc}"

    def serve(self, receive: Callable[[float], object]) -> dict[int, list[int]]:
        """Decode what arrives until A says it is done and nothing is left; the tokens."""
        while True:
            idle = not (self.waiting or self.retracted or self.running)
            if idle and self.ended:
                break
            message = receive(0.2 if idle else 0.0)
            while message is not None:
                if message == _END:
                    # Stop reading here: A may already be sending the next pool's handoffs on
                    # the same queue, and those belong to the next ResumingScheduler.
                    self.ended = True
                    break
                assert isinstance(message, Handoff)
                self.accept(message)
                message = receive(0.0)
            if not (self.retracted or self.running):
                continue
            self.stats.steps += 1
            prefilled = self._admit()
            if not self.running:
                if self.retracted:
                    head = self.retracted[0]
                    raise EngineError(f"request {head.rid} does not fit in an empty pool")
                continue
            self._decode([r for r in self.running if r not in prefilled])
            self._finish()
            self._note_peak()
        return {r.rid: r.output for r in sorted(self.finished, key=lambda r: r.rid)}


@dataclass
class InstanceReport:
    """One pool across two instances: the verdict against a single ample-memory instance."""

    pool: str
    status: str  # identical, differ, failed-requests, nothing-moved, error, skipped
    reason: str | None = None
    moved: int = 0
    bytes_moved: int = 0
    kept_local: int = 0
    put_mb_per_s: float | None = None
    get_mb_per_s: float | None = None
    finished_on_a: int = 0
    finished_on_b: int = 0
    differing_requests: list[int] = field(default_factory=list)
    failed_requests: dict[int, str] = field(default_factory=dict)


def _build(registry: Registry, name: str, settings: DemoSettings) -> tuple[str, Any, Any, Any]:
    spec = registry.spec(name)
    kind, why = choose_model(spec.capabilities)
    if kind is None:
        raise _Skip(why)
    config = pool_config(kind, settings.shape, settings.budget, settings.page_size, 8)
    pool, allocator = registry.create(name, config)
    assert isinstance(pool, KVPool) and isinstance(allocator, TokenAllocator)
    return kind, pool, allocator, TinyModel(kind, settings.shape, settings.seed)


class _Skip(Exception):
    pass


def _reference(registry: Registry, name: str, settings: DemoSettings) -> dict[int, list[int]]:
    """The tokens of one instance with ample memory (no retraction at all)."""
    requests = make_requests(settings.requests, settings.seed, settings.shape.vocab)
    page = settings.page_size
    # Every request at full length at once, a spare page each: no retraction can happen.
    ample = sum(-(-(len(r.prompt) + r.max_new) // page) * page + page for r in requests)
    kind, _, _, model = _build(registry, name, settings)
    config = pool_config(kind, settings.shape, ample, settings.page_size, settings.max_running)
    pool, allocator = registry.create(name, config)
    return Scheduler(model, pool, allocator, max_running=settings.max_running).run(requests)


def _instance(
    role: str,
    names: Sequence[str],
    settings: DemoSettings,
    url: str,
    run_id: str,
    inbox: Any,
    outbox: Any,
    results: Any,
    registry: Registry | None = None,
    after_put: Callable[[int], None] | None = None,
) -> None:
    """One instance's life: every pool in turn. A sends handoffs then ``end`` per pool on that
    pool's queue (``inbox``/``outbox`` map pool names to queues); B serves until ``end``. Each
    reports ``(role, pool, tokens, stats, error)`` per pool."""
    from kvcache_core import discover

    with single_thread():
        registry = registry or discover()
        store = open_store(url)
        try:
            for name in names:
                tokens: dict[int, list[int]] = {}
                stats = TransferStats()
                error = None
                b: ResumingScheduler | None = None
                b_done = False
                try:
                    _, pool, allocator, model = _build(registry, name, settings)
                    common = {"max_running": settings.max_running}
                    if role == "A":
                        a = RetractingScheduler(
                            model,
                            pool,
                            allocator,
                            store=store,
                            key_prefix=f"kvcache-demo:{run_id}:{name}:",
                            send=outbox[name].put,
                            after_put=after_put,
                            **common,
                        )
                        stats = a.transfer
                        tokens = a.run(
                            make_requests(settings.requests, settings.seed, settings.shape.vocab)
                        )
                    else:
                        b = ResumingScheduler(model, pool, allocator, store=store, **common)
                        stats = b.transfer
                        tokens = b.serve(partial(_receive, inbox[name]))
                        b_done = True
                except _Skip as exc:
                    error = f"skipped: {exc}"
                except Exception as exc:  # one pool's failure is that pool's report
                    error = f"{type(exc).__name__}: {exc}"
                finally:
                    if role == "A":
                        outbox[name].put(_END)
                    elif not b_done and (b is None or not b.ended):
                        _drain(inbox[name])  # skip the rest of this pool's messages
                results.put((role, name, tokens, stats, error))
        finally:
            store.close()


def _receive(inbox: Any, timeout: float) -> object:
    try:
        return inbox.get(timeout=timeout) if timeout > 0 else inbox.get_nowait()
    except queue.Empty:
        return None


def _drain(inbox: Any) -> None:
    """After B failed a pool: skip A's remaining messages for it, up to its ``end``."""
    while inbox.get(timeout=120) != _END:
        pass


def run_across_instances(
    registry: Registry,
    names: Sequence[str],
    settings: DemoSettings,
    url: str,
    *,
    after_put: Callable[[int], None] | None = None,
    threads: bool | None = None,
) -> list[InstanceReport]:
    """Run every pool in ``names`` on instances A and B sharing the store at ``url``, and
    compare each request's tokens with one ample-memory instance (run here first).

    ``memory:`` runs the instances as threads (the store is in-process); any other URL as two
    ``spawn``ed processes, which discover the installed pools themselves. ``after_put`` (called
    on A with the count of snapshots moved so far; threads only) lets a test stop the store
    mid-run. ``threads`` forces one mode or the other (default: threads for ``memory:`` only).
    """
    if threads is None:
        threads = url.split(":", 1)[0] == "memory"
    run_id = uuid.uuid4().hex[:8]
    references: dict[str, dict[int, list[int]] | str] = {}
    with single_thread():
        for name in names:
            try:
                references[name] = _reference(registry, name, settings)
            except _Skip as exc:
                references[name] = f"skipped: {exc}"
            except Exception as exc:
                references[name] = f"{type(exc).__name__}: {exc}"
    runnable = [n for n in names if not isinstance(references[n], str)]
    outcomes = _run_pair(registry, runnable, settings, url, run_id, threads, after_put)
    reports = []
    for name in names:
        ref = references[name]
        if isinstance(ref, str):
            status = "skipped" if ref.startswith("skipped") else "error"
            reports.append(InstanceReport(name, status, reason=ref.removeprefix("skipped: ")))
            continue
        reports.append(_verdict(name, ref, outcomes.get(name, {})))
    return reports


def _run_pair(
    registry: Registry,
    names: Sequence[str],
    settings: DemoSettings,
    url: str,
    run_id: str,
    threads: bool,
    after_put: Callable[[int], None] | None,
) -> dict[str, dict[str, tuple[dict[int, list[int]], TransferStats, str | None]]]:
    if not names:
        return {}
    if threads:
        # One queue per pool: a pool's handoffs and its ``end`` can never reach the other
        # instance while it still serves another pool, whichever instance runs ahead.
        handoffs: Any = {name: queue.Queue() for name in names}
        results: Any = queue.Queue()
        workers: list[Any] = [
            threading.Thread(
                target=_instance,
                args=(role, names, settings, url, run_id, handoffs, handoffs, results),
                kwargs={"registry": registry, "after_put": after_put if role == "A" else None},
                daemon=True,
            )
            for role in ("A", "B")
        ]
    else:
        mp = multiprocessing.get_context("spawn")
        handoffs, results = {name: mp.Queue() for name in names}, mp.Queue()
        workers = [
            mp.Process(
                target=_instance,
                args=(role, names, settings, url, run_id, handoffs, handoffs, results),
                daemon=True,
            )
            for role in ("A", "B")
        ]
    for w in workers:
        w.start()
    outcomes: dict[str, dict[str, tuple[dict[int, list[int]], TransferStats, str | None]]] = {}
    try:
        for _ in range(2 * len(names)):
            role, name, tokens, stats, error = _result(results, workers)
            outcomes.setdefault(name, {})[role] = (tokens, stats, error)
    finally:
        for w in workers:
            w.join(10)
            if isinstance(w, multiprocessing.process.BaseProcess) and w.is_alive():
                w.kill()
    return outcomes


def _result(results: Any, workers: list[Any]) -> tuple[Any, ...]:
    deadline = time.monotonic() + 600
    while time.monotonic() < deadline:
        try:
            return tuple(results.get(timeout=0.5))
        except queue.Empty:
            crashed = [w for w in workers if getattr(w, "exitcode", None) not in (None, 0)]
            if crashed or not any(w.is_alive() for w in workers):
                try:
                    return tuple(results.get(timeout=2))
                except queue.Empty:
                    raise EngineError("an instance ended without reporting") from None
    raise EngineError("the instances did not finish within 600 s")


def _verdict(
    name: str,
    reference: dict[int, list[int]],
    outcome: dict[str, tuple[dict[int, list[int]], TransferStats, str | None]],
) -> InstanceReport:
    a_tokens, a_stats, a_error = outcome.get(
        "A", ({}, TransferStats(), "instance A reported nothing")
    )
    b_tokens, b_stats, b_error = outcome.get(
        "B", ({}, TransferStats(), "instance B reported nothing")
    )
    report = InstanceReport(
        name,
        "error",
        moved=a_stats.moved,
        bytes_moved=a_stats.bytes_moved,
        kept_local=a_stats.kept_local,
        put_mb_per_s=a_stats.put_mb_per_s,
        get_mb_per_s=b_stats.get_mb_per_s,
        finished_on_a=len(a_tokens),
        finished_on_b=len(b_tokens),
        failed_requests=dict(b_stats.failed),
    )
    if a_error or b_error:
        report.reason = "; ".join(
            f"instance {r}: {e}" for r, e in (("A", a_error), ("B", b_error)) if e
        )
        report.status = "skipped" if (a_error or "").startswith("skipped") else "error"
        return report
    combined = {**a_tokens, **b_tokens}
    report.differing_requests = sorted(r for r in combined if combined[r] != reference.get(r))
    missing = sorted(set(reference) - set(combined) - set(report.failed_requests))
    if report.differing_requests or missing:
        report.status = "differ"
        if missing:
            report.reason = f"requests {missing} never finished"
    elif report.failed_requests:
        report.status = "failed-requests"
    elif report.moved == 0:  # the tokens agree, but nothing crossed the store: not a pass
        report.status = "nothing-moved"
        report.reason = (
            f"no snapshot went through the store: all {report.kept_local} puts failed and A "
            "resumed those requests itself"
            if report.kept_local
            else "no request was retracted, so none moved (lower --budget)"
        )
    else:
        report.status = "identical"
    return report
