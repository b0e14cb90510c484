"""The directory snapshot store (``dir:PATH``): one file per key, for one machine or a shared
file system.

Why atomic: a value is written to a hidden temporary file in the same directory, flushed with
``fsync``, then put in place of the key's file in one atomic step, and the directory is
``fsync``ed. The step is an exchange of the two names where Linux offers it (then the old
file, now under the temporary name, is unlinked) and a rename otherwise; both are atomic, so a
reader (another process, another instance) opens either the old file or the new one, never a
partial one, and a reader that already has the old file open keeps reading it whole. A writer
that dies mid-write leaves only a temporary file that no key names. ``?fsync=0`` keeps the
atomicity and drops the two flushes (faster, but a machine crash may lose recent values).

Why the exchange: a rename over an existing file costs more than writing the file on ext4
(measured in ``_swap``, which does it).

A file starts with a 16-byte header: ``KVST``, a format byte, three reserved bytes and the
expiry time (seconds since the epoch, 0 for none), so expiry works across processes.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import os
import struct
import threading
import time
import uuid
from collections.abc import Mapping, Sequence
from pathlib import Path
from urllib.parse import parse_qs, quote

from kvcache_core import StoreError, StoreSpec, StoreUnavailableError, hookimpl

from ._common import check_key, check_ttl, check_value
from ._swap import swap_into_place

__all__ = ["DirectoryStore", "kvcache_store_specs", "open_directory"]

_MAGIC = b"KVST"
_VERSION = 1
_HEADER = struct.Struct("<4sB3xd")  # 16 bytes
_TMP_PREFIX = ".tmp-"


def _filename(key: str) -> str:
    """A file name for ``key`` that no other key maps to (reversible for short keys; a
    SHA-256 for long ones) and that never starts like a temporary file."""
    safe = quote(key, safe="")
    return "k-" + safe if len(safe) <= 200 else "h-" + hashlib.sha256(key.encode()).hexdigest()


class DirectoryStore:
    """Values as files in ``root``; see the module doc for the atomicity argument."""

    def __init__(self, root: str | os.PathLike[str], *, fsync: bool = True) -> None:
        self.root = Path(root)
        self.fsync = fsync
        try:
            self.root.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise StoreError(f"cannot create the store directory {self.root}: {exc}") from None
        self._local = threading.local()

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

    def put(self, key: str, value: bytes, *, ttl: float | None = None) -> None:
        """Write ``value`` atomically under ``key`` (temporary file, fsync, swap into place)."""
        path = self._path(key)
        data = check_value(value)
        seconds = check_ttl(ttl)
        expiry = 0.0 if seconds is None else time.time() + seconds
        tmp = self.root / f"{_TMP_PREFIX}{os.getpid()}-{uuid.uuid4().hex}"
        try:
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
            try:
                view = memoryview(data)
                header = _HEADER.pack(_MAGIC, _VERSION, expiry)
                written = os.writev(fd, [header, view])
                while written < len(header) + len(view):  # a short write: finish it
                    written += os.write(fd, view[written - len(header) :])
                if self.fsync:
                    os.fsync(fd)
            finally:
                os.close(fd)
            swap_into_place(tmp, path)
        except OSError as exc:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
            raise self._gone(exc, f"writing {key!r}") from None
        if self.fsync:
            self._sync_dir()

    def _sync_dir(self) -> None:
        try:
            fd = os.open(self.root, os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
        except OSError as exc:
            raise self._gone(exc, "syncing the directory") from None

    def _read(self, key: str, *, body: bool) -> bytes | None:
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
                    with contextlib.suppress(OSError):
                        os.unlink(path)
                    return None
                return f.read() if body else b""
        except FileNotFoundError:
            if not self.root.is_dir():
                raise StoreUnavailableError(f"the store directory {self.root} is gone") from None
            return None
        except OSError as exc:
            raise self._gone(exc, f"reading {key!r}") from None

    def get(self, key: str) -> bytes | None:
        """The value under ``key``, or None (missing or expired)."""
        return self._read(key, body=True)

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


def open_directory(url: str) -> DirectoryStore:
    """``dir:PATH[?fsync=0]``: the store in directory ``PATH`` (created if missing)."""
    scheme, _, rest = url.partition(":")
    if scheme != "dir":
        raise ValueError(f"not a dir: URL: {url!r}")
    path, _, query = rest.partition("?")
    if not path:
        raise StoreError("dir: needs a directory, as in dir:/var/lib/kvcache or dir:./snapshots")
    options = parse_qs(query, keep_blank_values=True)
    unknown = set(options) - {"fsync"}
    if unknown:
        raise StoreError(f"dir: URL option(s) {sorted(unknown)} unknown; known: fsync")
    fsync = options.get("fsync", ["1"])[-1]
    if fsync not in ("0", "1"):
        raise StoreError(f"dir: fsync must be 0 or 1, got {fsync!r}")
    return DirectoryStore(path, fsync=fsync == "1")


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
