"""The store battery on every built-in store (Redis: a real redis-server), and what each
backend promises beyond it: atomic directory writes, passwords never in URLs or messages."""

from __future__ import annotations

import os
import socket
import threading
import time
from pathlib import Path

import pytest

from kvcache_core.errors import StoreError, StoreUnavailableError
from kvcache_core.stores import discover_stores, open_store
from kvcache_core.stores.battery import STORE_CHECKS, run_store_check
from kvcache_core.stores.local_redis import LocalRedis

CHECKS = [c for c in STORE_CHECKS if c != "outage"]


@pytest.mark.parametrize("check", CHECKS)
def test_memory_store_passes(check: str) -> None:
    result = run_store_check("memory:battery", check)
    assert result.status in ("passed", "skipped"), str(result)


@pytest.mark.parametrize("check", CHECKS)
def test_directory_store_passes(check: str, tmp_path: Path) -> None:
    result = run_store_check(f"dir:{tmp_path}/store", check)
    assert result.status == "passed", str(result)


@pytest.mark.parametrize("check", CHECKS)
def test_redis_store_passes(check: str, redis_url: str) -> None:
    result = run_store_check(redis_url, check)
    assert result.status == "passed", str(result)


def test_redis_store_survives_an_outage(redis_server: LocalRedis) -> None:
    """Paused mid-put, then killed mid-put: a clear error within the timeout, and never a
    half-written value read back."""
    result = run_store_check(redis_server.url, "outage", outage=redis_server)
    assert result.status == "passed", str(result)


def test_outage_is_skipped_without_a_way_to_stop_the_server() -> None:
    result = run_store_check("memory:", "outage")
    assert result.status == "skipped" and "Outage" in result.message


def test_a_refused_connection_is_reported_at_once() -> None:
    with LocalRedis() as server:
        url = server.url
    store = open_store(url)  # the server is gone: nothing listens on the port
    began = time.monotonic()
    with pytest.raises(StoreUnavailableError, match=r"redis://127\.0\.0\.1:\d+/0 did not answer"):
        store.get("k")
    assert time.monotonic() - began < 3


def test_redis_password_comes_from_the_environment_only(
    redis_server: LocalRedis, monkeypatch: pytest.MonkeyPatch
) -> None:
    secret = "s3cret-Pa55"
    with pytest.raises(StoreError, match="carries a password") as info:
        open_store(f"redis://user:{secret}@127.0.0.1:{redis_server.port}/0")
    assert secret not in str(info.value)
    store = open_store(redis_server.url)
    store._client.config_set("requirepass", secret)  # type: ignore[attr-defined]
    with pytest.raises(StoreError) as refused:  # no password given: refused, not hung
        open_store(redis_server.url).put("k", b"v")
    monkeypatch.setenv("KVCACHE_MY_REDIS_PW", secret)
    authed = open_store(redis_server.url + "&password_env=KVCACHE_MY_REDIS_PW")
    authed.put("k", b"v")
    assert authed.get("k") == b"v"
    assert secret not in repr(authed) and secret not in str(refused.value)


@pytest.mark.parametrize(
    ("url", "words"),
    [
        ("redis://127.0.0.1:6379/zero", "database must be a number"),
        ("redis://127.0.0.1:6379/0?colour=blue", r"option\(s\) \['colour'\] unknown"),
        ("redis://127.0.0.1:6379/0?timeout=0", "timeout='0' must be seconds"),
        ("dir:", "needs a directory"),
        ("dir:/tmp/x?fsync=maybe", "fsync must be 0 or 1"),
        ("ftp://host/x", "no accepted snapshot store opens ftp:; known: dir:, memory:, redis:"),
        ("just-a-path", "a URL without a scheme"),
    ],
)
def test_bad_urls_are_refused_with_the_reason(url: str, words: str) -> None:
    with pytest.raises(StoreError, match=words):
        open_store(url)


def test_directory_readers_never_see_a_partial_file(tmp_path: Path) -> None:
    """A writer that dies mid-write leaves only a temporary file no key names; the old value
    stays readable, whole."""
    store = open_store(f"dir:{tmp_path}")
    store.put("req-1", b"old" * 1000)
    (tmp_path / ".tmp-999-dead").write_bytes(b"KVST\x01\x00\x00\x00" + b"\x00" * 8 + b"half")
    assert store.get("req-1") == b"old" * 1000
    assert sorted(p.name for p in tmp_path.iterdir()) == [".lock", ".tmp-999-dead", "k-req-1"]


def test_directory_store_refuses_a_file_it_did_not_write(tmp_path: Path) -> None:
    store = open_store(f"dir:{tmp_path}")
    store.put("a", b"value")
    (tmp_path / "k-a").write_bytes(b"garbage that is long enough")
    with pytest.raises(StoreError, match="not a kvcache store file"):
        store.get("a")
    (tmp_path / "k-a").write_bytes(b"KV")
    with pytest.raises(StoreError, match="truncated"):
        store.get("a")


def test_directory_store_keys_map_to_distinct_files(tmp_path: Path) -> None:
    store = open_store(f"dir:{tmp_path}")
    keys = ["a/b", "a%2Fb", "..", ".tmp-1", "x" * 900, "x" * 901, "ключ"]
    for i, key in enumerate(keys):
        store.put(key, bytes([i]))
    assert [store.get(k) for k in keys] == [bytes([i]) for i in range(len(keys))]
    assert all(p.parent == tmp_path for p in tmp_path.iterdir())


def test_directory_that_vanishes_is_unavailable(tmp_path: Path) -> None:
    store = open_store(f"dir:{tmp_path}/gone")
    store.put("k", b"v")
    for p in (tmp_path / "gone").iterdir():
        p.unlink()
    (tmp_path / "gone").rmdir()
    with pytest.raises(StoreUnavailableError, match="is gone"):
        store.put("k", b"v")
    with pytest.raises(StoreUnavailableError, match="is gone"):
        store.get("k")


def test_memory_store_is_shared_by_url_within_a_process() -> None:
    a, b = open_store("memory:shared-test"), open_store("memory:shared-test")
    a.put("k", b"v")
    assert b.get("k") == b"v"
    assert open_store("memory:other-test").get("k") is None


def test_memory_store_is_thread_safe_for_one_writer_many_readers() -> None:
    store = open_store("memory:threads")
    stop = threading.Event()
    seen: list[bytes | None] = []

    def read() -> None:
        while not stop.is_set():
            seen.append(store.get("k"))

    t = threading.Thread(target=read)
    t.start()
    for i in range(200):
        store.put("k", bytes([i % 256]) * 64)
    stop.set()
    t.join()
    assert all(v is None or (len(v) == 64 and len(set(v)) == 1) for v in seen)


def test_no_store_module_imports_torch() -> None:
    """Store processes (the battery's workers) must stay light."""
    import subprocess
    import sys

    code = (
        "import sys, kvcache_core.stores, kvcache_plugins.stores.redis_store, "
        "kvcache_plugins.stores.redis_cluster, kvcache_core.stores.local_redis, "
        "kvcache_plugins.stores.directory, kvcache_core.stores._workers; "
        "print('torch' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False", out.stderr


def test_discovery_lists_the_builtin_stores() -> None:
    registry = discover_stores()
    assert {"memory", "dir", "redis"} <= set(registry.names())
    assert registry.schemes()["rediss"] == "redis"
    assert os.environ.get("KVCACHE_STORES") is None or registry.skipped


def test_a_cluster_mode_server_is_named_as_such(tmp_path: Path) -> None:
    """A real redis-server in cluster mode (no slots served yet, as a node of a sharded service
    would refuse keys it does not own): the store's error says the endpoint is sharded and what
    to use instead, not only the server's bare reply."""
    from kvcache_core.stores.local_redis import redis_server_path

    if redis_server_path() is None:
        if os.environ.get("CI"):
            pytest.fail("redis-server is missing in CI: .ci/run should have installed it")
        pytest.skip("redis-server is not installed")
    # The cluster bus listens on its own port (by default the client port + 10000, which is
    # past 65535 for a high free port): give it a free one.
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        bus = s.getsockname()[1]
    with LocalRedis(args=("--cluster-enabled", "yes", "--cluster-port", str(bus))) as node:
        store = open_store(node.url)
        try:
            with pytest.raises(StoreError, match="cluster mode") as info:
                store.put("k", b"v")
            assert "CLUSTERDOWN" in str(info.value) or "ClusterDownError" in str(info.value)
            assert "primary endpoint with cluster mode disabled" in str(info.value)
            assert "open it as redis+cluster://HOST:PORT" in str(info.value)
            with pytest.raises(StoreError, match="cluster mode"):
                store.get("k")
        finally:
            store.close()


def test_a_redis_batch_is_one_transaction(redis_url: str) -> None:
    """`put_many` on one server is one `MULTI`/`EXEC`, as docs/stores.md promises (all of its
    values stored or none), seen by the server itself through `MONITOR`."""
    from urllib.parse import urlsplit

    import redis

    store = open_store(redis_url)
    where = urlsplit(redis_url)  # (the store's own query options are not redis-py's)
    watcher = redis.Redis(host=where.hostname, port=where.port, socket_timeout=5)
    with watcher.monitor() as monitor:
        store.put_many({"tx-a": b"1", "tx-b": b"2", "tx-c": b"3"})
        watcher.echo("end-of-batch")  # a command of its own marks the end of what to read
        seen: list[str] = []
        for event in monitor.listen():
            words = str(event["command"]).split()
            if words[0].upper() == "ECHO":
                break
            seen.append(words[0].upper())
    sets = [i for i, word in enumerate(seen) if word == "SET"]
    assert len(sets) == 3, seen
    assert "MULTI" in seen[: sets[0]] and "EXEC" in seen[sets[-1] :], seen
