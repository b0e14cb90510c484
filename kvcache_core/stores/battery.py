"""The store battery: what every [`SnapshotStore`][kvcache_core.stores.SnapshotStore] must do,
run by ``kvcache check --store URL`` and ``pytest --kvcache-store URL`` on any store plugin.

Each check opens the store by URL, uses keys under a fresh random prefix (so it can run against
a shared server without touching other data) and deletes them afterwards. Checks:

* ``round-trip``: bytes (empty included) and a snapshot of mixed dtypes come back bit-exact;
* ``missing-key``: ``get`` is None, ``exists`` and ``delete`` are False, batched forms agree;
* ``overwrite``: a second ``put`` replaces the first, also through ``put_many``;
* ``batched``: ``put_many``/``get_many``/``delete_many`` keep order and count;
* ``bad-input``: a non-string key, an empty or lone-surrogate key, a non-bytes value, a bad ttl
  or ``max_bytes`` raise ``StoreError`` (never another type) and store nothing;
* ``ttl``: a value put with a ttl expires, one without stays (stores that declare expiry);
* ``expiry-race``: a writer alternates a value that expires at once and an acknowledged one
  while two readers (processes; threads for an in-process store) keep finding the expired
  ones; every acknowledged value reads back (a reader that removes an expired value by name
  removes the newer one);
* ``max-bytes``: ``get(key, max_bytes=N)`` of a larger value raises
  ``StoreValueTooLargeError`` without bringing the value into this process's memory, and
  ``get_snapshot(..., max_bytes=N)`` turns it into ``SnapshotMismatchError``;
* ``large``: a 32 MiB snapshot comes back bit-exact;
* ``corrupted-value``: a stored snapshot with one flipped byte, cut short, or a hostile header
  (nested past any bound) is refused with ``SnapshotMismatchError`` when read back (never
  handed on as a snapshot, never another exception);
* ``concurrent``: two writer and two reader processes (threads for an in-process store) hammer
  the same keys; no reader ever sees a torn value;
* ``outage``: the server stops answering, then dies, mid-``put``: the call raises
  ``StoreUnavailableError`` within the store's timeout (plus a margin), and what is read back
  afterwards is the old value, the new value or nothing, never a part. This one needs a way to
  stop the server ([`Outage`][kvcache_core.stores.battery.Outage]); without one it is skipped.
"""

from __future__ import annotations

import contextlib
import multiprocessing
import queue
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from ..errors import (
    SnapshotMismatchError,
    StoreError,
    StoreUnavailableError,
    StoreValueTooLargeError,
)
from ._workers import make_value, run_job, verify_value
from .discovery import StoreRegistry, discover_stores
from .redact import redact_text, redact_url
from .snapshots import get_snapshot, put_snapshot
from .spec import SnapshotStore, StoreSpec

if TYPE_CHECKING:
    from ..contracts.snapshot import KVSnapshot

__all__ = [
    "STORE_CHECKS",
    "Outage",
    "StoreCheckFailure",
    "StoreCheckResult",
    "run_store_battery",
    "same_snapshot",
    "run_store_check",
]

#: Bytes of the ``large`` check's snapshot.
LARGE_BYTES = 32 * 1024 * 1024


class Outage(Protocol):
    """How the ``outage`` check takes a store's server away and brings it back (a test's
    fixture implements it for the server it started)."""

    def pause(self) -> None:
        """Make the server stop answering, connections left open (``SIGSTOP``)."""

    def resume(self) -> None:
        """Undo ``pause``."""

    def kill(self) -> None:
        """Kill the server at once (``SIGKILL``)."""

    def restart(self) -> None:
        """Start the server again at the same address after ``kill``."""

    @property
    def timeout(self) -> float:
        """The store's own per-call timeout in seconds, as its URL sets it."""


class StoreCheckFailure(AssertionError):
    """A store check found the store wrong; the message says what it did and what it should."""


@dataclass(frozen=True)
class StoreCheckResult:
    """One check on one store: ``passed``, ``failed`` or ``skipped``, and why."""

    check: str
    """The check's name, so a failure can be rerun alone."""
    url: str
    """The store URL it ran against, its secrets replaced by ``***``
    ([`redact_url`][kvcache_core.stores.redact.redact_url])."""
    status: str
    """``passed``, ``failed`` or ``skipped``."""
    message: str = ""
    """Why it failed or was skipped (what the store did and what it should); empty on a pass."""
    seconds: float = 0.0
    """Wall time the check took, to spot a store that is correct but slow (or timing out)."""

    def __str__(self) -> str:
        """One report line: check, URL, status and the message when there is one."""
        tail = f": {self.message}" if self.message else ""
        return f"{self.check} [{self.url}] {self.status}{tail}"


class _Skip(Exception):
    pass


@dataclass
class _Context:
    url: str
    spec: StoreSpec
    store: SnapshotStore
    prefix: str
    outage: Outage | None

    def key(self, name: str) -> str:
        return f"{self.prefix}{name}"


def _expect(condition: bool, message: str) -> None:
    if not condition:
        raise StoreCheckFailure(message)


def _sample(tokens: int = 8) -> KVSnapshot:
    """A small snapshot with float, bfloat16, fp8-as-bytes, int8 and scale parts and a child."""
    import torch

    from ..contracts.snapshot import KVSnapshot

    gen = torch.Generator().manual_seed(tokens)
    raw = torch.randint(0, 256, (2, tokens, 16), dtype=torch.uint8, generator=gen)
    child = KVSnapshot(
        "mamba-state",
        torch.float32,
        1,
        {"temporal": torch.randn(2, 1, 8, generator=gen)},
        meta={"mamba_layer_ids": (1, 3)},
    )
    return KVSnapshot(
        pool_kind="battery",
        dtype=torch.bfloat16,
        token_count=tokens,
        parts={
            "k": torch.randn(2, tokens, 4, generator=gen),
            "v": torch.randn(2, tokens, 4, generator=gen).to(torch.bfloat16),
            "q8": raw.view(torch.int8),
            "fp8": raw,
            "scale": torch.rand(2, tokens, 1, generator=gen),
        },
        children={"mamba": child, "window": None},
        meta={"layer_num": 2, "fingerprint": "battery"},
    )


def _big(nbytes: int) -> KVSnapshot:
    import torch

    from ..contracts.snapshot import KVSnapshot

    tokens = nbytes // (2 * 2 * 64 * 4)
    data = torch.randn(2, 2, tokens, 64, generator=torch.Generator().manual_seed(1))
    return KVSnapshot("mha", torch.float32, tokens, {"k": data[0], "v": data[1]})


def same_snapshot(a: KVSnapshot | None, b: KVSnapshot | None) -> str | None:
    """None when ``a`` and ``b`` are bit-identical (kind, dtype, count, meta, every part's dtype,
    shape and bytes, children); else where they first differ."""
    import torch

    if a is None or b is None:
        return None if a is b else "one snapshot is missing"
    if (a.pool_kind, a.dtype, a.token_count, dict(a.meta)) != (
        b.pool_kind,
        b.dtype,
        b.token_count,
        dict(b.meta),
    ):
        return "kind, dtype, token count or meta differ"
    if list(a.parts) != list(b.parts):
        return f"parts {list(a.parts)} != {list(b.parts)}"
    for name, t in a.parts.items():
        u = b.parts[name]
        if t.dtype != u.dtype or t.shape != u.shape:
            return f"part {name!r}: {t.dtype} {list(t.shape)} != {u.dtype} {list(u.shape)}"
        x = t.contiguous().reshape(-1).view(torch.uint8)
        y = u.contiguous().reshape(-1).view(torch.uint8)
        if not torch.equal(x, y):
            return f"part {name!r}: bytes differ"
    if list(a.children) != list(b.children):
        return "children differ"
    for name, child in a.children.items():
        problem = same_snapshot(child, b.children[name])
        if problem:
            return f"child {name!r}: {problem}"
    return None


# -- the checks ----------------------------------------------------------------------------------
def _round_trip(ctx: _Context) -> None:
    for label, value in (("empty", b""), ("bytes", bytes(range(256)) * 3)):
        ctx.store.put(ctx.key(label), value)
        got = ctx.store.get(ctx.key(label))
        _expect(got == value, f"put then get of {label} bytes returned {got!r:.60}")
        _expect(ctx.store.exists(ctx.key(label)), f"exists() is False right after put ({label})")
    snap = _sample()
    put_snapshot(ctx.store, ctx.key("snap"), snap)
    back = get_snapshot(ctx.store, ctx.key("snap"))
    problem = same_snapshot(snap, back)
    _expect(problem is None, f"a snapshot came back different: {problem}")


def _missing_key(ctx: _Context) -> None:
    key = ctx.key("never-written")
    _expect(ctx.store.get(key) is None, "get() of a missing key is not None")
    _expect(not ctx.store.exists(key), "exists() of a missing key is True")
    _expect(ctx.store.delete(key) is False, "delete() of a missing key is not False")
    _expect(ctx.store.get_many([key, key]) == [None, None], "get_many() of missing keys")
    _expect(ctx.store.delete_many([key]) == 0, "delete_many() of a missing key is not 0")


def _overwrite(ctx: _Context) -> None:
    key = ctx.key("k")
    ctx.store.put(key, b"first value, longer than the second")
    ctx.store.put(key, b"second")
    _expect(ctx.store.get(key) == b"second", "a second put did not replace the first")
    ctx.store.put_many({key: b"third"})
    _expect(ctx.store.get(key) == b"third", "put_many did not replace a value")


def _batched(ctx: _Context) -> None:
    items = {ctx.key(f"b{i}"): bytes([i]) * (i + 1) for i in range(5)}
    ctx.store.put_many(items)
    names = list(items)
    keys = [*names[:2], ctx.key("absent"), *names[2:]]
    want = [*list(items.values())[:2], None, *list(items.values())[2:]]
    _expect(ctx.store.get_many(keys) == want, "get_many() lost the order or a value")
    _expect(ctx.store.get_many([]) == [], "get_many([]) is not []")
    _expect(ctx.store.delete_many(keys) == 5, "delete_many() miscounted (5 of 6 existed)")
    _expect(all(v is None for v in ctx.store.get_many(keys)), "delete_many() left a value")


def _bad_input(ctx: _Context) -> None:
    key = ctx.key("bad")
    lone = ctx.key("lone-\udc80")
    cases: list[tuple[str, Callable[[], object]]] = [
        ("put with a non-string key", lambda: ctx.store.put(7, b"x")),  # type: ignore[arg-type]
        ("put with an empty key", lambda: ctx.store.put("", b"x")),
        ("put with a lone-surrogate key", lambda: ctx.store.put(lone, b"x")),
        ("get of a lone-surrogate key", lambda: ctx.store.get(lone)),
        ("get_many with a non-string key", lambda: ctx.store.get_many([key, 7])),  # type: ignore[list-item]
        ("delete of a non-string key", lambda: ctx.store.delete(None)),  # type: ignore[arg-type]
        ("put with a str value", lambda: ctx.store.put(key, "text")),  # type: ignore[arg-type]
        ("put with a negative ttl", lambda: ctx.store.put(key, b"x", ttl=-1)),
        ("put with a NaN ttl", lambda: ctx.store.put(key, b"x", ttl=float("nan"))),
        ("get with a negative max_bytes", lambda: ctx.store.get(key, max_bytes=-1)),
        (
            "put_many with a bad item",
            lambda: ctx.store.put_many({key: b"x", ctx.key("b2"): 5}),  # type: ignore[dict-item]
        ),
    ]
    for what, call in cases:
        try:
            call()
        except StoreError:
            pass
        except Exception as exc:
            raise StoreCheckFailure(
                f"{what} raised {type(exc).__name__}: {exc}; expected StoreError"
            ) from None
        else:
            raise StoreCheckFailure(f"{what} was accepted; expected StoreError")
    _expect(ctx.store.get(key) is None, "a refused put_many stored part of its items")


def _ttl(ctx: _Context) -> None:
    if not ctx.spec.supports_ttl:
        raise _Skip("the store declares no expiry (supports_ttl=False)")
    short, kept = ctx.key("short"), ctx.key("kept")
    ctx.store.put(short, b"expires", ttl=0.3)
    ctx.store.put(kept, b"stays")
    _expect(ctx.store.get(short) == b"expires", "a value with a 0.3 s ttl is gone at once")
    deadline = time.monotonic() + 1.5
    while ctx.store.exists(short) and time.monotonic() < deadline:
        time.sleep(0.05)
    _expect(ctx.store.get(short) is None, "a value with a 0.3 s ttl is still there after 1.5 s")
    _expect(ctx.store.get(kept) == b"stays", "a value without a ttl expired")


def _expiry_race(ctx: _Context) -> None:
    if not ctx.spec.supports_ttl:
        raise _Skip("the store declares no expiry (supports_ttl=False)")
    key = ctx.key("race")
    target: object = ctx.url if ctx.spec.shared else ctx.store
    start: Any = (
        multiprocessing.get_context("spawn").Barrier(3) if ctx.spec.shared else threading.Barrier(3)
    )
    jobs: list[tuple[str, tuple[object, ...]]] = [
        ("expiry-writer", (target, key, 1.5, start)),
        ("expiry-reader", (target, key, 1.5, start)),
        ("expiry-reader", (target, key, 1.5, start)),
    ]
    problems = _run_processes(jobs) if ctx.spec.shared else _run_threads(jobs)
    found = [p for p in problems if p]
    _expect(not found, f"a reader of expired values and a writer: {'; '.join(found)}")


def _max_bytes(ctx: _Context) -> None:
    import tracemalloc

    key, limit = ctx.key("bounded"), 1 << 20
    value = make_value(0, 0, 8 << 20)
    ctx.store.put(key, value)
    tracemalloc.start()
    try:
        try:
            ctx.store.get(key, max_bytes=limit)
        except StoreValueTooLargeError:
            refused = True
        else:
            refused = False
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    _expect(
        refused, f"get(max_bytes={limit}) of an 8 MiB value did not raise StoreValueTooLargeError"
    )
    _expect(
        peak < 2 * limit,
        f"get(max_bytes={limit}) held {peak} bytes to refuse an 8 MiB value (read it whole first)",
    )
    _expect(ctx.store.get(key, max_bytes=len(value)) == value, "a value of exactly max_bytes")
    _expect(
        ctx.store.get(ctx.key("never"), max_bytes=limit) is None, "get(max_bytes) of a missing key"
    )
    snap = ctx.key("bounded-snap")
    size = put_snapshot(ctx.store, snap, _sample())
    try:
        get_snapshot(ctx.store, snap, max_bytes=size - 1)
    except SnapshotMismatchError:
        pass
    else:
        raise StoreCheckFailure("get_snapshot(max_bytes=size - 1) returned the snapshot")


def _large(ctx: _Context) -> None:
    snap = _big(LARGE_BYTES)
    size = put_snapshot(ctx.store, ctx.key("large"), snap)
    back = get_snapshot(ctx.store, ctx.key("large"))
    problem = same_snapshot(snap, back)
    _expect(problem is None, f"a {size >> 20} MiB snapshot came back different: {problem}")


def _corrupted(ctx: _Context) -> None:
    blob = bytearray(_sample().to_bytes())
    cut = bytes(blob[: len(blob) - 3])
    blob[len(blob) // 2] ^= 0x10
    nested = b"[" * 100_000 + b"]" * 100_000
    hostile = len(nested).to_bytes(8, "little") + nested
    for label, value in (
        ("a flipped byte", bytes(blob)),
        ("cut short", cut),
        ("a header nested 100,000 deep", hostile),
    ):
        ctx.store.put(ctx.key("bad"), value)
        try:
            get_snapshot(ctx.store, ctx.key("bad"))
        except SnapshotMismatchError:
            continue
        except Exception as exc:
            raise StoreCheckFailure(
                f"a stored snapshot with {label} raised {type(exc).__name__}; expected "
                "SnapshotMismatchError"
            ) from None
        raise StoreCheckFailure(f"a stored snapshot with {label} was read back as a snapshot")


def _concurrent(ctx: _Context) -> None:
    keys = [ctx.key(f"c{i}") for i in range(3)]
    sizes = [100, 300_000, 1_000_000]
    # Processes open the store by URL; threads share this one (an in-process store).
    target: object = ctx.url if ctx.spec.shared else ctx.store
    if ctx.spec.shared:
        mp = multiprocessing.get_context("spawn")
        start: Any = mp.Barrier(4)
    else:
        start = threading.Barrier(4)
    # Everyone starts together (after the processes' imports), then runs for 0.6 s.
    jobs: list[tuple[str, tuple[object, ...]]] = [
        ("writer", (target, w, keys, 0.6, sizes, start)) for w in (1, 2)
    ] + [("reader", (target, keys, 0.6, start)) for _ in range(2)]
    problems = _run_processes(jobs) if ctx.spec.shared else _run_threads(jobs)
    found = [p for p in problems if p]
    _expect(not found, f"concurrent writers and readers: {'; '.join(found)}")
    for value in ctx.store.get_many(keys):
        _expect(value is not None, "a key written by both writers is missing")
        assert value is not None
        problem = verify_value(value)
        _expect(problem is None, f"after the writers finished: {problem}")


def _run_processes(jobs: list[tuple[str, tuple[object, ...]]]) -> list[str | None]:
    """Each job in its own ``spawn``ed process (a fresh interpreter: no inherited locks)."""
    mp = multiprocessing.get_context("spawn")
    results = mp.Queue()
    procs = [
        mp.Process(target=run_job, args=(results, i, role, args), daemon=True)
        for i, (role, args) in enumerate(jobs)
    ]
    for p in procs:
        p.start()
    problems: list[str | None] = [f"{role} process reported nothing" for role, _ in jobs]
    deadline = time.monotonic() + 120
    got = 0
    try:
        while got < len(jobs) and time.monotonic() < deadline:
            try:
                index, problem = results.get(timeout=0.2)
            except queue.Empty:
                dead = [p for p in procs if p.exitcode not in (None, 0)]
                if dead:
                    problems[procs.index(dead[0])] = f"a process died (exit {dead[0].exitcode})"
                    break
                continue
            problems[index] = problem
            got += 1
    finally:
        for p in procs:
            p.join(5)
            if p.is_alive():
                p.kill()
                p.join()
    return problems


def _run_threads(jobs: list[tuple[str, tuple[object, ...]]]) -> list[str | None]:
    """An in-process store is shared by threads, not by processes."""
    results: queue.Queue[tuple[int, str | None]] = queue.Queue()
    threads = [
        threading.Thread(target=run_job, args=(results, i, role, args))
        for i, (role, args) in enumerate(jobs)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    problems: list[str | None] = ["a thread reported nothing"] * len(jobs)
    while not results.empty():
        index, problem = results.get()
        problems[index] = problem
    return problems


def _timed_put(ctx: _Context, key: str, value: bytes) -> tuple[BaseException | None, float]:
    began = time.monotonic()
    try:
        ctx.store.put(key, value)
    except BaseException as exc:
        return exc, time.monotonic() - began
    return None, time.monotonic() - began


def _outage(ctx: _Context) -> None:
    outage = ctx.outage
    if outage is None:
        raise _Skip("no way to stop this store's server was given (an Outage)")
    key = ctx.key("outage")
    old = make_value(0, 0, 1000)
    new = make_value(0, 1, 24 * 1024 * 1024)
    ctx.store.put(key, old)
    bound = outage.timeout * 2 + 2.0
    outage.pause()
    try:
        error, took = _timed_put(ctx, key, new)
    finally:
        outage.resume()
    _expect(
        isinstance(error, StoreUnavailableError),
        f"a put to a server that stopped answering raised {error!r}, expected "
        "StoreUnavailableError",
    )
    _expect(took <= bound, f"a put to a hung server took {took:.1f} s (bound {bound:.1f} s)")
    _check_whole(ctx, key, (old, new))

    # Now kill it while a large put is under way.
    done: list[tuple[BaseException | None, float]] = []
    thread = threading.Thread(target=lambda: done.append(_timed_put(ctx, key, new)))
    thread.start()
    time.sleep(0.01)
    outage.kill()
    thread.join(bound + 5)
    _expect(bool(done), f"a put to a killed server did not return within {bound + 5:.1f} s")
    error, took = done[0]
    if error is not None:  # the put may also have finished before the kill
        _expect(
            isinstance(error, StoreUnavailableError),
            f"a put to a killed server raised {error!r}, expected StoreUnavailableError",
        )
    try:
        ctx.store.get(key)
    except StoreUnavailableError:
        pass
    else:
        raise StoreCheckFailure("get() from a killed server did not raise StoreUnavailableError")
    outage.restart()
    _check_whole(ctx, key, (old, new))


def _check_whole(ctx: _Context, key: str, allowed: Sequence[bytes]) -> None:
    deadline = time.monotonic() + 10
    while True:
        try:
            value = ctx.store.get(key)
            break
        except StoreUnavailableError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.1)
    _expect(
        value is None or value in allowed,
        "after a failed put the key holds neither the old value, the new one nor nothing "
        f"({verify_value(value) if value is not None else ''})",
    )


STORE_CHECKS: dict[str, Callable[[_Context], None]] = {
    "round-trip": _round_trip,
    "missing-key": _missing_key,
    "overwrite": _overwrite,
    "batched": _batched,
    "bad-input": _bad_input,
    "ttl": _ttl,
    "expiry-race": _expiry_race,
    "max-bytes": _max_bytes,
    "large": _large,
    "corrupted-value": _corrupted,
    "concurrent": _concurrent,
    "outage": _outage,
}
"""Every check of the store battery, by name, in the order they run."""


@contextlib.contextmanager
def _opened(url: str, registry: StoreRegistry | None) -> Iterator[tuple[SnapshotStore, StoreSpec]]:
    registry = registry or discover_stores()
    spec = registry.spec_for(url)
    store = registry.open(url)
    try:
        yield store, spec
    finally:
        with contextlib.suppress(Exception):
            store.close()


def run_store_check(
    url: str,
    check: str,
    *,
    registry: StoreRegistry | None = None,
    outage: Outage | None = None,
) -> StoreCheckResult:
    """Run one check of the battery on the store at ``url``; never raises for a store's fault.

    :param registry: Where to find the store's plugin (default: ``discover_stores()``).
    :param outage: How to stop the server, for the ``outage`` check.
    :raises KeyError: ``check`` is not a name in ``STORE_CHECKS``.
    """
    fn = STORE_CHECKS[check]
    began = time.perf_counter()

    def result(status: str, message: str = "") -> StoreCheckResult:
        # The URL becomes a report's target, message and hint: never with a secret in it.
        return StoreCheckResult(
            check,
            redact_url(url),
            status,
            redact_text(message, url),
            round(time.perf_counter() - began, 3),
        )

    try:
        with _opened(url, registry) as (store, spec):
            ctx = _Context(url, spec, store, f"kvcache-battery:{uuid.uuid4().hex[:12]}:", outage)
            try:
                fn(ctx)
            finally:
                if check != "outage":
                    with contextlib.suppress(Exception):
                        store.delete_many([ctx.key(n) for n in _ALL_KEYS])
    except _Skip as exc:
        return result("skipped", str(exc))
    except StoreCheckFailure as exc:
        return result("failed", str(exc))
    except Exception as exc:
        return result("failed", f"{type(exc).__name__}: {exc}")
    return result("passed")


_ALL_KEYS = (
    "empty",
    "bytes",
    "snap",
    "k",
    *(f"b{i}" for i in range(5)),
    "short",
    "kept",
    "large",
    "bad",
    "race",
    "bounded",
    "bounded-snap",
    *(f"c{i}" for i in range(3)),
)


def run_store_battery(
    url: str,
    *,
    checks: Sequence[str] | None = None,
    registry: StoreRegistry | None = None,
    outage: Outage | None = None,
) -> list[StoreCheckResult]:
    """Run every check (or ``checks``) on the store at ``url``, in order."""
    return [
        run_store_check(url, name, registry=registry, outage=outage)
        for name in (checks or list(STORE_CHECKS))
    ]
