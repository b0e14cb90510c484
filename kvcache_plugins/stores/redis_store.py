"""The Redis snapshot store (``redis://HOST:PORT/DB``, ``rediss://`` for TLS): Redis or Valkey
through redis-py, so that engine instances on different machines share snapshots.

Why these choices:

* The password comes from the environment (``$KVCACHE_REDIS_PASSWORD``, or the variable named
  by ``?password_env=NAME``, which must start with ``KVCACHE_`` so a URL cannot make the store
  send some other secret of the environment to the host it names), never from the URL: a URL
  ends up in logs, process lists and reports, so one that carries a password is refused, and
  neither ``repr`` nor any error message ever contains the password. A server refusing the
  password is reported as such ("authentication failed"), not as a timeout.
* Every call is bounded as a whole: ``?timeout=`` (default 5 s) is a deadline for the call's
  every socket read and write, its one retry and any connecting it does (a server trickling
  its reply a byte at a time cannot stretch it), and ``?connect_timeout=`` (default 2 s) bounds
  a connect within it. One immediate retry only for a dropped connection (a server restart),
  none for a timeout. A server that goes away raises
  [`StoreUnavailableError`][kvcache_core.StoreUnavailableError] within the timeout instead of
  hanging the engine.
* ``get(key, max_bytes=N)`` asks the server for the value's length and the value in one
  server-side script (``EVAL`` of ``STRLEN`` then ``GET``), so a value larger than ``N`` is
  refused without a byte of it crossing the network.
* RESP2 (``protocol=2``): every server and proxy speaks it, and no ``HELLO`` handshake is sent
  (a proxy answering ``HELLO`` with ``+OK`` made redis-py fail with an ``AttributeError``).
* ``SET`` is atomic in Redis: a reader gets the old value, the new one or nothing, never part
  of one, even when the connection drops mid-write; ``put_many`` is one ``MULTI``/``EXEC``.
* Keys are prefixed (``?prefix=``, default ``kvcache:``) so the store can share a database.

redis-py is imported when a store is opened, not when this plugin is discovered, so an
installation without the ``redis`` extra still lists the store and says what to install.
"""

from __future__ import annotations

import contextlib
import contextvars
import os
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar
from urllib.parse import parse_qs, urlsplit

from kvcache_core import StoreError, StoreSpec, StoreUnavailableError, hookimpl

from ._common import check_key, check_max_bytes, check_ttl, check_value, too_large

__all__ = [
    "DEFAULT_PASSWORD_ENV",
    "PASSWORD_ENV_PREFIX",
    "RedisStore",
    "RedisURL",
    "call_deadline",
    "connection_classes",
    "import_redis",
    "kvcache_store_specs",
    "one_quick_retry",
    "open_redis",
    "parse_redis_url",
    "value_of",
    "values_of",
]

#: The environment variable a Redis password is read from unless ``?password_env=`` names another.
DEFAULT_PASSWORD_ENV = "KVCACHE_REDIS_PASSWORD"

#: ``?password_env=`` may only name a variable with this prefix: the URL picks which secret is
#: sent to the host it names, so it must not be able to pick one meant for something else.
PASSWORD_ENV_PREFIX = "KVCACHE_"

_T = TypeVar("_T")
_OPTIONS = ("timeout", "connect_timeout", "password_env", "prefix")

# ``get`` with ``max_bytes``: the length and, only when it fits, the value, atomically and in
# one round trip (nil: no such key; an integer: the length of a value too large to send).
_BOUNDED_GET = """
local n = redis.call('STRLEN', KEYS[1])
if n == 0 and redis.call('EXISTS', KEYS[1]) == 0 then return false end
if n > tonumber(ARGV[1]) then return n end
return redis.call('GET', KEYS[1])
"""

# The monotonic time by which the current store call must be done (None: no call under way).
_DEADLINE: contextvars.ContextVar[float | None] = contextvars.ContextVar(
    "kvcache_redis_deadline", default=None
)


@contextlib.contextmanager
def call_deadline(seconds: float) -> Iterator[None]:
    """Every socket operation of the Redis stores' connections in this block ends by
    ``seconds`` from now (the earlier deadline wins when blocks nest)."""
    deadline = time.monotonic() + seconds
    outer = _DEADLINE.get()
    token = _DEADLINE.set(deadline if outer is None else min(outer, deadline))
    try:
        yield
    finally:
        _DEADLINE.reset(token)


def _remaining() -> float | None:
    """Seconds left to the current call's deadline (None: no deadline); raises the socket
    timeout redis-py turns into its ``TimeoutError`` once it has passed."""
    deadline = _DEADLINE.get()
    if deadline is None:
        return None
    left = deadline - time.monotonic()
    if left <= 0:
        raise TimeoutError("the store call's deadline passed")
    return left


class _DeadlineSocket:
    """A connected socket whose every read and write also ends by the call's deadline (redis-py
    sets a timeout per read; a trickling server would reset it with each byte)."""

    def __init__(self, sock: Any) -> None:
        self._sock = sock
        self._timeout: float | None = sock.gettimeout()

    def settimeout(self, value: float | None) -> None:
        self._timeout = value
        self._sock.settimeout(value)

    def gettimeout(self) -> float | None:
        return self._timeout

    def _bounded(self) -> None:
        left = _remaining()
        if left is not None:
            own = self._timeout
            self._sock.settimeout(left if own is None or own > left else own)
        else:
            self._sock.settimeout(self._timeout)

    def recv(self, *args: Any) -> Any:
        self._bounded()
        return self._sock.recv(*args)

    def recv_into(self, *args: Any) -> Any:
        self._bounded()
        return self._sock.recv_into(*args)

    def sendall(self, data: Any, *args: Any) -> Any:
        self._bounded()  # sendall's timeout bounds the whole send (Python >= 3.5)
        return self._sock.sendall(data, *args)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._sock, name)


_CLASSES: tuple[type, type] | None = None


def connection_classes(redis: Any) -> tuple[type, type]:
    """redis-py's plain and TLS connection classes, with every socket read, write and connect
    held to the current call's deadline (``call_deadline``)."""
    global _CLASSES
    if _CLASSES is not None:
        return _CLASSES

    def connect(base: Any, conn: Any) -> Any:
        configured = conn.socket_connect_timeout
        left = _remaining()
        if left is not None and (configured is None or configured > left):
            conn.socket_connect_timeout = left
        try:
            return _DeadlineSocket(base._connect(conn))
        finally:
            conn.socket_connect_timeout = configured

    class DeadlineConnection(redis.connection.Connection):  # type: ignore[misc]
        def _connect(self) -> Any:
            return connect(redis.connection.Connection, self)

    class DeadlineSSLConnection(redis.connection.SSLConnection):  # type: ignore[misc]
        def _connect(self) -> Any:
            return connect(redis.connection.SSLConnection, self)

    _CLASSES = (DeadlineConnection, DeadlineSSLConnection)
    return _CLASSES


class RedisStore:
    """Values under prefixed keys of one Redis (or Valkey) database; see the module doc.

    :param client: A connected ``redis.Redis``, as ``open_redis`` builds it.
    :param where: ``redis://host:port/db`` without credentials, for messages.
    :param prefix: Prepended to every key.
    :param timeout: The socket timeout, for messages.
    """

    batches_are_transactions = True
    """Whether ``put_many`` sends one ``MULTI``/``EXEC`` (all stored or none). One server can;
    a cluster cannot span hash slots with a transaction and sends plain pipelines."""

    def __init__(
        self, client: Any, *, where: str, prefix: str = "kvcache:", timeout: float = 5.0
    ) -> None:
        self._client = client
        self.where = where
        self.prefix = prefix
        self.timeout = timeout

    def __repr__(self) -> str:
        return f"RedisStore({self.where})"

    def _call(self, what: str, action: Callable[[], _T]) -> _T:
        import redis

        try:
            with call_deadline(self.timeout):
                return action()
        # RedisClusterException is not a RedisError: a cluster client's own failures.
        except (
            redis.exceptions.RedisError,
            redis.exceptions.RedisClusterException,
            OSError,
        ) as exc:
            raise self._translate(what, exc, redis) from None
        except StoreError:
            raise
        except Exception as exc:  # redis-py choking on a reply it did not expect
            raise StoreError(
                f"{self.where} answered {what} with something this client cannot read "
                f"({type(exc).__name__}: {exc}): is it a Redis server?"
            ) from None

    def _translate(self, what: str, exc: BaseException, redis: Any) -> StoreError:
        """The store error for ``exc``, raised by redis-py during ``what`` (no traceback
        chained: a redis-py frame may hold the connection's arguments)."""
        name = f"{type(exc).__name__}: {exc}"
        if _refused_credentials(exc, redis):
            return StoreError(
                f"{self.where}: authentication failed ({what}): {name}; check the password in "
                f"the environment variable the URL names (default ${DEFAULT_PASSWORD_ENV}) and "
                "the user"
            )
        if self._unavailable(exc, redis):
            return StoreUnavailableError(
                f"{self.where} did not answer {what} (timeout {self.timeout:g} s): {name}"
            )
        hint = ""
        if self._means_cluster_mode(exc, redis):
            hint = (
                ": the server runs in cluster mode (sharded), and this store talks to one "
                "non-sharded endpoint: open it as redis+cluster://HOST:PORT (rediss+cluster:// "
                "for TLS), or use the service's primary endpoint with cluster mode disabled (see "
                "'Running against a managed Redis or Valkey' in the snapshot-store docs)"
            )
        return StoreError(f"{self.where} refused {what}: {name}{hint}")

    def _unavailable(self, exc: BaseException, redis: Any) -> bool:
        """Whether ``exc`` means the server did not answer (rather than refused the call)."""
        e = redis.exceptions
        return isinstance(exc, (e.ConnectionError, e.TimeoutError, OSError))

    def _means_cluster_mode(self, exc: BaseException, redis: Any) -> bool:
        """Whether ``exc`` is a reply only a cluster-mode server gives (``MOVED``,
        ``CLUSTERDOWN``, ``CROSSSLOT``): the refusal then says which store to use instead."""
        return isinstance(exc, _cluster_errors(redis))

    def _key(self, key: str) -> str:
        return self.prefix + check_key(key)

    def put(self, key: str, value: bytes, *, ttl: float | None = None) -> None:
        """``SET`` (with ``PX`` when ``ttl`` is given): atomic on the server."""
        self.put_many({key: value}, ttl=ttl)

    def get(self, key: str, *, max_bytes: int | None = None) -> bytes | None:
        """``GET``: the value, or None.

        :raises StoreValueTooLargeError: The value is over ``max_bytes``; the server said its
            length, and none of it was sent.
        """
        name = self._key(key)
        limit = check_max_bytes(max_bytes)
        if limit is None:
            return self._call(f"GET {key!r}", lambda: value_of(self._client.get(name)))
        got = self._call(
            f"GET {key!r} (at most {limit} bytes)",
            lambda: self._client.eval(_BOUNDED_GET, 1, name, limit),
        )
        if isinstance(got, int) and not isinstance(got, bool):
            raise too_large(key, got, limit, self.where)
        value = self._call(f"GET {key!r}", lambda: value_of(got))
        if value is not None and len(value) > limit:  # a server that ignored the script's test
            raise too_large(key, len(value), limit, self.where)
        return value

    def delete(self, key: str) -> bool:
        """``DEL``: True when the key held a value."""
        return self.delete_many([key]) == 1

    def exists(self, key: str) -> bool:
        """``EXISTS``."""
        name = self._key(key)
        return self._call(f"EXISTS {key!r}", lambda: int(self._client.exists(name)) > 0)

    def put_many(self, items: Mapping[str, bytes], *, ttl: float | None = None) -> None:
        """Every ``SET`` in one ``MULTI``/``EXEC``: all stored or, on failure, none."""
        seconds = check_ttl(ttl)
        checked = [(self._key(k), check_value(v)) for k, v in items.items()]
        if not checked:
            return
        px = None if seconds is None else max(1, round(seconds * 1000))
        if len(checked) == 1:
            name, value = checked[0]
            self._call(
                f"SET {name[len(self.prefix) :]!r}", lambda: self._client.set(name, value, px=px)
            )
            return

        self._call(f"SET of {len(checked)} keys", lambda: self._set_batch(checked, px))

    def _set_batch(self, items: Sequence[tuple[str, bytes]], px: int | None) -> None:
        """Several ``SET``s in one pipeline, a ``MULTI``/``EXEC`` (all stored or none) when
        ``batches_are_transactions``."""
        pipe = self._client.pipeline(transaction=self.batches_are_transactions)
        for name, value in items:
            pipe.set(name, value, px=px)
        pipe.execute()

    def get_many(self, keys: Sequence[str]) -> list[bytes | None]:
        """One ``MGET``."""
        names = [self._key(k) for k in keys]
        if not names:
            return []
        return self._call(
            f"MGET of {len(names)} keys", lambda: values_of(self._client.mget(names), len(names))
        )

    def delete_many(self, keys: Sequence[str]) -> int:
        """One ``DEL``; how many keys held a value."""
        names = [self._key(k) for k in keys]
        if not names:
            return 0
        return self._call(f"DEL of {len(names)} keys", lambda: int(self._client.delete(*names)))

    def close(self) -> None:
        """Close the connection pool."""
        self._client.close()


def value_of(reply: object) -> bytes | None:
    """A ``GET`` reply as the value: None, or the bytes (anything else is not a value, and
    ``bytes(5)`` would have made five zero bytes of an integer reply)."""
    if reply is None or isinstance(reply, bytes):
        return reply
    if isinstance(reply, (bytearray, memoryview)):
        return bytes(reply)
    raise TypeError(f"a {type(reply).__name__} reply where a value or nil belongs")


def values_of(replies: object, count: int) -> list[bytes | None]:
    """An ``MGET`` (or pipelined ``GET``) reply: one value or None per key, in order."""
    if not isinstance(replies, (list, tuple)) or len(replies) != count:
        raise TypeError(f"not a list of {count} values")
    return [value_of(r) for r in replies]


def _refused_credentials(exc: BaseException, redis: Any) -> bool:
    """Whether the server refused the user or password (redis-py's ``AuthenticationError`` is
    a ``ConnectionError``, but nothing is unreachable: retrying will not help)."""
    if isinstance(exc, redis.exceptions.AuthenticationError):
        return True
    text = str(exc)
    return isinstance(exc, redis.exceptions.ResponseError) and text.startswith(
        ("NOAUTH", "WRONGPASS", "NOPERM")
    )


def _cluster_errors(redis: Any) -> tuple[type[BaseException], ...]:
    """The replies only a cluster-mode server gives (a key on another shard, slots not served,
    keys of one call on several shards): pointed at a sharded service, the store says so rather
    than passing on a bare ``MOVED``."""
    found = (getattr(redis.exceptions, n, None) for n in _CLUSTER_ERRORS)
    return tuple(c for c in found if isinstance(c, type))


_CLUSTER_ERRORS = ("AskError", "ClusterError", "ClusterCrossSlotError")  # MovedError is an AskError


def _seconds(options: dict[str, list[str]], name: str, default: float) -> float:
    raw = options.get(name, [str(default)])[-1]
    try:
        value = float(raw)
    except ValueError:
        value = -1.0
    if not 0 < value < 3600:
        raise StoreError(f"redis URL option {name}={raw!r} must be seconds in (0, 3600)")
    return value


@dataclass(frozen=True)
class RedisURL:
    """A parsed ``redis://`` (or ``redis+cluster://``) URL plus the password from the
    environment: one parser for both Redis stores, so they accept the same options and refuse
    the same mistakes with the same words."""

    scheme: str
    """The URL's scheme (``redis``, ``rediss``, ``redis+cluster``, ``rediss+cluster``)."""
    host: str
    """The server's (or the cluster seed's) host name."""
    port: int
    """Its port (6379 when the URL names none)."""
    db: int
    """The database number (a cluster has only database 0)."""
    username: str | None
    """The ACL user from the URL, if any."""
    password: str | None = field(repr=False)
    """The password read from the environment (never from the URL, never in a ``repr``)."""
    tls: bool
    """True for the ``rediss`` schemes."""
    timeout: float
    """Socket timeout per call, seconds."""
    connect_timeout: float
    """Connect timeout, seconds."""
    prefix: str
    """Prepended to every key."""

    @property
    def where(self) -> str:
        """``scheme://host:port/db``, without credentials or options, for messages."""
        return f"{self.scheme}://{self.host}:{self.port}/{self.db}"


def parse_redis_url(url: str, schemes: tuple[str, str] = ("redis", "rediss")) -> RedisURL:
    """Parse ``SCHEME://[USER@]HOST[:PORT][/DB][?timeout=S&connect_timeout=S&password_env=VAR&prefix=P]``
    for one of ``schemes`` (plain, then TLS) and read the password from the environment.

    :raises StoreError: Another scheme, a password in the URL, an unknown option, a bad port,
        database or timeout.
    """
    parts = urlsplit(url)
    if parts.scheme not in schemes:
        wanted = " or ".join(f"{s}://" for s in schemes)
        raise StoreError(f"not a {wanted} URL (scheme {parts.scheme!r})")
    if parts.password is not None:
        raise StoreError(
            "the redis URL carries a password: kvcache reads it from the environment "
            f"(${DEFAULT_PASSWORD_ENV}, or ?password_env=NAME) so it never appears in a URL, "
            "a log or a process list"
        )
    options = parse_qs(parts.query, keep_blank_values=True)
    unknown = sorted(set(options) - set(_OPTIONS))
    if unknown:
        raise StoreError(f"redis URL option(s) {unknown} unknown; known: {', '.join(_OPTIONS)}")
    try:
        port = parts.port or 6379
    except ValueError as exc:
        raise StoreError(f"redis URL port: {exc}") from None
    path = parts.path.strip("/") or "0"
    if not path.isdigit():
        raise StoreError(f"redis URL database must be a number, got {path!r}")
    env = options.get("password_env", [DEFAULT_PASSWORD_ENV])[-1]
    if not env.startswith(PASSWORD_ENV_PREFIX) or len(env) == len(PASSWORD_ENV_PREFIX):
        raise StoreError(
            f"redis URL option password_env={env!r}: the variable must be named "
            f"{PASSWORD_ENV_PREFIX}... (so a URL can only pick a secret meant for kvcache), "
            f"e.g. {DEFAULT_PASSWORD_ENV}"
        )
    return RedisURL(
        scheme=parts.scheme,
        host=parts.hostname or "localhost",
        port=port,
        db=int(path),
        username=parts.username or None,
        password=os.environ.get(env) or None,
        tls=parts.scheme == schemes[1],
        timeout=_seconds(options, "timeout", 5.0),
        connect_timeout=_seconds(options, "connect_timeout", 2.0),
        prefix=options.get("prefix", ["kvcache:"])[-1],
    )


def import_redis() -> Any:
    """redis-py, or a ``StoreError`` saying how to install it."""
    try:
        import redis
    except ImportError:
        raise StoreError("the redis store needs redis-py: pip install 'kvcache[redis]'") from None
    return redis


def one_quick_retry(redis: Any) -> Any:
    """One immediate retry for a dropped connection (a restarted server); none for a timeout,
    so a hung server costs one timeout, not several."""
    from redis.backoff import NoBackoff
    from redis.retry import Retry

    return Retry(NoBackoff(), 1, supported_errors=(redis.exceptions.ConnectionError,))


def open_redis(url: str) -> RedisStore:
    """Open ``redis://[USER@]HOST[:PORT][/DB][?timeout=S&connect_timeout=S&password_env=VAR&prefix=P]``
    (``rediss://`` for TLS). The password is read from the environment only.

    :raises StoreError: A malformed URL, a password in the URL, an unknown option, or redis-py
        not installed (``pip install 'kvcache[redis]'``).
    """
    target = parse_redis_url(url)
    redis = import_redis()
    plain, tls = connection_classes(redis)
    retry = one_quick_retry(redis)
    pool = redis.ConnectionPool(
        connection_class=tls if target.tls else plain,
        host=target.host,
        port=target.port,
        db=target.db,
        username=target.username,
        password=target.password,
        socket_timeout=target.timeout,
        socket_connect_timeout=target.connect_timeout,
        retry=retry,
        protocol=2,
    )
    client = redis.Redis(connection_pool=pool, retry=retry)
    return RedisStore(client, where=target.where, prefix=target.prefix, timeout=target.timeout)


@hookimpl
def kvcache_store_specs() -> list[StoreSpec]:
    """The ``redis`` store."""
    return [
        StoreSpec(
            name="redis",
            schemes=("redis", "rediss"),
            factory=open_redis,
            store_class=RedisStore,
            description="Redis or Valkey via redis-py (password from $KVCACHE_REDIS_PASSWORD)",
        )
    ]
