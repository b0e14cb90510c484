"""Writer and reader processes for the store battery's concurrency check.

Kept apart from the battery and free of torch on purpose: each runs in a fresh ``spawn``ed
process, which imports only this module, the store plugin and redis-py, in a fraction of a
second. Values verify themselves (writer id, sequence number, a BLAKE2 digest of the rest), so
a reader can tell a whole value from a torn one without knowing who wrote it.
"""

from __future__ import annotations

import hashlib
import random
import struct
import time
from typing import Any

__all__ = [
    "expiry_reader",
    "expiry_writer",
    "make_value",
    "reader",
    "run_job",
    "verify_value",
    "writer",
]

_HEAD = struct.Struct("<II")
_DIGEST = 16


def make_value(writer_id: int, seq: int, size: int) -> bytes:
    """A self-verifying value of about ``size`` bytes."""
    body = _HEAD.pack(writer_id, seq) + random.Random(writer_id * 1_000_003 + seq).randbytes(size)
    return body + hashlib.blake2b(body, digest_size=_DIGEST).digest()


def verify_value(value: bytes) -> str | None:
    """None if ``value`` is whole, else what is wrong with it."""
    if len(value) < _HEAD.size + _DIGEST:
        return f"a value of {len(value)} bytes is too short to be whole"
    body, digest = value[:-_DIGEST], value[-_DIGEST:]
    if hashlib.blake2b(body, digest_size=_DIGEST).digest() != digest:
        writer_id, seq = _HEAD.unpack_from(body)
        return f"torn or corrupted value (writer {writer_id}, seq {seq}, {len(value)} bytes)"
    return None


def _open(target: object) -> tuple[Any, bool]:
    """The store ``target`` names (a URL: opened here, closed after) or is (shared by threads)."""
    if not isinstance(target, str):
        return target, False
    from .discovery import open_store

    return open_store(target), True


def writer(
    target: object, writer_id: int, keys: list[str], seconds: float, sizes: list[int], start: Any
) -> str | None:
    """Once every worker is ready (``start``, a barrier), overwrite the keys with values of
    varying size for ``seconds`` (and at least one round); None or an error."""
    store, owned = _open(target)
    try:
        start.wait(120)
        deadline = time.monotonic() + seconds
        seq = 0
        while seq == 0 or time.monotonic() < deadline:
            for i, key in enumerate(keys):
                size = sizes[(seq + i) % len(sizes)]
                store.put(key, make_value(writer_id, seq, size))
            seq += 1
        return None
    except Exception as exc:
        return f"writer {writer_id}: {type(exc).__name__}: {exc}"
    finally:
        if owned:
            store.close()


def reader(target: object, keys: list[str], seconds: float, start: Any) -> str | None:
    """Once every worker is ready, read the keys for ``seconds``; the first torn value read,
    an error, or None."""
    store, owned = _open(target)
    try:
        start.wait(120)
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            for value in store.get_many(keys):
                if value is not None and (problem := verify_value(value)) is not None:
                    return problem
        return None
    except Exception as exc:
        return f"reader: {type(exc).__name__}: {exc}"
    finally:
        if owned:
            store.close()


def expiry_writer(target: object, key: str, seconds: float, start: Any) -> str | None:
    """For ``seconds`` (and at least 50 rounds), put a value that expires at once, then an
    acknowledged one, and read each acknowledged one back (only this worker writes ``key``);
    the first one missing or wrong, an error, or None. The pauses let readers find the expired
    value and act on what they found after the acknowledged one is in place."""
    store, owned = _open(target)
    try:
        start.wait(120)
        deadline = time.monotonic() + seconds
        i = 0
        while i < 50 or time.monotonic() < deadline:
            store.put(key, b"expiring %d" % i, ttl=1e-6)
            time.sleep(0.0005)
            value = b"acknowledged %d" % i
            store.put(key, value)
            time.sleep(0.0005)
            got = store.get(key)
            if got != value:
                return f"acknowledged put {i} read back as {got!r:.40}"
            i += 1
        return None
    except Exception as exc:
        return f"expiry writer: {type(exc).__name__}: {exc}"
    finally:
        if owned:
            store.close()


def expiry_reader(target: object, key: str, seconds: float, start: Any) -> str | None:
    """Read ``key`` (finding expired values) for ``seconds``; an error, or None."""
    store, owned = _open(target)
    try:
        start.wait(120)
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            store.get(key)
            store.exists(key)
        return None
    except Exception as exc:
        return f"expiry reader: {type(exc).__name__}: {exc}"
    finally:
        if owned:
            store.close()


_ROLES: dict[str, Any] = {
    "writer": writer,
    "reader": reader,
    "expiry-writer": expiry_writer,
    "expiry-reader": expiry_reader,
}


def run_job(results: Any, index: int, role: str, args: tuple[Any, ...]) -> None:
    """A process's body: run the worker ``role`` names and report ``(index, problem)``."""
    fn = _ROLES[role]
    try:
        problem = fn(*args)
    except BaseException as exc:  # report anything, then let the process end
        problem = f"{role}: {type(exc).__name__}: {exc}"
    results.put((index, problem))
