"""The directory store under races and faults: no acknowledged value is ever removed by a
reader or a sweep, expired values and dead writers' files are reclaimed, files are owner-only,
a short write or a full disk never leaves a wrong value.

The races are shown twice: once with the interleaving forced (deterministic, the exact window
a reader or a sweep used to lose a value in) and once with real processes."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import stat
import subprocess
import sys
import textwrap
import threading
import time
import tracemalloc
from collections.abc import Iterator
from pathlib import Path

import pytest

from kvcache_core import StoreError, StoreUnavailableError, StoreValueTooLargeError
from kvcache_core.stores import open_store
from kvcache_plugins.stores import directory
from kvcache_plugins.stores.directory import DirectoryStore


def _files(root: Path) -> list[str]:
    return sorted(p.name for p in root.iterdir() if p.name != ".lock")


def test_a_read_of_an_expired_value_never_removes_a_newer_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The reader has read the old file's header and found it expired; before it acts on that,
    another process puts a fresh value under the key. The fresh value must survive."""
    store = DirectoryStore(tmp_path, fsync=False)
    writer = DirectoryStore(tmp_path, fsync=False)
    store.put("k", b"old", ttl=60)
    real_time = time.time
    fired: list[bool] = []

    def put_then_late() -> float:
        if not fired:  # the reader's expiry check: a put lands in between, then time moved on
            fired.append(True)
            writer.put("k", b"fresh")
            return real_time() + 120
        return real_time()

    monkeypatch.setattr(directory.time, "time", put_then_late)
    assert store.get("k") is None  # it read the old, expired file
    monkeypatch.setattr(directory.time, "time", real_time)
    assert fired and store.get("k") == b"fresh"


def test_a_sweep_never_removes_a_value_put_after_its_first_look(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Forced interleaving on the sweep: a put lands between the sweep's unlocked look and its
    locked re-read (the value survives), and a put tried while the sweep holds the lock waits
    for it (so it can never land between the re-read and the unlink)."""
    store = DirectoryStore(tmp_path, fsync=False, sweep_every=0)
    writer = DirectoryStore(tmp_path, fsync=False, sweep_every=0)
    store.put("a", b"old", ttl=1e-6)
    real_expired = directory._expired
    looks: list[str] = []

    def put_after_first_look(path: str, now: float) -> bool:
        verdict = real_expired(path, now)
        looks.append(path)
        if len(looks) == 1:
            writer.put("a", b"fresh")
        return verdict if len(looks) == 1 else real_expired(path, time.time())

    monkeypatch.setattr(directory, "_expired", put_after_first_look)
    assert store.sweep() == 0 and len(looks) == 2
    assert store.get("a") == b"fresh"
    monkeypatch.setattr(directory, "_expired", real_expired)

    store.put("b", b"old", ttl=1e-6)
    real_remove = directory._remove
    blocked: list[bool] = []

    def remove_while_a_put_waits(path: str) -> bool:
        done = threading.Event()
        thread = threading.Thread(target=lambda: (writer.put("b", b"fresh"), done.set()))
        thread.start()
        blocked.append(not done.wait(0.3))  # the put waits for the sweep's lock
        removed = real_remove(path)
        threading.Thread(target=thread.join).start()
        return removed

    monkeypatch.setattr(directory, "_remove", remove_while_a_put_waits)
    assert store.sweep() == 1
    deadline = time.monotonic() + 5
    while store.get("b") is None and time.monotonic() < deadline:
        time.sleep(0.01)
    assert blocked == [True]
    assert store.get("b") == b"fresh"


_WRITER = textwrap.dedent(
    """
    import json, sys
    from kvcache_core.stores import open_store
    store = open_store(sys.argv[1])
    lost = []
    for i in range(int(sys.argv[2])):
        store.put("k", b"expiring %d" % i, ttl=1e-6)   # expired at once: readers see it so
        value = b"acknowledged %d" % i
        store.put("k", value)                          # acknowledged from here on
        if store.get("k") != value:                    # only this process writes "k"
            lost.append(i)
    print(json.dumps(lost))
    """
)

_READER = textwrap.dedent(
    """
    import os, sys
    from kvcache_core.stores import open_store
    store = open_store(sys.argv[1])
    reads = 0
    while not os.path.exists(sys.argv[2]):
        store.get("k")
        store.exists("k")
        if reads % 4 == 0:
            store.sweep()
        reads += 1
    print(reads)
    """
)


def test_two_readers_and_a_writer_lose_no_acknowledged_put(tmp_path: Path) -> None:
    """Real processes: a writer alternates an instantly expired value and an acknowledged one
    under one key, thousands of times, and reads each acknowledged one back; two readers read
    (finding expired files) and sweep all the while. Not one acknowledged put may go missing."""
    url = f"dir:{tmp_path}/kv?fsync=0&sweep=0"
    stop = tmp_path / "stop"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    readers = [
        subprocess.Popen(
            [sys.executable, "-c", _READER, url, str(stop)],
            stdout=subprocess.PIPE,
            text=True,
            env=env,
        )
        for _ in range(2)
    ]
    try:
        time.sleep(0.5)  # the readers are reading before the first put
        done = subprocess.run(
            [sys.executable, "-c", _WRITER, url, "3000"],
            capture_output=True,
            text=True,
            env=env,
            timeout=240,
        )
    finally:
        stop.touch()
        reads = [int(r.communicate(timeout=60)[0].strip() or 0) for r in readers]
    assert done.returncode == 0, done.stderr[-2000:]
    assert json.loads(done.stdout) == [], "acknowledged puts lost"
    assert all(n > 100 for n in reads), reads  # the readers really raced the writer


def test_expired_values_nobody_reads_are_reclaimed(tmp_path: Path) -> None:
    store = open_store(f"dir:{tmp_path}?fsync=0&sweep=0.05")
    store.put("gone", b"x" * 1000, ttl=0.05)
    store.put("kept", b"stays")
    store.put("later", b"y", ttl=600)
    time.sleep(0.1)
    store.put("other", b"z")  # the sweep interval has passed: this put sweeps
    assert _files(tmp_path) == ["k-kept", "k-later", "k-other"]
    assert store.get("kept") == b"stays" and store.get("later") == b"y"


def test_a_sweep_leaves_foreign_and_unexpired_files_alone(tmp_path: Path) -> None:
    store = DirectoryStore(tmp_path, fsync=False, sweep_every=0)
    store.put("a", b"1", ttl=600)
    (tmp_path / "k-foreign").write_bytes(b"not a store file at all")
    (tmp_path / "notes.txt").write_text("someone else's")
    assert store.sweep() == 0
    assert _files(tmp_path) == ["k-a", "k-foreign", "notes.txt"]


_DYING_WRITER = textwrap.dedent(
    """
    import os, sys, time
    from kvcache_plugins.stores import directory
    real = directory._write_all
    def half_then_hang(fd, header, data):
        real(fd, header, data[: len(data) // 2])
        print("written", flush=True)
        time.sleep(600)
    directory._write_all = half_then_hang
    directory.DirectoryStore(sys.argv[1], fsync=False).put("k", b"new" * 100_000)
    """
)


def test_a_killed_writer_leaves_the_old_value_and_its_file_is_reclaimed(tmp_path: Path) -> None:
    """A real writer process killed (SIGKILL) in the middle of a put: the key keeps its old
    value, and the next sweep removes the dead writer's temporary file with its snapshot bytes."""
    store = DirectoryStore(tmp_path, fsync=False, sweep_every=0)
    store.put("k", b"old")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    child = subprocess.Popen(
        [sys.executable, "-c", _DYING_WRITER, str(tmp_path)],
        stdout=subprocess.PIPE,
        text=True,
        env=env,
    )
    try:
        assert child.stdout is not None and child.stdout.readline().strip() == "written"
    finally:
        child.send_signal(signal.SIGKILL)
        child.wait(30)
    orphans = [n for n in _files(tmp_path) if n.startswith(".tmp-")]
    assert len(orphans) == 1 and (tmp_path / orphans[0]).stat().st_size > 100_000
    assert store.get("k") == b"old"
    assert store.sweep() == 1
    assert _files(tmp_path) == ["k-k"]


def test_temporary_files_of_live_or_unknown_writers_stay_until_an_hour_old(
    tmp_path: Path,
) -> None:
    store = DirectoryStore(tmp_path, fsync=False, sweep_every=0)
    live = tmp_path / f".tmp-{directory._HOST}-{os.getpid()}-abc"  # this process: alive
    other_host = tmp_path / ".tmp-0123456789ab-1-abc"  # another machine's writer
    old_style = tmp_path / ".tmp-999999-abc"
    stale = tmp_path / ".tmp-0123456789ab-2-abc"
    for path in (live, other_host, old_style, stale):
        path.write_bytes(b"partial snapshot")
    hour_ago = time.time() - directory.ORPHAN_AGE - 5
    os.utime(stale, (hour_ago, hour_ago))
    assert store.sweep() == 1
    assert sorted(_files(tmp_path)) == sorted(p.name for p in (live, other_host, old_style))


@contextlib.contextmanager
def _umask(mask: int) -> Iterator[None]:
    old = os.umask(mask)
    try:
        yield
    finally:
        os.umask(old)


def test_files_and_the_directory_are_owner_only_by_default(tmp_path: Path) -> None:
    with _umask(0o022):
        store = open_store(f"dir:{tmp_path}/kv")
        store.put("k", b"secret KV")
        wide = open_store(f"dir:{tmp_path}/shared?mode=640")
        wide.put("k", b"group may read")
    assert stat.S_IMODE((tmp_path / "kv").stat().st_mode) == 0o700
    assert stat.S_IMODE((tmp_path / "kv" / "k-k").stat().st_mode) == 0o600
    assert stat.S_IMODE((tmp_path / "kv" / ".lock").stat().st_mode) == 0o600
    assert stat.S_IMODE((tmp_path / "shared").stat().st_mode) == 0o750
    assert stat.S_IMODE((tmp_path / "shared" / "k-k").stat().st_mode) == 0o640


@pytest.mark.parametrize("mode", ["400", "0o200", "999", "1777", ""])
def test_a_mode_the_owner_cannot_use_is_refused(tmp_path: Path, mode: str) -> None:
    with pytest.raises(StoreError, match="mode must be octal permission bits"):
        open_store(f"dir:{tmp_path}?mode={mode}")


def test_a_short_first_write_never_writes_a_corrupt_header(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``writev`` may write fewer bytes than asked, even fewer than the 16-byte header."""
    store = DirectoryStore(tmp_path, fsync=False)
    real = os.writev
    calls: list[int] = []

    def short(fd: int, buffers: list[bytes | memoryview]) -> int:
        calls.append(len(calls))
        joined = b"".join(bytes(b) for b in buffers)
        return os.write(fd, joined[:3]) if len(calls) == 1 else real(fd, buffers)

    monkeypatch.setattr(os, "writev", short)
    value = bytes(range(256)) * 10
    store.put("k", value)
    assert store.get("k") == value


def test_max_bytes_refuses_a_large_file_before_reading_it(tmp_path: Path) -> None:
    store = DirectoryStore(tmp_path, fsync=False)
    store.put("big", b"\x01" * (64 << 20))
    store.put("small", b"fits")
    tracemalloc.start()
    try:
        with pytest.raises(StoreValueTooLargeError, match="67108864 bytes, more than") as info:
            store.get("big", max_bytes=1 << 20)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 1 << 20, f"{peak} bytes held to refuse a 64 MiB value"
    assert info.value.size == 64 << 20 and info.value.limit == 1 << 20
    assert store.get("small", max_bytes=4) == b"fits"
    assert store.get("missing", max_bytes=4) is None
    with pytest.raises(StoreError, match="max_bytes must be a non-negative integer"):
        store.get("small", max_bytes=-1)


def _tmpfs(path: Path, size: str) -> bool:
    path.mkdir()
    done = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)], capture_output=True
    )
    return done.returncode == 0


def test_a_full_disk_keeps_the_old_value_and_leaves_no_temporary_file(tmp_path: Path) -> None:
    """A real 1 MiB tmpfs: a put that does not fit raises StoreUnavailableError, and the key
    keeps its old value with no partial file left."""
    mount = tmp_path / "small"
    if not _tmpfs(mount, "1m"):
        if os.environ.get("CI"):
            pytest.fail("CI runs as root and must be able to mount a tmpfs")
        pytest.skip("cannot mount a tmpfs here (not root)")
    try:
        store = DirectoryStore(mount / "kv", fsync=True)
        store.put("k", b"old" * 1000)
        with pytest.raises(StoreUnavailableError, match="No space left"):
            store.put("k", b"x" * (2 << 20))
        assert store.get("k") == b"old" * 1000
        assert _files(mount / "kv") == ["k-k"]
    finally:
        subprocess.run(["umount", str(mount)], check=False)
