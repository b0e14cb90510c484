"""What moving a snapshot across instances costs, against the plain operations it is built on.

Run: ``.venv/bin/python benchmarks/bench_stores.py [--tokens N] [--repeat N] [--redis URL]``.
Every figure is a ratio against a baseline measured in the same run (throughput: higher is
better), with the target and whether this run meets it:

1. Redis: snapshot -> bytes -> ``RedisStore.put`` -> ``get`` -> bytes -> checked snapshot, for
   a 4,096-token MHA snapshot, against a plain redis-py ``SET`` and ``GET`` of the same number
   of bytes on the same server (target >= 0.8x). A throwaway ``redis-server`` is started on a
   free port unless ``--redis URL`` names one.
2. Directory store: ``put`` + ``get`` of the snapshot's bytes against a plain file write and
   read of the same bytes in the same directory (target >= 0.8x), with the store's default
   ``fsync`` (durable) and with ``?fsync=0`` (atomic only, as durable as the plain write).
   The baseline writes one path over and over (``open(path, "wb")``, which truncates the old
   bytes, as ``Path.write_bytes`` does) and reads it back: that is a plain write of the same
   bytes, and like the store's ``put`` it replaces a value that is already there (the store
   replaces its key's file each time). Two informational lines show the other readings: a
   fresh file per write (create, write, read, unlink the previous one: no truncation, and
   what a store that gave up atomicity by deleting first would do), and the store against
   itself with its atomic step forced to ``os.replace`` instead of the Linux exchange of names
   (a rename over an existing file makes ext4 allocate and start writing the new file at
   once; the store avoids it, see ``kvcache_plugins/stores/_swap.py``). The unsynced target
   is also shown on medians: the plain overwrite's times are bimodal (``open(path, "wb")``
   truncates a file whose previous bytes ext4 may still be writing back, and then waits for
   that writeback), so its best run and its typical run differ several-fold.
3. Wire format alone: ``to_bytes`` + ``from_bytes`` against a ``memcpy`` of the same bytes
   each way (parts into one fresh buffer, the buffer back into fresh tensors; target >= 0.9x).
   ``from_bytes`` copies the data once too (into memory of the snapshot's own, hashing each
   chunk as it goes), so both sides copy each way; the XXH3 pass over the data, which the
   memcpy does not do, is shown on its own.

Timings are the best of ``--repeat`` interleaved runs (on a shared machine the median measures
the other processes). ``--quick`` (256 tokens, 3 runs) only proves the script runs.
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import os
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

import torch
import xxhash

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _report import figure, informational, interleaved, median_of

from kvcache_core import KVSnapshot, PoolConfig, discover
from kvcache_core.stores import get_snapshot, open_store, put_snapshot
from kvcache_core.stores.local_redis import LocalRedis
from kvcache_plugins.stores import _swap


def mha_snapshot(tokens: int) -> KVSnapshot:
    """A real MHA snapshot: random bf16 rows written into a pool, read back at ``tokens`` slots
    (2 layers x 8 heads x 64 dims: 4 KiB of K and V per token)."""
    config = PoolConfig(
        size=tokens + 16, layer_num=2, head_num=8, head_dim=64, page_size=16, dtype=torch.bfloat16
    )
    _, allocator = discover().create("mha", config)
    slots = torch.arange(1, tokens + 1)
    blank = allocator.get_cpu_copy(slots)
    gen = torch.Generator().manual_seed(0)
    parts = {n: torch.randn(t.shape, generator=gen).to(t.dtype) for n, t in blank.parts.items()}
    allocator.load_cpu_copy(
        KVSnapshot(blank.pool_kind, blank.dtype, tokens, parts, meta=blank.meta), slots
    )
    return allocator.get_cpu_copy(slots)


def best(times: dict[str, list[float]]) -> dict[str, float]:
    return {k: min(v) for k, v in times.items()}


def gbps(nbytes: int, seconds: float) -> str:
    return f"{nbytes / seconds / 1e9:.2f} GB/s"


def _raw(t: torch.Tensor) -> object:
    return (ctypes.c_char * (t.numel() * t.element_size())).from_address(t.data_ptr())


def wire(snap: KVSnapshot, repeat: int) -> list[bool]:
    blob = snap.to_bytes()
    parts = [t.contiguous() for t in snap.parts.values()]
    n = len(blob)

    def memcpy_out() -> object:  # the parts' bytes into one fresh buffer
        return b"".join([_raw(t) for t in parts])  # type: ignore[misc]

    def memcpy_in() -> object:  # a buffer's bytes into fresh tensors
        src = torch.frombuffer(packed, dtype=torch.uint8)
        out, at = [], 0
        for t in parts:
            size = t.numel() * t.element_size()
            dst = torch.empty(size, dtype=torch.uint8)
            dst.copy_(src[at : at + size])
            out.append(dst)
            at += size
        return out

    packed = bytearray(memcpy_out())  # type: ignore[arg-type]
    times = best(
        interleaved(
            {
                "to_bytes": snap.to_bytes,
                "from_bytes": lambda: KVSnapshot.from_bytes(blob),
                "memcpy_out": memcpy_out,
                "memcpy_in": memcpy_in,
                "xxh3": lambda: xxhash.xxh3_64(blob).intdigest(),
            },
            repeat,
        )
    )
    ours = times["to_bytes"] + times["from_bytes"]
    base = times["memcpy_out"] + times["memcpy_in"]
    print(f"wire format, {n / 2**20:.1f} MiB blob")
    ok = figure(
        "to_bytes + from_bytes",
        gbps(2 * n, ours),
        f"memcpy out + in {gbps(2 * n, base)}",
        base / ours,
        0.9,
    )
    informational(
        "to_bytes (copy + xxh3)",
        gbps(n, times["to_bytes"]),
        "memcpy out",
        times["memcpy_out"] / times["to_bytes"],
    )
    informational(
        "from_bytes (copy + xxh3)",
        gbps(n, times["from_bytes"]),
        "memcpy in",
        times["memcpy_in"] / times["from_bytes"],
    )
    informational(
        "xxh3 of the blob alone",
        gbps(n, times["xxh3"]),
        "memcpy out",
        times["memcpy_out"] / times["xxh3"],
    )
    return ["MISSES" not in ok]


def directory(snap: KVSnapshot, repeat: int) -> list[bool]:
    blob = snap.to_bytes()
    results = []
    with tempfile.TemporaryDirectory(prefix="kvcache-bench-") as root:
        durable = open_store(f"dir:{root}/durable")
        fast = open_store(f"dir:{root}/fast?fsync=0")
        plain = Path(root) / "plain.bin"
        synced = Path(root) / "synced.bin"

        def plain_rw() -> object:
            with open(plain, "wb") as f:
                f.write(blob)
            with open(plain, "rb") as f:
                return f.read()

        def synced_rw() -> object:
            with open(synced, "wb") as f:
                f.write(blob)
                f.flush()
                os.fsync(f.fileno())
            with open(synced, "rb") as f:
                return f.read()

        def store_rw(store: object) -> Callable[[], object]:
            def run() -> object:
                store.put("snap", blob)  # type: ignore[attr-defined]
                return store.get("snap")  # type: ignore[attr-defined]

            return run

        # Two groups, each interleaved on its own: an fsync'd run leaves writeback behind that
        # slows whatever runs next, so mixing them would charge one side for the other's flush.
        counter = [0]

        def fresh_rw() -> object:
            counter[0] += 1
            path = Path(root) / f"fresh-{counter[0]}.bin"
            with open(path, "wb") as f:
                f.write(blob)
            with contextlib.suppress(FileNotFoundError):
                os.unlink(Path(root) / f"fresh-{counter[0] - 1}.bin")
            with open(path, "rb") as f:
                return f.read()

        renamed = open_store(f"dir:{root}/renamed?fsync=0")

        def renamed_rw() -> object:
            exchange, _swap._exchange = _swap._exchange, None
            try:
                return store_rw(renamed)()
            finally:
                _swap._exchange = exchange

        unsynced = interleaved({"plain": plain_rw, "fast": store_rw(fast)}, repeat)
        times = best(unsynced)
        medians = median_of(unsynced)
        times |= best(interleaved({"synced": synced_rw, "durable": store_rw(durable)}, repeat))
        # The informational readings, each group on its own for the same reason (a rename over
        # a file starts writeback that would slow the group's other side).
        fresh = best(interleaved({"fresh": fresh_rw, "fast": store_rw(fast)}, repeat))
        renames = best(interleaved({"fast": store_rw(fast), "renamed": renamed_rw}, repeat))
    n = 2 * len(blob)
    print(f"directory store, {len(blob) / 2**20:.1f} MiB value, put + get")
    for label, key, base_key, base_label in (
        ("dir store ?fsync=0", "fast", "plain", "plain write + read"),
        ("dir store (fsync)", "durable", "synced", "write + fsync + read"),
    ):
        line = figure(
            label,
            gbps(n, times[key]),
            f"{base_label} {gbps(n, times[base_key])}",
            times[base_key] / times[key],
            0.8,
        )
        results.append("MISSES" not in line)
    informational(
        "dir store (fsync)",
        gbps(n, times["durable"]),
        f"plain write + read {gbps(n, times['plain'])}",
        times["plain"] / times["durable"],
    )
    informational(
        "dir store ?fsync=0, medians",
        gbps(n, medians["fast"]),
        f"plain write + read {gbps(n, medians['plain'])}",
        medians["plain"] / medians["fast"],
        note="same runs as the target line",
    )
    informational(
        "dir store ?fsync=0",
        gbps(n, fresh["fast"]),
        f"new file + read {gbps(n, fresh['fresh'])}",
        fresh["fresh"] / fresh["fast"],
    )
    informational(
        "dir store ?fsync=0",
        gbps(n, renames["fast"]),
        f"it with os.replace {gbps(n, renames['renamed'])}",
        renames["renamed"] / renames["fast"],
        note="what the exchange of names buys",
    )
    return results


def redis(snap: KVSnapshot, repeat: int, url: str | None) -> list[bool]:
    server = None if url else LocalRedis(timeout=30).start()
    try:
        url = url or (server.url if server else "")
        store = open_store(url)
        client = store._client  # type: ignore[attr-defined]  # the same connection pool
        blob = snap.to_bytes()

        def ours() -> object:
            put_snapshot(store, "bench-snap", snap)
            return get_snapshot(store, "bench-snap")

        def plain() -> object:
            client.set("bench-plain", blob)
            return client.get("bench-plain")

        times = best(interleaved({"ours": ours, "plain": plain}, repeat))
        n = 2 * len(blob)
        print(f"redis store ({url.split('?')[0]}), {len(blob) / 2**20:.1f} MiB snapshot")
        line = figure(
            "snapshot->store->snapshot",
            gbps(n, times["ours"]),
            f"plain SET + GET {gbps(n, times['plain'])}",
            times["plain"] / times["ours"],
            0.8,
        )
        client.delete("bench-snap", "kvcache:bench-snap", "bench-plain")
        store.close()
        return ["MISSES" not in line]
    finally:
        if server is not None:
            server.stop()


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--tokens", type=int, default=4096)
    parser.add_argument("--repeat", type=int, default=15)
    parser.add_argument("--redis", metavar="URL", help="an existing server (default: start one)")
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args()
    if args.quick:
        args.tokens, args.repeat = 256, 3
    torch.set_num_threads(1)
    snap = mha_snapshot(args.tokens)
    print(
        f"kvcache stores benchmark: {args.tokens}-token MHA snapshot, {snap.nbytes / 2**20:.1f} MiB"
    )
    met = (
        wire(snap, args.repeat)
        + directory(snap, args.repeat)
        + redis(snap, args.repeat, args.redis)
    )
    return 0 if all(met) else 1


if __name__ == "__main__":
    raise SystemExit(main())
