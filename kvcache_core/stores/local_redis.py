"""A throwaway ``redis-server`` on 127.0.0.1 at a free port, for tests and benchmarks.

Why a real server: a test that claims the Redis store works must talk to Redis, not to a mock
of what someone believed Redis does. The server keeps nothing on disk (``--save ""
--appendonly no``) and implements [`Outage`][kvcache_core.stores.battery.Outage], so the store
battery can pause it, kill it mid-call and start it again at the same address.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Sequence

__all__ = ["LocalRedis", "redis_server_path"]


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
    """

    def __init__(self, *, timeout: float = 1.0, args: Sequence[str] = ()) -> None:
        exe = redis_server_path()
        if exe is None:
            raise FileNotFoundError(
                "redis-server is not installed (Debian: apt-get install redis-server)"
            )
        self._exe = exe
        self.port = _free_port()
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
