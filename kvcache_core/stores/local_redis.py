"""A throwaway ``redis-server`` on 127.0.0.1 at a free port (or a cluster of them), for tests
and benchmarks.

Why a real server: a test that claims the Redis store works must talk to Redis, not to a mock
of what someone believed Redis does. The server keeps nothing on disk (``--save ""
--appendonly no``) and implements [`Outage`][kvcache_core.stores.battery.Outage], so the store
battery can pause it, kill it mid-call and start it again at the same address.
"""

from __future__ import annotations

import os
import random
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Sequence
from typing import Any

__all__ = ["LocalRedis", "LocalRedisCluster", "redis_server_path"]


def redis_server_path() -> str | None:
    """The ``redis-server`` executable on ``PATH`` (Debian's ``redis-server`` package), or None."""
    return shutil.which("redis-server")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class LocalRedis:
    """Start with [`start`][kvcache_core.stores.local_redis.LocalRedis.start], stop with
    [`stop`][kvcache_core.stores.local_redis.LocalRedis.stop] (or use it as a context manager).

    :param timeout: The per-call timeout the ``url`` sets (short, so outage tests are quick).
    :param args: More ``redis-server`` options, appended to the command line (e.g.
        ``("--cluster-enabled", "yes")`` for a node of a cluster).
    :param port: The port to listen on (default: a free one).
    """

    def __init__(
        self, *, timeout: float = 1.0, args: Sequence[str] = (), port: int | None = None
    ) -> None:
        exe = redis_server_path()
        if exe is None:
            raise FileNotFoundError(
                "redis-server is not installed (Debian: apt-get install redis-server)"
            )
        self._exe = exe
        self.port = port or _free_port()
        """The free 127.0.0.1 port it listens on, kept across ``restart`` so a store's URL
        stays valid through an outage."""
        self.timeout = timeout
        """The per-call timeout ``url`` sets, in seconds (the battery's outage checks wait
        for it to expire)."""
        self.args = tuple(args)
        """The extra ``redis-server`` options it was started with (kept for ``restart``)."""
        self._workdir = tempfile.mkdtemp(prefix="kvcache-redis-")
        self._proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        """``redis://127.0.0.1:PORT/0?timeout=...`` for this server."""
        return f"redis://127.0.0.1:{self.port}/0?timeout={self.timeout:g}&connect_timeout={self.timeout:g}"

    def start(self) -> LocalRedis:
        """Start the server and wait until it answers ``PING`` (at most 10 s)."""
        args = [
            self._exe,
            "--port",
            str(self.port),
            "--bind",
            "127.0.0.1",
            "--save",
            "",
            "--appendonly",
            "no",
            "--dir",
            self._workdir,
            "--protected-mode",
            "no",
            *self.args,
        ]
        self._proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            if self._proc.poll() is not None:
                raise RuntimeError(f"redis-server exited with {self._proc.returncode} at start")
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=0.5) as s:
                    s.sendall(b"PING\r\n")
                    if s.recv(16).startswith(b"+PONG"):
                        return self
            except OSError:
                time.sleep(0.02)
        self.kill()
        raise RuntimeError("redis-server did not answer PING within 10 s")

    def _signal(self, sig: int) -> None:
        if self._proc is not None and self._proc.poll() is None:
            os.kill(self._proc.pid, sig)

    def pause(self) -> None:
        """``SIGSTOP``: the server stops answering, its connections stay open."""
        self._signal(signal.SIGSTOP)

    def resume(self) -> None:
        """``SIGCONT``: undo ``pause``."""
        self._signal(signal.SIGCONT)

    def kill(self) -> None:
        """``SIGKILL`` and reap: the server is gone at once, as in a crash."""
        if self._proc is not None and self._proc.poll() is None:
            self._proc.kill()
            self._proc.wait()

    def restart(self) -> None:
        """Start again at the same port after ``kill`` (empty: nothing is persisted)."""
        self.kill()
        self.start()

    def stop(self) -> None:
        """Kill the server and remove its working directory."""
        self.resume()
        self.kill()
        shutil.rmtree(self._workdir, ignore_errors=True)

    def __enter__(self) -> LocalRedis:
        """Start the server (as ``start``) and return it."""
        return self.start()

    def __exit__(self, *exc: object) -> None:
        """Stop the server and remove its directory, even when the block raised."""
        self.stop()


#: Highest client port a cluster node may use: its cluster bus listens on the port + 10000.
_MAX_CLUSTER_PORT = 65535 - 10000


def _free_cluster_port(taken: set[int]) -> int:
    """A free port whose bus port (+ 10000) is free too (a port the kernel hands out for port 0
    is often above 55535, where the bus port would not exist)."""
    rng = random.Random()
    for _ in range(1000):
        port = rng.randrange(20000, _MAX_CLUSTER_PORT)
        if port in taken or port + 10000 in taken:
            continue
        try:
            with socket.socket() as a, socket.socket() as b:
                a.bind(("127.0.0.1", port))
                b.bind(("127.0.0.1", port + 10000))
        except OSError:
            continue
        return port
    raise RuntimeError("no free port pair (port, port + 10000) found on 127.0.0.1")


class LocalRedisCluster:
    """A throwaway Redis Cluster: ``masters`` ``redis-server`` nodes in cluster mode on
    127.0.0.1, the 16384 slots split evenly between them, no replicas.

    Built without ``redis-cli``: each node is given its slots (``CLUSTER ADDSLOTS``) and
    introduced to the first (``CLUSTER MEET``), then ``start`` waits until every node reports
    ``cluster_state:ok``. Each node keeps its ``nodes.conf`` in its own directory, so a node
    killed and restarted comes back with its identity and slots (and no data).

    It implements [`Outage`][kvcache_core.stores.battery.Outage] for the whole cluster (every
    node paused, killed, restarted), and exposes ``nodes`` for a test that takes one away.

    :param masters: How many primary nodes (at least 1).
    :param timeout: The per-call timeout ``url`` sets.
    :param node_timeout: ``cluster-node-timeout`` in ms: how long nodes wait before they mark
        a silent peer as failed (and the cluster as down).
    """

    def __init__(
        self, *, masters: int = 3, timeout: float = 1.0, node_timeout: int = 15000
    ) -> None:
        if masters < 1:
            raise ValueError("a cluster needs at least one master")
        taken: set[int] = set()
        self.nodes: list[LocalRedis] = []
        """The nodes, in slot order (node 0 serves the lowest slots and is the URL's seed)."""
        for _ in range(masters):
            port = _free_cluster_port(taken)
            taken |= {port, port + 10000}
            args = (
                "--cluster-enabled",
                "yes",
                "--cluster-config-file",
                "nodes.conf",
                "--cluster-node-timeout",
                str(node_timeout),
            )
            self.nodes.append(LocalRedis(timeout=timeout, args=args, port=port))
        self.timeout = timeout
        """The per-call timeout ``url`` sets, in seconds."""

    @property
    def url(self) -> str:
        """``redis+cluster://127.0.0.1:PORT?timeout=...`` with the first node as the seed."""
        t = f"{self.timeout:g}"
        return f"redis+cluster://127.0.0.1:{self.nodes[0].port}?timeout={t}&connect_timeout={t}"

    def node_client(self, index: int) -> Any:
        """A plain ``redis.Redis`` client of one node (for inspecting what it holds)."""
        import redis

        return redis.Redis(host="127.0.0.1", port=self.nodes[index].port, socket_timeout=5)

    def start(self) -> LocalRedisCluster:
        """Start every node, assign the slots, join the nodes and wait for ``cluster_state:ok``
        (at most 20 s)."""
        try:
            for node in self.nodes:
                node.start()
            n = len(self.nodes)
            bounds = [16384 * i // n for i in range(n + 1)]
            for i in range(n):
                with self.node_client(i) as client:
                    # Distinct epochs up front: nodes that all claim epoch 0 would first have
                    # to settle the collision among themselves, which takes seconds.
                    client.execute_command("CLUSTER SET-CONFIG-EPOCH", i + 1)
                    client.execute_command("CLUSTER ADDSLOTS", *range(bounds[i], bounds[i + 1]))
                    for earlier in self.nodes[:i]:  # every pair meets: no wait for gossip
                        client.execute_command("CLUSTER MEET", "127.0.0.1", earlier.port)
            self.wait_ok()
        except BaseException:
            self.stop()
            raise
        return self

    def wait_ok(self, seconds: float = 20.0) -> None:
        """Wait until every node reports ``cluster_state:ok`` and knows every other node."""
        deadline = time.monotonic() + seconds
        want = {"cluster_state": "ok", "cluster_known_nodes": str(len(self.nodes))}
        while time.monotonic() < deadline:
            states = []
            for i in range(len(self.nodes)):
                try:
                    with self.node_client(i) as client:
                        info = client.execute_command("CLUSTER INFO")  # parsed to a dict
                except Exception:
                    info = {}
                states.append(all(str(info.get(k)) == v for k, v in want.items()))
            if all(states):
                return
            time.sleep(0.05)
        raise RuntimeError(f"the cluster did not reach cluster_state:ok within {seconds:g} s")

    def pause(self) -> None:
        """``SIGSTOP`` every node."""
        for node in self.nodes:
            node.pause()

    def resume(self) -> None:
        """``SIGCONT`` every node."""
        for node in self.nodes:
            node.resume()

    def kill(self) -> None:
        """``SIGKILL`` every node."""
        for node in self.nodes:
            node.kill()

    def restart(self) -> None:
        """Start every node again (same ports, same slots, no data) and wait until the cluster
        is ``ok``."""
        for node in self.nodes:
            node.restart()
        self.wait_ok()

    def stop(self) -> None:
        """Kill every node and remove their directories."""
        for node in self.nodes:
            node.stop()

    def __enter__(self) -> LocalRedisCluster:
        """Start the cluster (as ``start``) and return it."""
        return self.start()

    def __exit__(self, *exc: object) -> None:
        """Stop every node, even when the block raised."""
        self.stop()
