"""Coverage-guided fuzzing of the snapshot reader (``KVSnapshot.from_bytes``) with atheris.

Run by ``make fuzz`` (minutes) and, for a few seconds, by ``tests/stores/test_wire_fuzz.py``;
arguments are libFuzzer's (corpus directories, ``-max_total_time=S``, ...). The property: for
any input, ``from_bytes`` returns a snapshot or raises ``SnapshotMismatchError``, nothing else;
a snapshot it accepts writes back to bytes it accepts again, bit for bit.

The first byte of an input picks how it is used: odd, the rest is a blob whose checksum is
recomputed first (so mutations reach the checks after the checksum, which random bytes almost
never pass); even, the rest as it is. The seed corpus, ``tests/fuzz/corpus``, holds small
valid blobs of every shape of snapshot (dtypes, children, meta) and what earlier runs found.
"""

from __future__ import annotations

import json
import struct
import sys

import atheris
import torch  # imported outside the instrumented block: only the reader is measured
import xxhash

with atheris.instrument_imports(include=["kvcache_core.snapshot_wire"]):
    from kvcache_core import snapshot_wire

from kvcache_core import KVSnapshot, SnapshotMismatchError


def reseal(blob: bytes) -> bytes | None:
    """``blob`` with its checksum made valid again, or None when there is no header to fix."""
    try:
        (n,) = struct.unpack_from("<Q", blob)
        header = json.loads(blob[8 : 8 + n])
        meta = header["__metadata__"]
        table = {k: v for k, v in header.items() if k != "__metadata__"}
        digest = xxhash.xxh3_64(
            (meta["kvcache"] + json.dumps(table, separators=(",", ":"))).encode()
        )
        digest.update(blob[8 + n :])
        meta["kvcache.checksum"] = f"xxh3_64:{digest.hexdigest()}"
        text = json.dumps(header, separators=(",", ":")).encode()
    except Exception:  # not a header this harness can fix: the input is used as it is
        return None
    text += b" " * (-(8 + len(text)) % 16)
    return struct.pack("<Q", len(text)) + text + blob[8 + n :]


def one_input(data: bytes) -> None:
    blob = data[1:]
    if data[:1] and data[0] & 1:
        blob = reseal(blob) or blob
    try:
        snap = KVSnapshot.from_bytes(blob)
    except SnapshotMismatchError:
        return
    again = snap.to_bytes()
    back = KVSnapshot.from_bytes(again)
    assert back.to_bytes() == again, "a snapshot read back writes different bytes"


def seeds() -> dict[str, bytes]:
    """The hand-made part of the corpus (``python tests/fuzz/fuzz_wire.py --seeds DIR``)."""
    gen = torch.Generator().manual_seed(0)
    child = KVSnapshot("mamba-state", torch.float32, 1, {"s": torch.randn(2, 3, generator=gen)})
    snaps = {
        "plain": KVSnapshot("mha", torch.bfloat16, 2, {"k": torch.ones(2, 2).bfloat16()}),
        "dtypes": KVSnapshot(
            "mix",
            torch.float16,
            3,
            {
                "f8": torch.zeros(3, 2, dtype=torch.float8_e4m3fn),
                "i8": torch.arange(6, dtype=torch.int8).view(3, 2),
                "b": torch.tensor([True, False]),
                "e": torch.empty(0, 4),
            },
            meta={"ids": (1, 2), "d": torch.float32, "m": {"a": [1.5, None, "x"]}},
        ),
        "children": KVSnapshot(
            "swa", torch.float32, 1, {"k": torch.ones(1)}, children={"mamba": child, "w": None}
        ),
    }
    return {name: b"\x00" + s.to_bytes() for name, s in snaps.items()} | {
        f"{name}-resealed": b"\x01" + s.to_bytes() for name, s in snaps.items()
    }


if __name__ == "__main__":
    if sys.argv[1:2] == ["--seeds"]:
        from pathlib import Path

        for name, blob in seeds().items():
            (Path(sys.argv[2]) / f"seed-{name}").write_bytes(blob)
        raise SystemExit(0)
    assert snapshot_wire.FORMAT_VERSION == 1
    atheris.Setup(sys.argv, one_input)
    atheris.Fuzz()
