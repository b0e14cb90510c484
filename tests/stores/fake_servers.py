"""Servers that speak just enough of the Redis protocol to misbehave on purpose: one that
trickles its replies a byte at a time, one that answers every command with ``+OK``. Real
sockets on 127.0.0.1, a thread per connection; nothing of redis-py is replaced."""

from __future__ import annotations

import contextlib
import socket
import threading
import time
from collections.abc import Callable, Iterator

__all__ = ["FakeServer", "fake_server"]

Reply = Callable[[list[bytes]], bytes]


def _read_command(f: object) -> list[bytes] | None:
    """One RESP array of bulk strings (what a client sends), or None at end of stream."""
    line = f.readline()  # type: ignore[attr-defined]
    if not line:
        return None
    if not line.startswith(b"*"):  # an inline command
        return line.split()
    words = []
    for _ in range(int(line[1:])):
        size = int(f.readline()[1:])  # type: ignore[attr-defined]
        words.append(f.read(size + 2)[:-2])  # type: ignore[attr-defined]
    return words


class FakeServer:
    """Listens on a free port; answers each command with ``reply(words)``; the replies to the
    commands in ``slow`` (all, when None) go ``chunk`` bytes at a time, ``pause`` seconds apart."""

    def __init__(
        self,
        reply: Reply,
        *,
        pause: float = 0.0,
        chunk: int = 1 << 20,
        slow: frozenset[bytes] | None = None,
    ) -> None:
        self.reply, self.pause, self.chunk, self.slow = reply, pause, chunk, slow
        self.sock = socket.socket()
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen()
        self.port = self.sock.getsockname()[1]
        self.commands: list[list[bytes]] = []
        self.stopped = threading.Event()
        threading.Thread(target=self._accept, daemon=True).start()

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def _accept(self) -> None:
        while not self.stopped.is_set():
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def _serve(self, conn: socket.socket) -> None:
        with conn, conn.makefile("rb") as f:
            while not self.stopped.is_set():
                try:
                    words = _read_command(f)
                except (OSError, ValueError):
                    return
                if words is None:
                    return
                self.commands.append(words)
                data = self.reply(words)
                slow = self.slow is None or (bool(words) and words[0].upper() in self.slow)
                chunk = self.chunk if slow else len(data) or 1
                try:
                    for at in range(0, len(data), chunk):
                        conn.sendall(data[at : at + chunk])
                        if slow and self.pause and at + chunk < len(data):
                            time.sleep(self.pause)
                except OSError:
                    return

    def close(self) -> None:
        self.stopped.set()
        self.sock.close()


@contextlib.contextmanager
def fake_server(
    reply: Reply,
    *,
    pause: float = 0.0,
    chunk: int = 1 << 20,
    slow: frozenset[bytes] | None = None,
) -> Iterator[FakeServer]:
    server = FakeServer(reply, pause=pause, chunk=chunk, slow=slow)
    try:
        yield server
    finally:
        server.close()
