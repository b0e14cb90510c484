"""How the directory store puts a value in place: an atomic exchange of names where Linux has
one (a rename over an existing file is the slow path on ext4), a rename otherwise, and in every
case no temporary file left behind, the old value whole for a reader that has it open, and the
old value untouched when the swap fails."""

from __future__ import annotations

import errno
import os
from collections.abc import Callable
from pathlib import Path

import pytest

from kvcache_core.errors import StoreUnavailableError
from kvcache_core.stores import open_store
from kvcache_plugins.stores import _swap


def _names(root: Path) -> list[str]:
    """The store's files, without its lock file (there from the first put on)."""
    return sorted(p.name for p in root.iterdir() if p.name != ".lock")


def _failing_exchange(code: int) -> Callable[[bytes, bytes], int]:
    def exchange(a: bytes, b: bytes) -> int:
        return code

    return exchange


@pytest.mark.skipif(_swap._exchange is None, reason="no renameat2 in this C library")
def test_an_overwrite_is_an_exchange_not_a_rename(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = open_store(f"dir:{tmp_path}?fsync=0")
    store.put("k", b"first")  # no file yet: a plain rename

    def no_rename(*args: object) -> None:
        raise AssertionError("os.replace over an existing key: the slow path on ext4")

    monkeypatch.setattr(_swap.os, "replace", no_rename)
    store.put("k", b"second" * 100)
    assert store.get("k") == b"second" * 100
    assert _names(tmp_path) == ["k-k"], "the old value, swapped out, must be unlinked"


@pytest.mark.parametrize(
    "exchange",
    [None, _failing_exchange(errno.EINVAL), _failing_exchange(errno.ENOSYS)],
    ids=["no-renameat2", "fs-refuses", "kernel-lacks"],
)
def test_without_the_exchange_a_rename_does_the_job(
    exchange: Callable[[bytes, bytes], int] | None,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(_swap, "_exchange", exchange)
    store = open_store(f"dir:{tmp_path}")
    for value in (b"one", b"two" * 1000, b""):
        store.put("k", value)
        assert store.get("k") == value
    assert _names(tmp_path) == ["k-k"]


def test_a_failed_swap_keeps_the_old_value_and_leaves_no_temporary_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = open_store(f"dir:{tmp_path}")
    store.put("k", b"old" * 100)
    monkeypatch.setattr(_swap, "_exchange", _failing_exchange(errno.EIO))
    with pytest.raises(StoreUnavailableError, match="writing 'k'"):
        store.put("k", b"new" * 100)
    assert store.get("k") == b"old" * 100
    assert _names(tmp_path) == ["k-k"]


@pytest.mark.parametrize("exchange", ["native", None], ids=["exchange", "rename"])
def test_a_reader_with_the_old_file_open_reads_it_whole(
    exchange: str | None, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    if exchange is None:
        monkeypatch.setattr(_swap, "_exchange", None)
    store = open_store(f"dir:{tmp_path}?fsync=0")
    old, new = os.urandom(1 << 20), os.urandom(1 << 20)
    store.put("k", old)
    with open(tmp_path / "k-k", "rb") as reader:
        head = reader.read(4096)
        store.put("k", new)
        rest = reader.read()
    assert (head + rest)[16:] == old
    assert store.get("k") == new
