"""The Redis Cluster snapshot store (``redis+cluster://HOST:PORT``, ``rediss+cluster://`` for
TLS): a sharded Redis or Valkey (cluster mode enabled) through redis-py's ``RedisCluster``.

A sharded service spreads the 16384 hash slots over several primaries; a node asked for a key
of another node's slot answers ``MOVED`` (or ``ASK`` while a slot migrates). ``RedisCluster``
learns the slot map from the one seed node in the URL, sends each key to the node owning its
slot, and follows ``MOVED``/``ASK`` when the map changes (resharding, failover).

Everything else is the Redis store's (``RedisStore``, which this class extends), on purpose:
the same URL options and parser, values stored as the same raw bytes under the same
prefixed keys, ``SET ... PX`` for a ttl, the password from the environment only (never in the
URL, a message or a ``repr``), bounded timeouts and the same errors.

What is and is not atomic:

* ``put``, ``get``, ``delete`` and ``exists`` of one key: one command on the key's node; ``SET``
  is atomic, so a reader sees the old value, the new one or nothing, never a part of one.
* ``put_many``, ``get_many`` and ``delete_many`` span hash slots, and a cluster has no
  transaction across slots: the keys are grouped by node and sent as one pipeline per node. Each
  value is still written whole or not at all, but the batch is not atomic: when a node fails
  mid-batch the call raises, the keys of the other nodes may be stored (or deleted), and the
  failed node's keys hold their old values or nothing. ``get_many`` does not read one snapshot
  in time across nodes.

Bounded time: socket timeouts as for the Redis store (``?timeout=``, default 5 s;
``?connect_timeout=``, default 2 s), one retry of a command after a connection error (redis-py
re-reads the slot map first), and the slot map is re-read from the seed in the URL only
(``dynamic_startup_nodes=False``, not from every known node in turn), so a call to a dead or
hung cluster costs about two timeouts, never one per node. The seed should be the service's
configuration endpoint, which outlives any single node. A node that is down, a node that
answers ``CLUSTERDOWN``, or a slot map that leaves slots unserved raises
[`StoreUnavailableError`][kvcache_core.StoreUnavailableError].

redis-py is imported when a store is opened. Opening one connects to the seed to read the slot
map, so a seed that does not answer, or a server not in cluster mode, is reported at once.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from kvcache_core import StoreError, StoreSpec, StoreUnavailableError, hookimpl

from .redis_store import (
    RedisStore,
    call_deadline,
    connection_classes,
    import_redis,
    one_quick_retry,
    parse_redis_url,
    values_of,
)

__all__ = ["RedisClusterStore", "kvcache_store_specs", "open_redis_cluster"]

SCHEMES = ("redis+cluster", "rediss+cluster")
"""The plain and the TLS scheme of the cluster store."""


class RedisClusterStore(RedisStore):
    """Values under prefixed keys of a Redis (or Valkey) cluster; see the module doc for what
    is atomic.

    :param client: A connected ``redis.cluster.RedisCluster``, as ``open_redis_cluster``
        builds it.
    :param where: ``redis+cluster://host:port/0`` (the seed) without credentials, for messages.
    :param prefix: Prepended to every key.
    :param timeout: The socket timeout, for messages.
    """

    batches_are_transactions = False
    """No transaction spans hash slots: a batch is a plain pipeline, which redis-py splits into
    one per node (each value still stored whole or not at all)."""

    def __repr__(self) -> str:
        return f"RedisClusterStore({self.where})"

    def _unavailable(self, exc: BaseException, redis: Any) -> bool:
        """A node that is down, a node that reports the cluster down (``CLUSTERDOWN``), a slot
        no node serves, or a slot map that cannot be read whole: the store is unavailable, as
        one Redis server that does not answer."""
        e = redis.exceptions
        down = (e.ClusterDownError, e.SlotNotCoveredError)
        no_map = isinstance(exc, e.RedisClusterException) and (
            "cannot be connected" in str(exc) or "not covered" in str(exc)
        )
        return super()._unavailable(exc, redis) or isinstance(exc, down) or no_map

    def _means_cluster_mode(self, exc: BaseException, redis: Any) -> bool:
        """Never worth a hint here: this store is the one for a cluster."""
        return False

    def put_many(self, items: Mapping[str, bytes], *, ttl: float | None = None) -> None:
        """One ``SET`` per key (with ``PX`` for a ttl), one pipeline per node: each value atomic,
        the batch not (see the module doc)."""
        super().put_many(items, ttl=ttl)

    def get_many(self, keys: Sequence[str]) -> list[bytes | None]:
        """One ``GET`` per key, one pipeline per node, values in the order of ``keys``."""
        names = [self._key(k) for k in keys]
        if not names:
            return []

        def pipeline() -> list[bytes | None]:
            pipe = self._client.pipeline()
            for name in names:
                pipe.get(name)
            return values_of(pipe.execute(), len(names))

        return self._call(f"GET of {len(names)} keys", pipeline)

    def delete_many(self, keys: Sequence[str]) -> int:
        """One ``DEL`` per key, one pipeline per node; how many keys held a value."""
        names = [self._key(k) for k in keys]
        if not names:
            return 0

        def pipeline() -> int:
            pipe = self._client.pipeline()
            for name in names:
                pipe.delete(name)
            return sum(int(n) for n in pipe.execute())

        return self._call(f"DEL of {len(names)} keys", pipeline)


def open_redis_cluster(url: str) -> RedisClusterStore:
    """Open ``redis+cluster://[USER@]HOST[:PORT][/0][?timeout=S&connect_timeout=S&password_env=VAR&prefix=P]``
    (``rediss+cluster://`` for TLS): ``HOST:PORT`` is one seed node (or the service's
    configuration endpoint); the others are discovered from it. The options are the Redis
    store's.

    :raises StoreError: A malformed URL, a password in the URL, an unknown option, a database
        other than 0 (a cluster has no others), a seed that is not in cluster mode, or redis-py
        not installed.
    :raises StoreUnavailableError: The seed does not answer within the timeouts, or its slot
        map leaves slots unserved.
    """
    target = parse_redis_url(url, SCHEMES)
    if target.db != 0:
        raise StoreError(
            f"{target.where}: a Redis cluster has only database 0; use ?prefix= to keep "
            "deployments apart"
        )
    redis = import_redis()
    from redis.cluster import RedisCluster

    where = target.where
    plain, tls = connection_classes(redis)
    try:
        # The seed as a URL (always redis://: TLS is the connection class's business) so that
        # RedisCluster builds every node's pool from these arguments, connection class included.
        with call_deadline(target.connect_timeout + target.timeout):
            client = RedisCluster(
                url=f"redis://{target.host}:{target.port}/0",
                connection_class=tls if target.tls else plain,
                username=target.username,
                password=target.password,
                socket_timeout=target.timeout,
                socket_connect_timeout=target.connect_timeout,
                retry=one_quick_retry(redis),
                dynamic_startup_nodes=False,
                protocol=2,
            )
    except (redis.exceptions.RedisError, redis.exceptions.RedisClusterException, OSError) as exc:
        message = f"{type(exc).__name__}: {exc}"
        if "not enabled" in str(exc):
            raise StoreError(
                f"{where} is not in cluster mode ({message}): open a standalone server as "
                "redis://HOST:PORT/DB (rediss:// for TLS)"
            ) from None
        if isinstance(exc, redis.exceptions.AuthenticationError) or message.startswith(
            ("ResponseError: NOAUTH", "ResponseError: WRONGPASS")
        ):
            raise StoreError(
                f"{where}: authentication failed (opening the cluster): {message}; check the "
                "password in the environment variable the URL names"
            ) from None
        if isinstance(exc, redis.exceptions.ResponseError):
            raise StoreError(f"{where} refused the connection: {message}") from None
        raise StoreUnavailableError(
            f"{where} did not give a complete slot map (timeout "
            f"{target.connect_timeout:g} s to connect, {target.timeout:g} s per call): {message}"
        ) from None
    return RedisClusterStore(client, where=where, prefix=target.prefix, timeout=target.timeout)


@hookimpl
def kvcache_store_specs() -> list[StoreSpec]:
    """The ``redis-cluster`` store."""
    return [
        StoreSpec(
            name="redis-cluster",
            schemes=SCHEMES,
            factory=open_redis_cluster,
            store_class=RedisClusterStore,
            description="a sharded Redis or Valkey (cluster mode) via redis-py's RedisCluster",
        )
    ]
