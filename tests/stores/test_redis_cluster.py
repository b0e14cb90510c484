"""The Redis Cluster store on a real cluster: three ``redis-server`` masters in cluster mode on
127.0.0.1 (started once for the module), the whole store battery, keys spread over the nodes,
a slot moved under the client, and a node killed mid-batch.

Tests that take a node (or the cluster) away bring it back before they end, so the module's
cluster stays usable in any test order.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Iterator

import pytest
import redis

from kvcache_core.cli import main
from kvcache_core.errors import StoreError, StoreUnavailableError
from kvcache_core.stores import discover_stores, open_store
from kvcache_core.stores.battery import run_store_check
from kvcache_core.stores.local_redis import LocalRedis, LocalRedisCluster, redis_server_path
from kvcache_plugins.stores.redis_cluster import SCHEMES, RedisClusterStore
from kvcache_plugins.stores.redis_store import parse_redis_url

# One worker runs the module, so `make unit` starts the cluster once.
pytestmark = pytest.mark.xdist_group("redis-cluster")


@pytest.fixture(scope="module")
def cluster() -> Iterator[LocalRedisCluster]:
    if redis_server_path() is None:
        if os.environ.get("CI"):
            pytest.fail("redis-server is missing in CI: .ci/run should have installed it")
        pytest.skip("redis-server is not installed (apt-get install redis-server)")
    with LocalRedisCluster(masters=3, timeout=1.0) as c:
        yield c


def _open(cluster: LocalRedisCluster, prefix: str) -> RedisClusterStore:
    store = open_store(f"{cluster.url}&prefix={prefix}:")
    assert isinstance(store, RedisClusterStore)
    return store


def _owner(cluster: LocalRedisCluster, name: str) -> int:
    """The index of the node serving the full key ``name``, asked of the nodes themselves."""
    holders = []
    for i in range(len(cluster.nodes)):
        with cluster.node_client(i) as client:
            slot = int(client.execute_command("CLUSTER KEYSLOT", name))
            nodes = client.execute_command("CLUSTER NODES")  # parsed: address -> fields
        (me,) = (n for n in nodes.values() if "myself" in n["flags"])
        for first, *last in me["slots"]:
            if int(first) <= slot <= int(last[0] if last else first):
                holders.append(i)
    assert len(holders) == 1, holders
    return holders[0]


def test_kvcache_check_store_passes_on_a_cluster(
    cluster: LocalRedisCluster, capsys: pytest.CaptureFixture[str]
) -> None:
    """The command a user runs: every check of the battery passes (outage is skipped there)."""
    code = main(["check", "--store", cluster.url])
    out = capsys.readouterr().out
    assert code == 0, out
    assert "store-check-failed" not in out and cluster.url in out


def test_keys_land_on_every_node_and_batches_span_them(cluster: LocalRedisCluster) -> None:
    store = _open(cluster, "spread")
    items = {f"req-{i}": bytes([i]) * (i + 1) for i in range(30)}
    store.put_many(items, ttl=60)
    held = []
    for i in range(len(cluster.nodes)):
        with cluster.node_client(i) as client:
            held.append(len(client.keys("spread:req-*")))
    assert sum(held) == 30 and all(held), f"keys per node: {held}"
    with cluster.node_client(_owner(cluster, "spread:req-0")) as client:
        assert 0 < client.pttl("spread:req-0") <= 60_000  # the ttl reached the owning node
    keys = [*items, "absent"]
    assert store.get_many(keys) == [*items.values(), None]
    assert store.exists("req-7") and not store.exists("absent")
    assert store.delete_many(keys) == 30
    assert store.get_many(keys) == [None] * 31


def test_a_moved_slot_is_followed(cluster: LocalRedisCluster) -> None:
    """Move a key's slot to another node under the store's feet (as a resharding does): the
    old node answers MOVED, and the store follows it instead of failing."""
    store = _open(cluster, "moved")
    store.put("k", b"before the move")
    name = "moved:k"
    src = _owner(cluster, name)
    dst = (src + 1) % len(cluster.nodes)
    clients = [cluster.node_client(i) for i in range(len(cluster.nodes))]
    try:
        slot = int(clients[src].execute_command("CLUSTER KEYSLOT", name))
        src_id = clients[src].execute_command("CLUSTER MYID").decode()
        dst_id = clients[dst].execute_command("CLUSTER MYID").decode()
        clients[dst].execute_command("CLUSTER SETSLOT", slot, "IMPORTING", src_id)
        clients[src].execute_command("CLUSTER SETSLOT", slot, "MIGRATING", dst_id)
        clients[src].execute_command(
            "MIGRATE", "127.0.0.1", cluster.nodes[dst].port, "", 0, 5000, "KEYS", name
        )
        # Mid-migration the old node answers ASK for the key it no longer has: followed.
        with pytest.raises(redis.exceptions.AskError):
            clients[src].get(name)
        assert store.get("k") == b"before the move"
        for client in clients:
            client.execute_command("CLUSTER SETSLOT", slot, "NODE", dst_id)
        with pytest.raises(redis.exceptions.MovedError):
            clients[src].get(name)  # what the plain redis:// store would get
        assert store.get("k") == b"before the move"
        store.put("k", b"after the move")
        assert clients[dst].get(name) == b"after the move"
        assert _owner(cluster, name) == dst
    finally:
        for client in clients:
            client.close()
        store.close()


def test_a_node_killed_mid_batch_fails_alone_within_the_timeout(
    cluster: LocalRedisCluster,
) -> None:
    """One node dies while a batch of large values is being written: the batch raises
    StoreUnavailableError within the timeout bound, keys of the dead node raise the same, keys
    of the living nodes keep working, and nothing read back is ever a part of a value."""
    store = _open(cluster, "kill")
    keys = [f"r{i}" for i in range(12)]
    old = {k: b"old:" + k.encode() for k in keys}
    store.put_many(old)
    owners = {k: _owner(cluster, f"kill:{k}") for k in keys}
    victim = 2
    assert victim in owners.values() and set(owners.values()) - {victim}
    new = {k: k.encode() * ((4 << 20) // len(k)) for k in keys}  # ~4 MiB each, ~48 MiB in all
    bound = cluster.timeout * 2 + 2.0
    done: list[tuple[BaseException | None, float]] = []

    def batch() -> None:
        began = time.monotonic()
        try:
            store.put_many(new)
        except BaseException as exc:
            done.append((exc, time.monotonic() - began))
        else:
            done.append((None, time.monotonic() - began))

    thread = threading.Thread(target=batch)
    try:
        # Stopped first, so the batch is surely under way on it (its socket buffers fill up)
        # when it is killed.
        cluster.nodes[victim].pause()
        thread.start()
        time.sleep(0.3)
        cluster.nodes[victim].kill()
        thread.join(bound + 5)
        assert done, f"put_many did not return within {bound + 5:.1f} s of a node's death"
        error, took = done[0]
        assert isinstance(error, StoreUnavailableError), repr(error)
        assert took <= bound, f"put_many took {took:.1f} s (bound {bound:.1f} s)"
        for key, owner in owners.items():
            began = time.monotonic()
            if owner == victim:
                with pytest.raises(StoreUnavailableError, match="did not answer GET"):
                    store.get(key)
            else:
                assert store.get(key) in (old[key], new[key])
            assert time.monotonic() - began <= bound
    finally:
        cluster.nodes[victim].restart()
        cluster.wait_ok()
    for key in keys:  # the restarted node kept nothing; the others hold whole values
        assert store.get(key) in ((None,) if owners[key] == victim else (old[key], new[key]))
    store.delete_many(keys)
    store.close()


def test_a_hung_node_costs_one_timeout_and_the_store_recovers(
    cluster: LocalRedisCluster,
) -> None:
    """A node stops answering (SIGSTOP): a call for one of its keys raises when the timeout,
    a deadline for the whole call (its retry and the slot map's re-reading included), has
    passed; it does not retry on and on. Once the node answers again, so does the store."""
    timeout = 0.5
    url = f"redis+cluster://127.0.0.1:{cluster.nodes[0].port}?timeout={timeout}&prefix=hung:"
    store = open_store(url)
    key = next(k for k in (f"h{i}" for i in range(100)) if _owner(cluster, f"hung:{k}") == 2)
    store.put(key, b"kept")
    cluster.nodes[2].pause()
    try:
        began = time.monotonic()
        with pytest.raises(StoreUnavailableError, match=r"did not answer GET .*Timeout"):
            store.get(key)
        took = time.monotonic() - began
    finally:
        cluster.nodes[2].resume()
    # The deadline: one timeout (per read, with redis-py's three retries, it took four).
    assert timeout * 0.9 <= took <= timeout * 1.8, f"{took:.2f} s"
    assert store.get(key) == b"kept"
    store.delete(key)
    store.close()


def test_the_whole_cluster_paused_then_killed_passes_the_outage_check(
    cluster: LocalRedisCluster,
) -> None:
    result = run_store_check(cluster.url, "outage", outage=cluster)
    assert result.status == "passed", str(result)


def test_a_slot_no_node_serves_makes_the_store_unavailable(cluster: LocalRedisCluster) -> None:
    """The seed drops a slot (as a cluster that lost a shard): every call reports the store
    unavailable, not refused, and works again once the slot is served."""
    store = _open(cluster, "down")
    store.put("k", b"v")
    # Another node drops one of its slots: it answers CLUSTERDOWN for all of its keys.
    on_1 = next(k for k in (f"n{i}" for i in range(100)) if _owner(cluster, f"down:{k}") == 1)
    store.put(on_1, b"on node 1")
    with cluster.node_client(1) as node:
        slot = int(node.execute_command("CLUSTER KEYSLOT", f"down:{on_1}"))
        other = next(s for s in range(5461, 10922) if s != slot)  # node 1 serves these
        node.execute_command("CLUSTER DELSLOTS", other)
        try:
            with pytest.raises(StoreUnavailableError, match="ClusterDownError"):
                store.get(on_1)
        finally:
            node.execute_command("CLUSTER ADDSLOTS", other)
            cluster.wait_ok()
    assert store.get(on_1) == b"on node 1"
    with cluster.node_client(0) as seed:
        slot = 5  # one of node 0's slots
        seed.execute_command("CLUSTER DELSLOTS", slot)
        try:
            with pytest.raises(StoreUnavailableError, match="not covered"):
                store.get("k")
            with pytest.raises(StoreUnavailableError, match="complete slot map"):
                open_store(cluster.url)
        finally:
            seed.execute_command("CLUSTER ADDSLOTS", slot)
            cluster.wait_ok()
    assert store.get("k") == b"v"
    store.delete("k")
    store.close()


def test_the_store_is_discovered_under_both_schemes() -> None:
    registry = discover_stores()
    assert registry.schemes()["redis+cluster"] == "redis-cluster"
    assert registry.schemes()["rediss+cluster"] == "redis-cluster"
    assert parse_redis_url("rediss+cluster://h:7000", SCHEMES).tls
    assert not parse_redis_url("redis+cluster://h:7000", SCHEMES).tls


def test_a_plain_redis_url_on_a_cluster_points_at_the_cluster_scheme(
    cluster: LocalRedisCluster,
) -> None:
    plain = open_store(cluster.nodes[0].url)
    try:
        with pytest.raises(StoreError, match="cluster mode") as info:
            for i in range(20):  # some of these keys live on other nodes: MOVED
                plain.put(f"plain-{i}", b"v")
        assert "MovedError" in str(info.value) and "redis+cluster://HOST:PORT" in str(info.value)
    finally:
        plain.close()
        _open(cluster, "kvcache").delete_many([f"plain-{i}" for i in range(20)])


def test_a_cluster_url_on_a_standalone_server_is_refused() -> None:
    if redis_server_path() is None:
        pytest.skip("redis-server is not installed")
    with LocalRedis() as server:
        url = server.url.replace("redis://", "redis+cluster://")
        with pytest.raises(StoreError, match=r"is not in cluster mode.*redis://HOST:PORT/DB"):
            open_store(url)


@pytest.mark.parametrize(
    ("url", "words"),
    [
        ("redis+cluster://127.0.0.1:7000/1", "has only database 0"),
        ("redis+cluster://u:pw@127.0.0.1:7000", "carries a password"),
        ("redis+cluster://127.0.0.1:7000?colour=red", r"option\(s\) \['colour'\] unknown"),
        ("redis://127.0.0.1:7000/0?timeout=-1", "timeout='-1' must be seconds"),
    ],
)
def test_bad_cluster_urls_are_refused_before_connecting(url: str, words: str) -> None:
    with pytest.raises(StoreError, match=words) as info:
        open_store(url)
    assert "pw" not in str(info.value)


def test_an_unreachable_seed_is_unavailable_at_once(cluster: LocalRedisCluster) -> None:
    dead = LocalRedis()  # a free port nobody listens on
    began = time.monotonic()
    with pytest.raises(StoreUnavailableError, match="did not give a complete slot map"):
        open_store(f"redis+cluster://127.0.0.1:{dead.port}?connect_timeout=1")
    assert time.monotonic() - began < 3
    dead.stop()


def test_the_password_comes_from_the_environment_only(
    cluster: LocalRedisCluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    secret = "clu5ter-Secret"
    for i in range(len(cluster.nodes)):
        with cluster.node_client(i) as client:
            client.config_set("requirepass", secret)
    try:
        with pytest.raises(StoreError) as refused:
            open_store(cluster.url).put("k", b"v")
        monkeypatch.setenv("KVCACHE_MY_CLUSTER_PW", secret)
        store = open_store(cluster.url + "&password_env=KVCACHE_MY_CLUSTER_PW&prefix=pw:")
        store.put_many({f"k{i}": b"v" for i in range(10)})
        assert store.get_many([f"k{i}" for i in range(10)]) == [b"v"] * 10
        assert store.delete_many([f"k{i}" for i in range(10)]) == 10
        assert secret not in repr(store) and secret not in str(refused.value)
        store.close()
    finally:
        for node in cluster.nodes:
            with redis.Redis(host="127.0.0.1", port=node.port, password=secret) as client:
                client.config_set("requirepass", "")
