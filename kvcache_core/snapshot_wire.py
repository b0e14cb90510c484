"""The wire format of a [`KVSnapshot`][kvcache_core.KVSnapshot]: bytes that can leave a process.

Why safetensors: it is a published, language-neutral container (an 8-byte little-endian header
length, a JSON header naming every tensor's dtype, shape and byte range, then the raw bytes)
that no reader can be tricked into executing, unlike pickle, which is never used here. A blob
written by [`snapshot_to_bytes`][kvcache_core.snapshot_wire.snapshot_to_bytes] is a valid
safetensors file, so other tools can read its tensors; kvcache's own reader is written here
rather than taken from the ``safetensors`` package because that package copies every tensor
twice on the way in and out, where this one copies once on the way out and not at all on the
way in.

What the header adds (``__metadata__``, key ``kvcache``, a JSON document): the format version,
the contract version, and the snapshot tree (pool kind, compute dtype, token count, typed meta
values, each part's name, dtype and shape, and the children such as SWA's window side or the
Mamba state). Key ``kvcache.checksum`` holds an XXH3-64 hash of that document, of the tensor
table and of every data byte. XXH3 (the ``xxhash`` package) rather than CRC-32 or BLAKE2: it
hashes at about 48 GB/s on this machine against 3.2 GB/s for zlib's CRC-32 and 8.8 GB/s for a
plain copy, so checking a blob costs a fraction of moving it. It guards against corruption in
transit or at rest, not against an attacker (a store that needs that authenticates its
connection).

Every check runs before a tensor is built, so a truncated, corrupted, oversized or foreign blob
raises [`SnapshotMismatchError`][kvcache_core.SnapshotMismatchError] naming what is wrong and
nothing reaches a pool.
"""

from __future__ import annotations

import ctypes
import json
import math
import struct
import sys
import warnings
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import torch
import xxhash

from .contracts.history import CONTRACT_VERSION
from .errors import SnapshotMismatchError, UnsupportedDtypeError

if TYPE_CHECKING:
    from .contracts.snapshot import KVSnapshot

__all__ = [
    "FORMAT_VERSION",
    "MAX_HEADER_BYTES",
    "MAX_DEPTH",
    "snapshot_from_bytes",
    "snapshot_to_bytes",
]

FORMAT_VERSION = 1
"""The version of the wire format this kvcache writes and reads; a reader refuses a newer one
(it cannot know what a newer writer meant) with a message naming both versions."""

MAX_HEADER_BYTES = 16 * 1024 * 1024
"""The largest JSON header accepted: a snapshot's header is a few KiB, so a length beyond this
is a foreign or corrupted blob, refused before a byte of it is read."""

MAX_DEPTH = 8
"""How deeply children may nest (the built-in pools use two levels): a bound, so a hostile
header cannot make the reader recurse without end."""

#: The data section starts at a multiple of this many bytes from the blob's start, and the
#: reader views tensors in place only when its address is a multiple too: torch's CPU copy
#: kernels (and ``LayerRows``' wide-element scatter) may load 16 bytes at a time with aligned
#: instructions, so a less aligned view would crash them. CPython's ``bytes`` of a snapshot's
#: size start 16-aligned, so zero-copy is the rule and the one-copy fallback the exception.
_ALIGN = 16
_META_KEY = "kvcache"
_SUM_KEY = "kvcache.checksum"
_SUM_PREFIX = "xxh3_64:"
_SUM_DIGITS = 16

# torch dtype name -> safetensors dtype code. A dtype without a code (e.g. float8_e4m3fnuz) is
# written as raw U8 bytes; kvcache's own header keeps its real dtype and shape either way.
_CODES: dict[str, str] = {
    "float64": "F64",
    "float32": "F32",
    "float16": "F16",
    "bfloat16": "BF16",
    "int64": "I64",
    "int32": "I32",
    "int16": "I16",
    "int8": "I8",
    "uint8": "U8",
    "uint16": "U16",
    "uint32": "U32",
    "uint64": "U64",
    "bool": "BOOL",
    "float8_e4m3fn": "F8_E4M3",
    "float8_e5m2": "F8_E5M2",
    "float8_e8m0fnu": "F8_E8M0",
    "complex64": "C64",
}


def _dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def _dtype_of(name: object, where: str) -> torch.dtype:
    value = getattr(torch, name, None) if isinstance(name, str) and name.isidentifier() else None
    if not isinstance(value, torch.dtype):
        raise SnapshotMismatchError(f"{where}: unknown dtype {name!r} (not a dtype of this torch)")
    return value


# -- meta values: JSON with tags for what JSON cannot tell apart (tuple from list, dtypes) ------
def _encode_meta(value: object, key: str) -> object:
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, tuple):
        return {"tuple": [_encode_meta(v, key) for v in value]}
    if isinstance(value, list):
        return {"list": [_encode_meta(v, key) for v in value]}
    if isinstance(value, torch.dtype):
        return {"dtype": _dtype_name(value)}
    if isinstance(value, Mapping) and all(isinstance(k, str) for k in value):
        return {"dict": {k: _encode_meta(v, key) for k, v in value.items()}}
    raise TypeError(
        f"snapshot meta {key!r} holds a {type(value).__name__}, which the wire format cannot "
        "carry (None, bool, int, float, str, tuple, list, str-keyed dict and torch.dtype can)"
    )


def _decode_meta(value: object, where: str) -> object:
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, dict) and len(value) == 1:
        (tag, inner), *_ = value.items()
        if tag in ("tuple", "list") and isinstance(inner, list):
            items = [_decode_meta(v, where) for v in inner]
            return tuple(items) if tag == "tuple" else items
        if tag == "dtype":
            return _dtype_of(inner, where)
        if tag == "dict" and isinstance(inner, dict):
            return {k: _decode_meta(v, where) for k, v in inner.items()}
    raise SnapshotMismatchError(f"{where}: meta value {value!r} is not a wire-format value")


# -- writing -------------------------------------------------------------------------------------
class _Writer:
    """Collects the tensors of a snapshot tree in header order, each once, as host bytes."""

    def __init__(self) -> None:
        self.tensors: list[tuple[str, torch.Tensor, str, list[int]]] = []

    def tree(self, snap: KVSnapshot, depth: int) -> dict[str, Any]:
        if depth > MAX_DEPTH:
            raise ValueError(f"snapshot children nest deeper than {MAX_DEPTH} levels")
        parts = []
        for name, tensor in snap.parts.items():
            key = f"t{len(self.tensors)}"
            host = tensor.detach()
            if host.device.type != "cpu":
                host = host.cpu()
            if host.layout is not torch.strided or host.is_quantized:
                raise UnsupportedDtypeError(
                    f"snapshot part {name!r} is a {host.layout} tensor; the wire format carries "
                    "dense tensors only"
                )
            host = host.contiguous()
            shape = list(host.shape)
            dtype = _dtype_name(host.dtype)
            self.tensors.append((key, host, dtype, shape))
            parts.append([name, key, dtype, shape])
        children = [
            [name, None if child is None else self.tree(child, depth + 1)]
            for name, child in snap.children.items()
        ]
        return {
            "kind": snap.pool_kind,
            "dtype": _dtype_name(snap.dtype),
            "tokens": snap.token_count,
            "meta": {k: _encode_meta(v, k) for k, v in snap.meta.items()},
            "parts": parts,
            "children": children,
        }


def _raw(tensor: torch.Tensor) -> Any:
    """The bytes of a contiguous CPU tensor as a buffer, without a copy (``b""`` when empty)."""
    nbytes = tensor.numel() * tensor.element_size()
    if nbytes == 0:
        return b""
    return (ctypes.c_char * nbytes).from_address(tensor.data_ptr())


def snapshot_to_bytes(snapshot: KVSnapshot) -> bytes:
    """The wire form of ``snapshot``: a safetensors blob with kvcache's header and checksum.

    One copy of the tensors' bytes (into the returned object) and one checksum pass over them;
    device tensors are brought to the host first.

    :raises TypeError: A meta value the format cannot carry (the message names its key).
    :raises UnsupportedDtypeError: A part that is not a dense tensor.
    """
    if sys.byteorder != "little":  # pragma: no cover - every platform torch ships for
        raise RuntimeError("the snapshot wire format is little-endian; this host is not")
    writer = _Writer()
    doc = {
        "format": FORMAT_VERSION,
        "contract": CONTRACT_VERSION,
        "snapshot": writer.tree(snapshot, 0),
    }
    # Widest elements first: every tensor then starts at a multiple of its element size (the
    # data section starts _ALIGN-aligned), so the reader can view each one in place.
    ordered = sorted(writer.tensors, key=lambda t: -t[1].element_size())
    entries: dict[str, Any] = {}
    buffers: list[Any] = []
    offset = 0
    for key, tensor, dtype, shape in ordered:
        raw = _raw(tensor)
        size = tensor.numel() * tensor.element_size()
        code = _CODES.get(dtype)
        entries[key] = {
            "dtype": code or "U8",
            "shape": shape if code else [size],
            "data_offsets": [offset, offset + size],
        }
        offset += size
        buffers.append(raw)
    meta_doc = json.dumps(doc, separators=(",", ":"))
    digest = xxhash.xxh3_64(_canonical(meta_doc, entries))
    for raw in buffers:
        digest.update(raw)
    checksum = f"{_SUM_PREFIX}{digest.hexdigest()}"
    full = {"__metadata__": {_META_KEY: meta_doc, _SUM_KEY: checksum}, **entries}
    text = json.dumps(full, separators=(",", ":")).encode()
    text += b" " * (-(8 + len(text)) % _ALIGN)  # the data section starts _ALIGN-aligned
    return b"".join([struct.pack("<Q", len(text)), text, *buffers])


def _canonical(meta_doc: str, entries: Mapping[str, Any]) -> bytes:
    """What the checksum covers besides the data: kvcache's header and the tensor table, in a
    form the reader rebuilds from what it parsed (so only the digits themselves are outside)."""
    return (meta_doc + json.dumps(entries, separators=(",", ":"))).encode()


# -- reading -------------------------------------------------------------------------------------
def _fail(what: str) -> SnapshotMismatchError:
    return SnapshotMismatchError(f"not a readable kvcache snapshot: {what}")


def _header(view: memoryview, max_bytes: int | None) -> tuple[dict[str, Any], int]:
    total = len(view)
    if max_bytes is not None and total > max_bytes:
        raise _fail(f"oversized: {total} bytes, more than the {max_bytes} allowed")
    if total < 8:
        raise _fail(f"truncated: {total} bytes, shorter than the 8-byte header length")
    (length,) = struct.unpack_from("<Q", view, 0)
    if length > MAX_HEADER_BYTES:
        raise _fail(
            f"header length {length} exceeds {MAX_HEADER_BYTES} bytes "
            "(a foreign or corrupted blob, not a safetensors snapshot)"
        )
    if 8 + length > total:
        raise _fail(f"truncated: the header needs {8 + length} bytes, the blob has {total}")
    try:
        header = json.loads(bytes(view[8 : 8 + length]))
    except (UnicodeDecodeError, ValueError) as exc:
        raise _fail(f"the header is not JSON ({exc}): a foreign or corrupted blob") from None
    if not isinstance(header, dict):
        raise _fail("the header is not a JSON object: a foreign or corrupted blob")
    return header, 8 + length


def _metadata(header: dict[str, Any]) -> tuple[dict[str, Any], str]:
    meta = header.get("__metadata__")
    if not isinstance(meta, dict) or _META_KEY not in meta:
        raise _fail("a safetensors header without kvcache metadata (a foreign file)")
    checksum = meta.get(_SUM_KEY)
    try:
        doc = json.loads(meta[_META_KEY])
    except (TypeError, ValueError) as exc:
        raise _fail(f"kvcache metadata is not JSON ({exc})") from None
    if not isinstance(doc, dict) or not isinstance(doc.get("format"), int):
        raise _fail("kvcache metadata has no format version")
    if doc["format"] != FORMAT_VERSION:
        raise _fail(
            f"format version {doc['format']}; this kvcache reads version {FORMAT_VERSION} "
            + ("(upgrade kvcache)" if doc["format"] > FORMAT_VERSION else "(rewrite the blob)")
        )
    if not isinstance(checksum, str) or not checksum.startswith(_SUM_PREFIX):
        raise _fail(f"no {_SUM_PREFIX[:-1]} checksum in the header")
    digits = checksum[len(_SUM_PREFIX) :]
    if len(digits) != _SUM_DIGITS or any(c not in "0123456789abcdef" for c in digits):
        raise _fail(f"malformed checksum {checksum!r}")
    contract = doc.get("contract")
    if not isinstance(contract, int) or contract > CONTRACT_VERSION:
        raise _fail(
            f"taken under contract {contract!r}; this kvcache implements contract "
            f"{CONTRACT_VERSION} and reads snapshots of it and older"
        )
    return doc, digits


def _entries(header: dict[str, Any], data_len: int) -> dict[str, tuple[str, list[int], int, int]]:
    """safetensors' own entries, checked: known dtype code, sizes that match, no gaps."""
    known = set(_CODES.values())
    out: dict[str, tuple[str, list[int], int, int]] = {}
    spans = []
    for key, entry in header.items():
        if key == "__metadata__":
            continue
        ok = (
            isinstance(entry, dict)
            and entry.get("dtype") in known
            and isinstance(entry.get("shape"), list)
            and all(isinstance(d, int) and d >= 0 for d in entry["shape"])
            and isinstance(entry.get("data_offsets"), list)
            and len(entry["data_offsets"]) == 2
            and all(isinstance(o, int) for o in entry["data_offsets"])
        )
        if not ok:
            raise _fail(f"tensor entry {key!r} is malformed")
        begin, end = entry["data_offsets"]
        if not 0 <= begin <= end:
            raise _fail(f"tensor {key!r} has byte range [{begin}, {end})")
        out[key] = (entry["dtype"], entry["shape"], begin, end)
        spans.append((begin, end, key))
    spans.sort()
    at = 0
    for begin, end, key in spans:
        if begin != at:
            raise _fail(f"tensor {key!r} starts at byte {begin}, expected {at} (gap or overlap)")
        at = end
    if at > data_len:
        raise _fail(f"truncated: the tensors need {at} data bytes, the blob holds {data_len}")
    if at < data_len:
        raise _fail(f"oversized: {data_len - at} bytes after the last tensor (a foreign tail)")
    return out


class _Reader:
    def __init__(
        self,
        entries: dict[str, tuple[str, list[int], int, int]],
        data: torch.Tensor,
        snapshot_type: type[KVSnapshot],
    ) -> None:
        self.entries = entries
        self.data = data
        self.snapshot_type = snapshot_type
        self.used: set[str] = set()

    def tree(self, node: object, depth: int, where: str) -> KVSnapshot:
        if depth > MAX_DEPTH:
            raise _fail(f"{where}: children nest deeper than {MAX_DEPTH} levels")
        if not isinstance(node, dict):
            raise _fail(f"{where}: not a snapshot record")
        kind, tokens = node.get("kind"), node.get("tokens")
        parts, children, meta = node.get("parts"), node.get("children"), node.get("meta")
        if not isinstance(kind, str) or not isinstance(tokens, int) or tokens < 0:
            raise _fail(f"{where}: pool kind or token count missing or invalid")
        if not (isinstance(parts, list) and isinstance(children, list) and isinstance(meta, dict)):
            raise _fail(f"{where}: parts, children or meta missing")
        tensors = {}
        for item in parts:
            if not (isinstance(item, list) and len(item) == 4 and isinstance(item[0], str)):
                raise _fail(f"{where}: malformed part record {item!r}")
            name, key, dtype_name, shape = item
            tensors[name] = self.tensor(key, _dtype_of(dtype_name, where), shape, f"{where}.{name}")
        kids: dict[str, KVSnapshot | None] = {}
        for item in children:
            if not (isinstance(item, list) and len(item) == 2 and isinstance(item[0], str)):
                raise _fail(f"{where}: malformed child record")
            name, child = item
            kids[name] = None if child is None else self.tree(child, depth + 1, f"{where}/{name}")
        return self.snapshot_type(
            pool_kind=kind,
            dtype=_dtype_of(node.get("dtype"), where),
            token_count=tokens,
            parts=tensors,
            children=kids,
            meta={k: _decode_meta(v, f"{where} meta {k!r}") for k, v in meta.items()},
        )

    def tensor(self, key: object, dtype: torch.dtype, shape: object, where: str) -> torch.Tensor:
        if not isinstance(key, str) or key not in self.entries or key in self.used:
            raise _fail(f"part {where} names tensor {key!r}, missing or used twice")
        if not (isinstance(shape, list) and all(isinstance(d, int) and d >= 0 for d in shape)):
            raise _fail(f"part {where} has malformed shape {shape!r}")
        self.used.add(key)
        code, st_shape, begin, end = self.entries[key]
        size = math.prod(shape) * dtype.itemsize
        expected = _CODES.get(_dtype_name(dtype))
        if code != (expected or "U8") or st_shape != (shape if expected else [size]):
            raise _fail(
                f"part {where} is {shape} {_dtype_name(dtype)} in kvcache's header but "
                f"{st_shape} {code} in the tensor table"
            )
        if end - begin != size:
            raise _fail(f"part {where}: {end - begin} bytes for {shape} {_dtype_name(dtype)}")
        raw = self.data[begin:end]
        if raw.numel() and begin % dtype.itemsize == 0:
            return raw.view(dtype).view(shape)
        # Misaligned (or empty): an own copy, still bit-exact.
        return (
            raw.clone().view(dtype).view(shape) if raw.numel() else torch.empty(shape, dtype=dtype)
        )


def snapshot_from_bytes(
    data: bytes | bytearray | memoryview,
    *,
    snapshot_type: type[KVSnapshot],
    max_bytes: int | None = None,
) -> KVSnapshot:
    """The snapshot in ``data``, after checking all of it; the inverse of
    [`snapshot_to_bytes`][kvcache_core.snapshot_wire.snapshot_to_bytes], bit for bit.

    Zero-copy for an immutable ``bytes`` object: the snapshot's tensors are read-only views of
    it (a pool's ``load_cpu_copy`` copies from them, never into them). A mutable buffer is
    copied once first, so the checksum vouches for bytes nobody can change afterwards.

    :param data: The blob, e.g. as a store's ``get`` returned it.
    :param snapshot_type: The class to build: [`KVSnapshot`][kvcache_core.KVSnapshot], which
        calls this as [`KVSnapshot.from_bytes`][kvcache_core.KVSnapshot.from_bytes] (passed in
        so that the byte form never imports the type it serves: no import cycle).
    :param max_bytes: Refuse a blob larger than this (a store's or an engine's own limit).
    :raises SnapshotMismatchError: The blob is truncated, oversized, corrupted (checksum),
        foreign (not safetensors, or no kvcache header), of a newer format or contract, or
        internally inconsistent; the message says which.
    """
    if not (
        isinstance(data, bytes) or (isinstance(data, memoryview) and isinstance(data.obj, bytes))
    ):
        if not isinstance(data, (bytes, bytearray, memoryview)):
            raise SnapshotMismatchError(
                f"expected the bytes of a snapshot, got {type(data).__name__}"
            )
        data = bytes(data)
    view = memoryview(data).cast("B")
    header, start = _header(view, max_bytes)
    doc, digits = _metadata(header)
    entries = _entries(header, len(view) - start)
    table = {k: v for k, v in header.items() if k != "__metadata__"}
    try:
        canonical = _canonical(header["__metadata__"][_META_KEY], table)
    except UnicodeEncodeError:  # a JSON escape decoded to a lone surrogate: not what we wrote
        raise _fail("the header holds text that is not valid UTF-8 (a corrupted escape)") from None
    digest = xxhash.xxh3_64(canonical)
    digest.update(view[start:])
    computed = digest.hexdigest()
    if computed != digits:
        raise _fail(
            f"checksum mismatch (stored xxh3_64 {digits}, computed {computed}): the blob was "
            "corrupted in transit or at rest"
        )
    with warnings.catch_warnings():  # the buffer is immutable bytes: read-only views are the point
        warnings.simplefilter("ignore", UserWarning)
        flat = (
            torch.frombuffer(view, dtype=torch.uint8, offset=start)
            if len(view) > start
            else torch.empty(0, dtype=torch.uint8)
        )
    if flat.data_ptr() % _ALIGN:
        flat = flat.clone()  # torch's own allocations are 64-aligned
    reader = _Reader(entries, flat, snapshot_type)
    snapshot = reader.tree(doc.get("snapshot"), 0, "snapshot")
    if reader.used != set(entries):
        raise _fail(f"tensors {sorted(set(entries) - reader.used)} belong to no part")
    return snapshot
