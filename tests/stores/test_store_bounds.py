"""Bounded time and memory per store call, and the errors every store gives for the same
mistake: a server that trickles its reply cannot stretch a call past its timeout, ``max_bytes``
refuses a value before it is in memory, a TTL reclaims values nobody reads again, a refused
password says so, a lone-surrogate key gets one error everywhere."""

from __future__ import annotations

import contextlib
import time
import tracemalloc
from pathlib import Path

import pytest

from kvcache_core import (
    KVSnapshot,
    SnapshotMismatchError,
    StoreError,
    StoreUnavailableError,
    StoreValueTooLargeError,
)
from kvcache_core.stores import get_snapshot, open_store, put_snapshot
from kvcache_core.stores.local_redis import LocalRedis
from kvcache_plugins.stores.memory import MemoryStore

from .fake_servers import fake_server


def _ok(words: list[bytes]) -> bytes:
    return b"+OK\r\n"


def _trickled_get(words: list[bytes]) -> bytes:
    if words and words[0].upper() == b"GET":
        return b"$20\r\n" + b"x" * 20 + b"\r\n"
    if words and words[0].upper() == b"HELLO":  # a RESP3 client's handshake, answered right
        return b"%1\r\n$5\r\nproto\r\n:3\r\n"
    return b"+OK\r\n"


def test_a_trickling_server_cannot_stretch_a_call_past_its_timeout() -> None:
    """The reply to GET comes a byte every 0.4 s (27 bytes: 11 s); each read would end well
    within its 1 s timeout, so only a deadline for the whole call bounds it."""
    with fake_server(_trickled_get, pause=0.4, chunk=1, slow=frozenset({b"GET"})) as server:
        store = open_store(server.url + "?timeout=1")
        began = time.monotonic()
        with pytest.raises(StoreUnavailableError, match=r"did not answer GET 'k' \(timeout 1 s\)"):
            store.get("k")
        took = time.monotonic() - began
        store.close()
    assert took < 2.0, f"a call with timeout=1 took {took:.1f} s"


def test_a_server_answering_every_command_with_ok_raises_only_store_errors() -> None:
    """A proxy that answers ``HELLO`` (and everything else) with ``+OK``: redis-py's RESP3
    handshake failed with an AttributeError. The store speaks RESP2 and sends no HELLO, and
    whatever it cannot read is a StoreError."""
    with fake_server(_ok) as server:
        store = open_store(server.url + "?timeout=2")
        for call in (
            lambda: store.get("k"),
            lambda: store.exists("k"),
            lambda: store.delete("k"),
            lambda: store.get_many(["a", "b"]),
            lambda: store.get("k", max_bytes=10),
            lambda: store.put("k", b"v"),
        ):
            with contextlib.suppress(StoreError):
                call()
        store.close()
    assert not any(words[:1] == [b"HELLO"] for words in server.commands), server.commands


def test_a_refused_password_says_authentication_failed(
    redis_server: LocalRedis, monkeypatch: pytest.MonkeyPatch
) -> None:
    secret = "Right-Pa55"
    admin = open_store(redis_server.url)
    admin._client.config_set("requirepass", secret)  # type: ignore[attr-defined]
    try:
        monkeypatch.setenv("KVCACHE_REDIS_PASSWORD", "wrong-password")
        for url in (redis_server.url, redis_server.url + "&password_env=KVCACHE_NONE_SET"):
            with pytest.raises(StoreError, match="authentication failed") as info:
                open_store(url).put("k", b"v")
            assert not isinstance(info.value, StoreUnavailableError)
            assert "timeout" not in str(info.value) and "wrong-password" not in str(info.value)
    finally:
        monkeypatch.setenv("KVCACHE_REDIS_PASSWORD", secret)
        open_store(redis_server.url)._client.config_set("requirepass", "")  # type: ignore[attr-defined]


@pytest.mark.parametrize("name", ["HOME", "AWS_SECRET_ACCESS_KEY", "KVCACHE_", "kvcache_pw"])
def test_password_env_reads_only_kvcache_variables(name: str) -> None:
    with pytest.raises(StoreError, match="must be named KVCACHE_"):
        open_store(f"redis://127.0.0.1:1/0?password_env={name}")


def _traced_peak(call: object) -> int:
    tracemalloc.start()
    try:
        with contextlib.suppress(StoreValueTooLargeError, SnapshotMismatchError):
            call()  # type: ignore[operator]
        return tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


def test_redis_max_bytes_refuses_a_large_value_before_it_is_sent(redis_url: str) -> None:
    store = open_store(redis_url)
    store.put("big", b"\x02" * (64 << 20))
    store.put("small", b"fits")
    store.put("empty", b"")
    with pytest.raises(StoreValueTooLargeError, match="67108864 bytes, more than") as info:
        store.get("big", max_bytes=1 << 20)
    assert info.value.size == 64 << 20
    peak = _traced_peak(lambda: store.get("big", max_bytes=1 << 20))
    assert peak < 1 << 20, f"{peak} bytes held to refuse a 64 MiB value"
    assert store.get("small", max_bytes=4) == b"fits"
    assert store.get("empty", max_bytes=0) == b""
    assert store.get("missing", max_bytes=4) is None
    store.delete_many(["big", "small", "empty"])


def test_get_snapshot_max_bytes_is_an_oversized_mismatch_on_every_store(
    tmp_path: Path, redis_url: str
) -> None:
    import torch

    snap = KVSnapshot("mha", torch.float32, 4, {"k": torch.ones(4, 1 << 16)})
    for url in ("memory:bounds", f"dir:{tmp_path}", redis_url):
        store = open_store(url)
        size = put_snapshot(store, "s", snap)
        with pytest.raises(SnapshotMismatchError, match="oversized"):
            get_snapshot(store, "s", max_bytes=size - 1)
        back = get_snapshot(store, "s", max_bytes=size)
        assert back is not None and torch.equal(back.parts["k"], snap.parts["k"])
        store.delete("s")


def test_from_bytes_refuses_an_oversized_bytearray_without_copying_it() -> None:
    big = bytearray(64 << 20)
    peak = _traced_peak(lambda: KVSnapshot.from_bytes(big, max_bytes=1 << 20))
    assert peak < 1 << 20, f"{peak} bytes allocated to refuse a 64 MiB bytearray"


def test_a_memory_value_nobody_reads_again_is_reclaimed() -> None:
    store = MemoryStore("reclaim")
    store.put("gone", b"x" * 1000, ttl=0.05)
    store.put("kept", b"stays")
    store.put("overwritten", b"1", ttl=0.05)
    store.put("overwritten", b"2")  # its first deadline must not remove the second value
    time.sleep(0.1)
    store.put("other", b"any call reclaims")
    assert set(store._values) == {"kept", "overwritten", "other"}
    assert store.get("overwritten") == b"2"


def test_memory_max_bytes() -> None:
    store = MemoryStore("limits")
    store.put("k", b"12345")
    with pytest.raises(StoreValueTooLargeError, match="5 bytes, more than the max_bytes=4"):
        store.get("k", max_bytes=4)
    assert store.get("k", max_bytes=5) == b"12345"


def test_a_lone_surrogate_key_gets_one_error_on_every_store(tmp_path: Path, redis_url: str) -> None:
    key = "req-\udc80"
    for url in ("memory:surrogate", f"dir:{tmp_path}", redis_url):
        store = open_store(url)
        with pytest.raises(StoreError, match="character 4 of this key is a lone surrogate"):
            store.put(key, b"v")
        for call in (store.get, store.exists, store.delete):
            with pytest.raises(StoreError, match="character 4 of this key is a lone surrogate"):
                call(key)
        with pytest.raises(StoreError, match="lone surrogate"):
            store.get_many([key])
        store.close()
