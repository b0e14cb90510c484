"""The directory snapshot store (``dir:PATH``): one file per key, for one machine or a shared
file system.

Why atomic: a value is written to a hidden temporary file in the same directory, flushed with
``fsync``, then put in place of the key's file in one atomic step, and the directory is
``fsync``ed. The step is an exchange of the two names where Linux offers it (then the old
file, now under the temporary name, is unlinked) and a rename otherwise; both are atomic, so a
reader (another process, another instance) opens either the old file or the new one, never a
partial one, and a reader that already has the old file open keeps reading it whole.
``?fsync=0`` keeps the atomicity and drops the two flushes (faster, but a machine crash may
lose recent values).

Why the exchange: a rename over an existing file costs more than writing the file on ext4
(measured in ``_swap``, which does it).

A file starts with a 16-byte header: ``KVST``, a format byte, three reserved bytes and the
expiry time (seconds since the epoch, 0 for none), so expiry works across processes.

Why reads never delete: a reader that found an expired file and unlinked it by name could
unlink the newer value another process had just put under that name. An expired file is
therefore only reported as missing, and removed by ``sweep``, which holds the directory's
lock file (``.lock``) exclusively while it re-reads the file and unlinks it; every ``put``
holds the same lock shared while it swaps its file in, so no put can land between the sweep's
last look and its unlink. ``sweep`` also removes the temporary files of writers that died
(their process is gone, or the file is older than an hour). ``put`` runs it every
``?sweep=SECONDS`` (default 60; 0 never), so values nobody reads again are reclaimed.

Files are created owner-only (``0600``; the directory ``0700`` when the store creates it);
``?mode=640`` (octal) widens that.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import hashlib
import os
import socket
import stat
import struct
import time
import uuid
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from urllib.parse import parse_qs, quote

from kvcache_core import StoreError, StoreSpec, StoreUnavailableError, hookimpl

from ._common import check_key, check_max_bytes, check_ttl, check_value, too_large
from ._swap import swap_into_place

__all__ = ["DEFAULT_MODE", "DirectoryStore", "kvcache_store_specs", "open_directory"]

_MAGIC = b"KVST"
_VERSION = 1
_HEADER = struct.Struct("<4sB3xd")  # 16 bytes
_TMP_PREFIX = ".tmp-"
_LOCK_NAME = ".lock"

DEFAULT_MODE = 0o600
"""Permission bits of every file the store writes unless ``?mode=`` says otherwise: snapshots
hold a request's KV, which is as private as the request."""

#: A temporary file older than this is an orphan whoever wrote it (a writer stalled for an hour
#: has failed); a younger one is an orphan only when its writer is known to be dead.
ORPHAN_AGE = 3600.0


def _host_tag() -> str:
    """Who may judge a writer dead by its process id: the same host, boot and pid namespace
    (a container sharing the directory under the same host name has another namespace)."""
    parts = [socket.gethostname()]
    for path in ("/proc/sys/kernel/random/boot_id", "/proc/self/ns/pid"):
        with contextlib.suppress(OSError):
            parts.append(
                Path(path).read_text().strip() if "boot" in path else str(os.stat(path).st_ino)
            )
    return hashlib.sha256("\0".join(parts).encode()).hexdigest()[:12]


_HOST = _host_tag()


def _filename(key: str) -> str:
    """A file name for ``key`` that no other key maps to (reversible for short keys; a
    SHA-256 for long ones) and that never starts like a temporary file."""
    safe = quote(key, safe="")
    return "k-" + safe if len(safe) <= 200 else "h-" + hashlib.sha256(key.encode()).hexdigest()


def _dir_mode(mode: int) -> int:
    """The directory's mode for files of ``mode``: whoever may read or write may also enter."""
    out = 0
    for shift in (6, 3, 0):
        bits = (mode >> shift) & 0o7
        out |= (bits | (0o1 if bits else 0)) << shift
    return out


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # someone else's live process
        return True
    return True


def _write_all(fd: int, header: bytes, data: memoryview) -> None:
    """Write ``header`` then ``data``, however short each ``writev``/``write`` falls."""
    total = len(header) + len(data)
    written = os.writev(fd, [header, data])
    while written < total:
        if written < len(header):  # not even the header went out whole
            written += os.writev(fd, [header[written:], data])
        else:
            written += os.write(fd, data[written - len(header) :])


def _expiry_of(path: str) -> float | None:
    """The expiry time in the header of the file at ``path`` (0 for none), or None when there
    is no such file or it is not a store file (a sweep leaves those alone)."""
    try:
        with open(path, "rb", buffering=0) as f:
            head = f.read(_HEADER.size)
    except OSError:
        return None
    if len(head) != _HEADER.size:
        return None
    magic, version, expiry = _HEADER.unpack(head)
    return float(expiry) if magic == _MAGIC and version == _VERSION else None


def _expired(path: str, now: float) -> bool:
    expiry = _expiry_of(path)
    return expiry is not None and expiry != 0 and now >= expiry


def _remove(path: str) -> bool:
    """Unlink ``path``; True when it was there (the one place a sweep deletes a value)."""
    try:
        os.unlink(path)
        return True
    except FileNotFoundError:
        return False


class DirectoryStore:
    """Values as files in ``root``; see the module doc for the atomicity argument.

    :param root: The directory (created, owner-only by default, when missing).
    :param fsync: Flush each value and the directory (durable across a machine crash).
    :param mode: Permission bits of the files written (default ``0o600``).
    :param sweep_every: Seconds between the sweeps a ``put`` runs (0: only explicit ``sweep``).
    """

    def __init__(
        self,
        root: str | os.PathLike[str],
        *,
        fsync: bool = True,
        mode: int = DEFAULT_MODE,
        sweep_every: float = 60.0,
    ) -> None:
        self.root = Path(root)
        self.fsync = fsync
        self.mode = mode
        self.sweep_every = sweep_every
        try:
            if not self.root.is_dir():
                self.root.parent.mkdir(parents=True, exist_ok=True)
                with contextlib.suppress(FileExistsError):  # another process made it first
                    os.mkdir(self.root, _dir_mode(mode))
                    os.chmod(self.root, _dir_mode(mode))  # exactly, whatever the umask
        except OSError as exc:
            raise StoreError(f"cannot create the store directory {self.root}: {exc}") from None
        if not self.root.is_dir():
            raise StoreError(f"cannot create the store directory {self.root}: a file is there")
        self._next_sweep = time.monotonic()  # the first put sweeps (orphans of dead writers)

    def __repr__(self) -> str:
        return f"DirectoryStore(dir:{self.root})"

    def _path(self, key: str) -> Path:
        return self.root / _filename(check_key(key))

    def _gone(self, exc: OSError, what: str) -> StoreError:
        if not self.root.is_dir():
            return StoreUnavailableError(f"the store directory {self.root} is gone ({what}: {exc})")
        if exc.errno in (errno.EIO, errno.ENOSPC, errno.EROFS, errno.EDQUOT, errno.ESTALE):
            return StoreUnavailableError(f"{what} in {self.root} failed: {exc}")
        return StoreError(f"{what} in {self.root} failed: {exc}")

    @contextlib.contextmanager
    def _locked(self, how: int) -> Iterator[bool]:
        """The directory's lock file held with ``how`` (``LOCK_SH`` or ``LOCK_EX``, maybe
        ``| LOCK_NB``); yields False when a non-blocking request was not granted. A fresh
        descriptor per call: a lock belongs to its open file, so threads never share one."""
        fd = os.open(self.root / _LOCK_NAME, os.O_RDWR | os.O_CREAT, self.mode)
        try:
            try:
                fcntl.flock(fd, how)
            except BlockingIOError:
                yield False
                return
            yield True
        finally:
            os.close(fd)  # closing releases the lock

    def put(self, key: str, value: bytes, *, ttl: float | None = None) -> None:
        """Write ``value`` atomically under ``key`` (temporary file, fsync, swap into place)."""
        path = self._path(key)
        data = check_value(value)
        seconds = check_ttl(ttl)
        expiry = 0.0 if seconds is None else time.time() + seconds
        tmp = self.root / f"{_TMP_PREFIX}{_HOST}-{os.getpid()}-{uuid.uuid4().hex}"
        try:
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, self.mode)
            try:
                os.fchmod(fd, self.mode)  # exactly, whatever the umask
                _write_all(fd, _HEADER.pack(_MAGIC, _VERSION, expiry), memoryview(data))
                if self.fsync:
                    os.fsync(fd)
            finally:
                os.close(fd)
            with self._locked(fcntl.LOCK_SH):  # a sweep never unlinks what this swaps in
                swap_into_place(tmp, path)
        except OSError as exc:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
            raise self._gone(exc, f"writing {key!r}") from None
        if self.fsync:
            self._sync_dir()
        if self.sweep_every and time.monotonic() >= self._next_sweep:
            self._next_sweep = time.monotonic() + self.sweep_every
            with contextlib.suppress(StoreError):  # reclaiming is best effort; the put stands
                self.sweep()

    def _sync_dir(self) -> None:
        try:
            fd = os.open(self.root, os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
        except OSError as exc:
            raise self._gone(exc, "syncing the directory") from None

    def _read(self, key: str, *, body: bool, max_bytes: int | None = None) -> bytes | None:
        path = self._path(key)
        try:
            with open(path, "rb", buffering=0) as f:
                head = f.read(_HEADER.size)
                if len(head) != _HEADER.size:
                    raise StoreError(
                        f"the file of {key!r} in {self.root} is truncated ({len(head)} bytes)"
                    )
                magic, version, expiry = _HEADER.unpack(head)
                if magic != _MAGIC or version != _VERSION:
                    raise StoreError(
                        f"the file of {key!r} in {self.root} is not a kvcache store file "
                        "(corrupted or written by something else)"
                    )
                if expiry and time.time() >= expiry:
                    return None  # left for ``sweep``: unlinking by name here could hit a newer file
                if not body:
                    return b""
                if max_bytes is None:
                    return f.read()
                size = os.fstat(f.fileno()).st_size - _HEADER.size
                if size > max_bytes:
                    raise too_large(key, size, max_bytes, str(self.root))
                value = f.read(max_bytes + 1)  # a file grown since the fstat is still bounded
                if len(value) > max_bytes:
                    raise too_large(key, None, max_bytes, str(self.root))
                return value
        except FileNotFoundError:
            if not self.root.is_dir():
                raise StoreUnavailableError(f"the store directory {self.root} is gone") from None
            return None
        except OSError as exc:
            raise self._gone(exc, f"reading {key!r}") from None

    def get(self, key: str, *, max_bytes: int | None = None) -> bytes | None:
        """The value under ``key``, or None (missing or expired).

        :raises StoreValueTooLargeError: The value is over ``max_bytes`` (told by the file's
            size; at most ``max_bytes + 1`` bytes are ever read).
        """
        return self._read(key, body=True, max_bytes=check_max_bytes(max_bytes))

    def exists(self, key: str) -> bool:
        """Whether ``key`` holds an unexpired value (reads its header only)."""
        return self._read(key, body=False) is not None

    def delete(self, key: str) -> bool:
        """Remove ``key``'s file; True when there was one."""
        try:
            os.unlink(self._path(key))
            return True
        except FileNotFoundError:
            if not self.root.is_dir():
                raise StoreUnavailableError(f"the store directory {self.root} is gone") from None
            return False
        except OSError as exc:
            raise self._gone(exc, f"deleting {key!r}") from None

    def sweep(self) -> int:
        """Remove expired values and the temporary files of dead writers; how many files went.

        A value is unlinked only while this holds the directory's lock exclusively and has
        re-read its header under it: a ``put`` (which swaps its file in under the shared lock)
        can never be the one removed. A file the lock cannot be had for at once is left for the
        next sweep, so a sweep never makes a writer wait long.
        """
        removed = 0
        now = time.time()
        try:
            entries = list(os.scandir(self.root))
        except FileNotFoundError:
            raise StoreUnavailableError(f"the store directory {self.root} is gone") from None
        except OSError as exc:
            raise self._gone(exc, "listing") from None
        for entry in entries:
            name = entry.name
            if name.startswith(_TMP_PREFIX):
                removed += self._orphan(entry, now)
            elif name.startswith(("k-", "h-")) and _expired(entry.path, now):
                with self._locked(fcntl.LOCK_EX | fcntl.LOCK_NB) as held:
                    # Re-read under the lock: a put may have swapped a fresh file in since.
                    if held and _expired(entry.path, time.time()):
                        removed += _remove(entry.path)
        return removed

    def _orphan(self, entry: os.DirEntry[str], now: float) -> bool:
        """Unlink a temporary file whose writer is dead (or that is an hour old)."""
        try:
            info = entry.stat(follow_symlinks=False)
        except OSError:
            return False
        if not stat.S_ISREG(info.st_mode):
            return False
        tag, _, rest = entry.name[len(_TMP_PREFIX) :].partition("-")
        pid = rest.partition("-")[0]
        dead = tag == _HOST and pid.isdigit() and not _pid_alive(int(pid))
        if not dead and now - info.st_mtime < ORPHAN_AGE:
            return False
        with contextlib.suppress(OSError):
            return _remove(entry.path)
        return False

    def put_many(self, items: Mapping[str, bytes], *, ttl: float | None = None) -> None:
        """``put`` of each item (each atomic on its own; all are checked before the first)."""
        checked = {check_key(k): check_value(v) for k, v in items.items()}
        check_ttl(ttl)
        for key, value in checked.items():
            self.put(key, value, ttl=ttl)

    def get_many(self, keys: Sequence[str]) -> list[bytes | None]:
        """``get`` of each key, in order."""
        return [self.get(k) for k in [check_key(k) for k in keys]]

    def delete_many(self, keys: Sequence[str]) -> int:
        """``delete`` of each key; how many existed."""
        return sum(self.delete(k) for k in [check_key(k) for k in keys])

    def close(self) -> None:
        """Nothing to release (files are opened per call)."""


def _option(options: dict[str, list[str]], name: str, default: str) -> str:
    return options.get(name, [default])[-1]


def open_directory(url: str) -> DirectoryStore:
    """``dir:PATH[?fsync=0&mode=600&sweep=60]``: the store in directory ``PATH`` (created,
    owner-only, if missing)."""
    scheme, _, rest = url.partition(":")
    if scheme != "dir":
        raise ValueError(f"not a dir: URL: {url!r}")
    path, _, query = rest.partition("?")
    if not path:
        raise StoreError("dir: needs a directory, as in dir:/var/lib/kvcache or dir:./snapshots")
    options = parse_qs(query, keep_blank_values=True)
    known = ("fsync", "mode", "sweep")
    unknown = set(options) - set(known)
    if unknown:
        raise StoreError(f"dir: URL option(s) {sorted(unknown)} unknown; known: {', '.join(known)}")
    fsync = _option(options, "fsync", "1")
    if fsync not in ("0", "1"):
        raise StoreError(f"dir: fsync must be 0 or 1, got {fsync!r}")
    raw_mode = _option(options, "mode", f"{DEFAULT_MODE:o}")
    try:
        mode = int(raw_mode, 8)
    except ValueError:
        mode = -1
    if not 0 <= mode <= 0o777 or mode & 0o600 != 0o600:
        raise StoreError(
            f"dir: mode must be octal permission bits that let the owner read and write "
            f"(600, 640, 660, ...), got {raw_mode!r}"
        )
    raw_sweep = _option(options, "sweep", "60")
    try:
        sweep = float(raw_sweep)
    except ValueError:
        sweep = -1.0
    if not 0 <= sweep < 1e9:
        raise StoreError(f"dir: sweep must be seconds >= 0 (0: never), got {raw_sweep!r}")
    return DirectoryStore(path, fsync=fsync == "1", mode=mode, sweep_every=sweep)


@hookimpl
def kvcache_store_specs() -> list[StoreSpec]:
    """The ``dir`` store."""
    return [
        StoreSpec(
            name="dir",
            schemes=("dir",),
            factory=open_directory,
            store_class=DirectoryStore,
            description="one file per key in a directory; atomic writes (tmp + fsync + swap)",
        )
    ]
