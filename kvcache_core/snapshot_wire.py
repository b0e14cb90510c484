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

Every check runs before a tensor is built, so a truncated, corrupted, oversized, foreign or
hostile blob raises [`SnapshotMismatchError`][kvcache_core.SnapshotMismatchError] naming what is
wrong (never another exception type) and nothing reaches a pool. The reader holds a blob's
header to a schema before it trusts any of it, in time linear in the header: the JSON texts'
nesting, number of values and number lengths are measured with byte-level scans before they
are parsed (so no parse can recurse without end), then every field's type and range is
checked, dtype names are looked up in a fixed list (a hostile name never reaches
``getattr(torch, ...)``, which imports whole subsystems for some names), and the sizes are
bounded: at most `MAX_TENSORS` tensors, `MAX_DIMS` dimensions each, `MAX_HEADER_ITEMS` JSON
values and a `MAX_HEADER_BYTES` header. The writer holds itself to the same bounds, so
whatever ``to_bytes`` writes, ``from_bytes`` reads.

Why ``from_bytes`` copies: the tensors it returns live in memory of their own (one copy, made
while the checksum is computed over it), never in the caller's buffer: a part viewing an
immutable ``bytes`` object could be written to in place, changing an object Python promises is
constant (and, for the ``memory:`` store, the stored value itself).
"""

from __future__ import annotations

import ctypes
import json
import math
import re
import struct
import sys
import warnings
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch
import xxhash

from .contracts.history import CONTRACT_VERSION
from .errors import SnapshotMismatchError, UnsupportedDtypeError
from .hostmem import host_empty_cpu

if TYPE_CHECKING:
    from .contracts.snapshot import KVSnapshot

__all__ = [
    "DTYPE_NAMES",
    "FORMAT_VERSION",
    "MAX_DEPTH",
    "MAX_DIMS",
    "MAX_HEADER_BYTES",
    "MAX_HEADER_ITEMS",
    "MAX_META_DEPTH",
    "MAX_TENSORS",
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

MAX_META_DEPTH = 16
"""How deeply a meta value may nest (a tuple of lists of dicts ...): the same bound for values."""

MAX_TENSORS = 4096
"""The most tensors one blob may hold, children included (a built-in pool's snapshot holds at
most a handful). Reading costs tens of microseconds per tensor, so this bounds the time a
hostile header of empty tensors can take (well under a second) where 16 MiB of them took
seconds."""

MAX_DIMS = 16
"""The most dimensions a tensor may have (snapshots use up to five)."""

MAX_HEADER_ITEMS = 1 << 18
"""The most JSON values (numbers, strings, lists, objects) either JSON text of a header may
hold: the tensor table of `MAX_TENSORS` tensors needs about 40,000; a bound on the work of
parsing and checking a header, counted before it is parsed."""

DTYPE_NAMES: tuple[str, ...] = (
    "float64",
    "float32",
    "float16",
    "bfloat16",
    "int64",
    "int32",
    "int16",
    "int8",
    "uint8",
    "uint16",
    "uint32",
    "uint64",
    "bool",
    "complex128",
    "complex64",
    "complex32",
    "float8_e4m3fn",
    "float8_e5m2",
    "float8_e4m3fnuz",
    "float8_e5m2fnuz",
    "float8_e8m0fnu",
)
"""The dtypes a snapshot may carry (parts, compute dtype, dtypes in meta): those of this torch
among these names. A name outside this list is refused by the writer and the reader alike,
before any lookup in torch."""

#: torch's own allocations, and the host blocks a decoded snapshot lives in, start at multiples
#: of this; the data section of a blob starts at a multiple of it too, and the writer puts the
#: widest elements first, so every tensor of a blob this module wrote is a view at an offset its
#: element size divides (torch's copy kernels may load 16 bytes at a time with aligned
#: instructions). A foreign blob's misaligned tensor is copied once more, on its own.
_ALIGN = 16
_META_KEY = "kvcache"
_SUM_KEY = "kvcache.checksum"
_SUM_PREFIX = "xxh3_64:"
_SUM_DIGITS = 16
#: Bytes copied and hashed at a time: small enough to stay in cache between the two.
_CHUNK = 512 << 10
#: Every size and offset in a header, and every tensor's size with its zero dimensions read as
#: one, stays below this (so no shape or byte count can overflow torch's 64-bit sizes).
_SIZE_LIMIT = 1 << 62
#: The longest run of digits accepted in a header (Python's own limit for int(str)); a bound on
#: what turning numbers into ints costs, whichever Python reads it.
_MAX_DIGITS = 4300
#: The tensor table's JSON nests three deep ({name: {"shape": [...]}}). The kvcache document:
#: two levels to the top snapshot record, three more per level of children, then inside the
#: deepest record a part's shape (three) or its meta dict and a value of up to
#: MAX_META_DEPTH + 1 tagged containers (two each).
_TABLE_DEPTH = 3
_DOC_DEPTH = 2 + 3 * MAX_DEPTH + max(3, 1 + 2 * (MAX_META_DEPTH + 1))

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
_CODE_SIZES = {
    "F64": 8,
    "F32": 4,
    "F16": 2,
    "BF16": 2,
    "I64": 8,
    "I32": 4,
    "I16": 2,
    "I8": 1,
    "U8": 1,
    "U16": 2,
    "U32": 4,
    "U64": 8,
    "BOOL": 1,
    "F8_E4M3": 1,
    "F8_E5M2": 1,
    "F8_E8M0": 1,
    "C64": 8,
}


def _known_dtypes() -> dict[str, torch.dtype]:
    """The allow-list as this torch has it: each name looked up once, here, by a constant."""
    found = {}
    for name in DTYPE_NAMES:
        value = getattr(torch, name, None)
        if isinstance(value, torch.dtype):
            found[name] = value
    return found


_DTYPES = _known_dtypes()


def _dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def _wire_dtype(dtype: torch.dtype, what: str) -> str:
    """``dtype``'s name if the format carries it, else the writer's refusal."""
    name = _dtype_name(dtype)
    if _DTYPES.get(name) is not dtype:
        raise UnsupportedDtypeError(
            f"{what} is {dtype}, which the snapshot wire format does not carry "
            f"(it carries {', '.join(_DTYPES)})"
        )
    return name


def _dtype_of(name: object, where: str) -> torch.dtype:
    value = _DTYPES.get(name) if isinstance(name, str) else None
    if value is None:
        shown = name if isinstance(name, str) and len(name) <= 40 else f"a {type(name).__name__}"
        raise _fail(f"{where}: unknown dtype {shown!r} (not one of the dtypes the format carries)")
    return value


def _shape_problem(shape: object, itemsize: int) -> str | None:
    """Why ``shape`` is not one the format carries, or None."""
    if not isinstance(shape, list) or len(shape) > MAX_DIMS:
        return f"a shape is a list of at most {MAX_DIMS} sizes"
    bound = itemsize
    for d in shape:
        if type(d) is not int or d < 0:
            return "sizes are non-negative integers"
        bound *= max(d, 1)
        if bound > _SIZE_LIMIT:
            return f"the sizes' product is over {_SIZE_LIMIT} bytes"
    return None


# -- meta values: JSON with tags for what JSON cannot tell apart (tuple from list, dtypes) ------
def _encode_meta(value: object, key: str, depth: int = 0) -> object:
    if depth > MAX_META_DEPTH:
        raise ValueError(f"snapshot meta {key!r} nests deeper than {MAX_META_DEPTH} levels")
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, tuple):
        return {"tuple": [_encode_meta(v, key, depth + 1) for v in value]}
    if isinstance(value, list):
        return {"list": [_encode_meta(v, key, depth + 1) for v in value]}
    if isinstance(value, torch.dtype):
        return {"dtype": _wire_dtype(value, f"snapshot meta {key!r}")}
    if isinstance(value, Mapping) and all(isinstance(k, str) for k in value):
        return {"dict": {k: _encode_meta(v, key, depth + 1) for k, v in value.items()}}
    raise TypeError(
        f"snapshot meta {key!r} holds a {type(value).__name__}, which the wire format cannot "
        "carry (None, bool, int, float, str, tuple, list, str-keyed dict and torch.dtype can)"
    )


def _decode_meta(value: object, where: str, depth: int = 0) -> object:
    if depth > MAX_META_DEPTH:
        raise _fail(f"{where}: meta value nests deeper than {MAX_META_DEPTH} levels")
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, dict) and len(value) == 1:
        (tag, inner), *_ = value.items()
        if tag in ("tuple", "list") and isinstance(inner, list):
            items = [_decode_meta(v, where, depth + 1) for v in inner]
            return tuple(items) if tag == "tuple" else items
        if tag == "dtype":
            return _dtype_of(inner, where)
        if tag == "dict" and isinstance(inner, dict):
            return {k: _decode_meta(v, where, depth + 1) for k, v in inner.items()}
    shown = repr(value) if len(repr(value)) <= 80 else f"a {type(value).__name__}"
    raise _fail(f"{where}: meta value {shown} is not a wire-format value")


# -- bounded JSON ------------------------------------------------------------------------------
_STRINGS = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*"')
_LONG_NUMBER = re.compile(rb"[0-9]{%d,}" % (_MAX_DIGITS + 1))
_NOT_BRACKETS = bytes(b for b in range(256) if b not in b"[]{}")
_ONE_KIND = bytes.maketrans(b"{}", b"[]")


def _scan(text: bytes, depth: int, what: str) -> None:
    """Refuse a JSON text whose parse could cost more than its length says: nesting deeper than
    ``depth``, more than ``MAX_HEADER_ITEMS`` values, a number longer than ``_MAX_DIGITS``
    digits. Byte-level passes only (no recursion), each linear in ``text``."""
    bare = _STRINGS.sub(b'""', text)  # what is left has no string to hide a bracket or comma
    if _LONG_NUMBER.search(bare):
        raise _fail(f"{what} holds a number longer than {_MAX_DIGITS} digits")
    items = bare.count(b",") + bare.count(b"[") + bare.count(b"{")
    if items > MAX_HEADER_ITEMS:
        raise _fail(f"{what} holds more than {MAX_HEADER_ITEMS} JSON values")
    brackets = bare.translate(_ONE_KIND, _NOT_BRACKETS)  # at most 2 * MAX_HEADER_ITEMS bytes
    for _ in range(depth):
        if not brackets:
            return
        inner = brackets.replace(b"[]", b"")  # one level of nesting gone per pass
        if inner == brackets:
            raise _fail(f"{what} is not JSON (its brackets do not pair up)")
        brackets = inner
    if brackets:
        raise _fail(f"{what} nests deeper than {depth} levels")


def _unique(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out = dict(pairs)
    if len(out) != len(pairs):
        raise ValueError("a key appears twice in one object")
    return out


def _parse(text: bytes, depth: int, what: str) -> object:
    _scan(text, depth, what)
    try:
        return json.loads(text, object_pairs_hook=_unique)
    except (UnicodeDecodeError, ValueError, RecursionError) as exc:
        raise _fail(f"{what} is not JSON ({exc}): a foreign or corrupted blob") from None


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
            if len(self.tensors) >= MAX_TENSORS:
                raise ValueError(f"a snapshot holds more than {MAX_TENSORS} tensors")
            host = tensor.detach()
            if host.device.type != "cpu":
                host = host.cpu()
            if host.layout is not torch.strided or host.is_quantized:
                raise UnsupportedDtypeError(
                    f"snapshot part {name!r} is a {host.layout} tensor; the wire format carries "
                    "dense tensors only"
                )
            dtype = _wire_dtype(host.dtype, f"snapshot part {name!r}")
            shape = list(host.shape)
            problem = _shape_problem(shape, host.element_size())
            if problem:
                raise ValueError(f"snapshot part {name!r} has shape {shape}: {problem}")
            host = host.contiguous()
            self.tensors.append((key, host, dtype, shape))
            parts.append([name, key, dtype, shape])
        children = [
            [name, None if child is None else self.tree(child, depth + 1)]
            for name, child in snap.children.items()
        ]
        return {
            "kind": snap.pool_kind,
            "dtype": _wire_dtype(snap.dtype, "the snapshot's dtype"),
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
    :raises UnsupportedDtypeError: A part that is not a dense tensor, or a dtype outside
        ``DTYPE_NAMES``.
    :raises ValueError: A snapshot past the format's bounds (children or meta nested too deep,
        too many tensors or dimensions, a header too large): ``from_bytes`` would refuse it.
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
    if len(text) > MAX_HEADER_BYTES:
        raise ValueError(
            f"the snapshot's header would be {len(text)} bytes, more than the "
            f"{MAX_HEADER_BYTES} a reader accepts"
        )
    try:  # the reader's bounds on both JSON texts (cheap: a header is a few KiB)
        _scan(text, _TABLE_DEPTH, "the header")
        _scan(meta_doc.encode(), _DOC_DEPTH, "kvcache metadata")
    except SnapshotMismatchError as exc:
        raise ValueError(f"the snapshot is past the wire format's bounds: {exc}") from None
    return b"".join([struct.pack("<Q", len(text)), text, *buffers])


def _canonical(meta_doc: str, entries: Mapping[str, Any]) -> bytes:
    """What the checksum covers besides the data: kvcache's header and the tensor table, in a
    form the reader rebuilds from what it parsed (so only the digits themselves are outside)."""
    return (meta_doc + json.dumps(entries, separators=(",", ":"))).encode()


# -- reading -------------------------------------------------------------------------------------
def _fail(what: str) -> SnapshotMismatchError:
    return SnapshotMismatchError(f"not a readable kvcache snapshot: {what}")


def _as_view(data: object, max_bytes: int | None) -> memoryview:
    """``data`` as a flat memoryview of bytes, copying nothing a size check can refuse first."""
    if not isinstance(data, (bytes, bytearray, memoryview)):
        raise SnapshotMismatchError(f"expected the bytes of a snapshot, got {type(data).__name__}")
    try:
        view = memoryview(data)
        if max_bytes is not None and view.nbytes > max_bytes:
            raise _fail(f"oversized: {view.nbytes} bytes, more than the {max_bytes} allowed")
        if not view.c_contiguous:  # a strided view: its bytes in order, once
            return memoryview(view.tobytes())
        return view.cast("B") if view.format != "B" or view.ndim != 1 else view
    except (ValueError, TypeError) as exc:  # a released view, a format that will not cast
        raise SnapshotMismatchError(f"cannot read the snapshot's buffer: {exc}") from None


def _header(view: memoryview) -> tuple[bytes, int]:
    total = len(view)
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
    return bytes(view[8 : 8 + length]), 8 + length


@dataclass(frozen=True)
class _Entry:
    """One tensor of the safetensors table, checked."""

    code: str
    shape: list[int]
    begin: int
    end: int


def _table(header: object, data_len: int) -> tuple[dict[str, _Entry], str, object]:
    """The outer header, checked against its schema: the tensor table (known dtype codes,
    sizes that match, no gaps or overlaps), kvcache's document and the checksum digits."""
    if not isinstance(header, dict):
        raise _fail("the header is not a JSON object: a foreign or corrupted blob")
    meta = header.get("__metadata__")
    if not isinstance(meta, dict) or _META_KEY not in meta:
        raise _fail("a safetensors header without kvcache metadata (a foreign file)")
    doc, checksum = meta.get(_META_KEY), meta.get(_SUM_KEY)
    if not isinstance(doc, str):
        raise _fail("kvcache metadata is not a JSON text")
    if len(header) - 1 > MAX_TENSORS:
        raise _fail(f"{len(header) - 1} tensors, more than the {MAX_TENSORS} a snapshot may hold")
    out: dict[str, _Entry] = {}
    for key, entry in header.items():
        if key == "__metadata__":
            continue
        shown = key if len(key) <= 40 else key[:40] + "..."
        if not isinstance(entry, dict) or set(entry) != {"dtype", "shape", "data_offsets"}:
            raise _fail(f"tensor entry {shown!r} is malformed")
        code, shape, offsets = entry["dtype"], entry["shape"], entry["data_offsets"]
        size = _CODE_SIZES.get(code) if isinstance(code, str) else None
        problem = "unknown dtype code" if size is None else _shape_problem(shape, size)
        if problem is None and not (
            isinstance(offsets, list)
            and len(offsets) == 2
            and all(type(o) is int and 0 <= o <= _SIZE_LIMIT for o in offsets)
        ):
            problem = "data_offsets is not two byte positions"
        if problem is not None:
            raise _fail(f"tensor entry {shown!r} is malformed ({problem})")
        begin, end = offsets
        if begin > end or end - begin != math.prod(shape) * size:  # type: ignore[operator]
            raise _fail(f"tensor {shown!r} has byte range [{begin}, {end}) for shape {shape}")
        out[key] = _Entry(code, shape, begin, end)
    at = 0
    for key, e in sorted(out.items(), key=lambda item: (item[1].begin, item[1].end)):
        if e.begin != at:
            raise _fail(f"tensor {key!r} starts at byte {e.begin}, expected {at} (gap or overlap)")
        at = e.end
    if at > data_len:
        raise _fail(f"truncated: the tensors need {at} data bytes, the blob holds {data_len}")
    if at < data_len:
        raise _fail(f"oversized: {data_len - at} bytes after the last tensor (a foreign tail)")
    return out, doc, checksum


def _digits(checksum: object) -> str:
    if not isinstance(checksum, str) or not checksum.startswith(_SUM_PREFIX):
        raise _fail(f"no {_SUM_PREFIX[:-1]} checksum in the header")
    digits = checksum[len(_SUM_PREFIX) :]
    if len(digits) != _SUM_DIGITS or any(c not in "0123456789abcdef" for c in digits):
        raise _fail(f"malformed checksum {checksum[:40]!r}")
    return digits


def _version(doc: object) -> dict[str, Any]:
    if not isinstance(doc, dict) or type(doc.get("format")) is not int:
        raise _fail("kvcache metadata has no format version")
    if doc["format"] != FORMAT_VERSION:
        raise _fail(
            f"format version {doc['format']}; this kvcache reads version {FORMAT_VERSION} "
            + ("(upgrade kvcache)" if doc["format"] > FORMAT_VERSION else "(rewrite the blob)")
        )
    contract = doc.get("contract")
    if not isinstance(contract, int) or type(contract) is bool or contract > CONTRACT_VERSION:
        raise _fail(
            f"taken under contract {contract!r}; this kvcache implements contract "
            f"{CONTRACT_VERSION} and reads snapshots of it and older"
        )
    if set(doc) != {"format", "contract", "snapshot"}:
        raise _fail("kvcache metadata holds fields this format version does not have")
    return doc


@dataclass(frozen=True)
class _Part:
    name: str
    dtype: torch.dtype
    shape: list[int]
    begin: int
    end: int


@dataclass(frozen=True)
class _Node:
    """A snapshot record of the header, checked whole; the tensors come after the checksum."""

    kind: str
    dtype: torch.dtype
    tokens: int
    meta: dict[str, object]
    parts: list[_Part]
    children: list[tuple[str, _Node | None]]


_NODE_KEYS = frozenset({"kind", "dtype", "tokens", "meta", "parts", "children"})


class _Schema:
    """Checks kvcache's document against the tensor table; every tensor used exactly once."""

    def __init__(self, entries: dict[str, _Entry]) -> None:
        self.entries = entries
        self.used: set[str] = set()

    def node(self, record: object, depth: int, where: str) -> _Node:
        if depth > MAX_DEPTH:
            raise _fail(f"{where}: children nest deeper than {MAX_DEPTH} levels")
        if not isinstance(record, dict) or set(record) != _NODE_KEYS:
            raise _fail(f"{where}: not a snapshot record")
        kind, tokens = record["kind"], record["tokens"]
        parts, children, meta = record["parts"], record["children"], record["meta"]
        if not isinstance(kind, str) or type(tokens) is not int or not 0 <= tokens <= _SIZE_LIMIT:
            raise _fail(f"{where}: pool kind or token count missing or invalid")
        if not (isinstance(parts, list) and isinstance(children, list) and isinstance(meta, dict)):
            raise _fail(f"{where}: parts, children or meta missing")
        checked = [self.part(item, f"{where}") for item in parts]
        if len({p.name for p in checked}) != len(checked):
            raise _fail(f"{where}: two parts share a name")
        kids: list[tuple[str, _Node | None]] = []
        for item in children:
            if not (isinstance(item, list) and len(item) == 2 and isinstance(item[0], str)):
                raise _fail(f"{where}: malformed child record")
            name, child = item
            kids.append(
                (name, None if child is None else self.node(child, depth + 1, f"{where}/{name}"))
            )
        if len({name for name, _ in kids}) != len(kids):
            raise _fail(f"{where}: two children share a name")
        return _Node(
            kind,
            _dtype_of(record["dtype"], where),
            tokens,
            {k: _decode_meta(v, f"{where} meta {k[:40]!r}") for k, v in meta.items()},
            checked,
            kids,
        )

    def part(self, item: object, where: str) -> _Part:
        if not (isinstance(item, list) and len(item) == 4 and isinstance(item[0], str)):
            raise _fail(f"{where}: malformed part record")
        name, key, dtype_name, shape = item
        at = f"{where}.{name[:40]}"
        dtype = _dtype_of(dtype_name, at)
        if not isinstance(key, str) or key not in self.entries or key in self.used:
            raise _fail(f"part {at} names tensor {str(key)[:40]!r}, missing or used twice")
        problem = _shape_problem(shape, dtype.itemsize)
        if problem:
            raise _fail(f"part {at} has a malformed shape ({problem})")
        self.used.add(key)
        entry = self.entries[key]
        size = math.prod(shape) * dtype.itemsize
        expected = _CODES.get(_dtype_name(dtype))
        if entry.code != (expected or "U8") or entry.shape != (shape if expected else [size]):
            raise _fail(
                f"part {at} is {shape} {_dtype_name(dtype)} in kvcache's header but "
                f"{entry.shape} {entry.code} in the tensor table"
            )
        if entry.end - entry.begin != size:
            raise _fail(f"part {at}: {entry.end - entry.begin} bytes for {shape} {dtype}")
        return _Part(name, dtype, shape, entry.begin, entry.end)


def _checked_copy(view: memoryview, start: int, canonical: bytes, digits: str) -> torch.Tensor:
    """The data section copied into memory of its own, hashed as it is copied (each chunk
    read back from cache), and refused unless the hash is the header's."""
    size = len(view) - start
    digest = xxhash.xxh3_64(canonical)
    flat = host_empty_cpu((size,), torch.uint8)
    if size:
        with warnings.catch_warnings():  # only read from, for the one copy below
            warnings.simplefilter("ignore", UserWarning)
            source = torch.frombuffer(view, dtype=torch.uint8, count=size, offset=start)
        src, dst = source.data_ptr(), flat.data_ptr()
        for at in range(0, size, _CHUNK):
            n = min(_CHUNK, size - at)
            ctypes.memmove(dst + at, src + at, n)
            digest.update((ctypes.c_char * n).from_address(dst + at))
        del source
    computed = digest.hexdigest()
    if computed != digits:
        raise _fail(
            f"checksum mismatch (stored xxh3_64 {digits}, computed {computed}): the blob was "
            "corrupted in transit or at rest"
        )
    return flat


def _build(node: _Node, flat: torch.Tensor, snapshot_type: type[KVSnapshot]) -> KVSnapshot:
    parts = {}
    for p in node.parts:
        raw = flat[p.begin : p.end]
        if not raw.numel():
            parts[p.name] = torch.empty(p.shape, dtype=p.dtype)
        elif p.begin % p.dtype.itemsize == 0:
            parts[p.name] = raw.view(p.dtype).view(p.shape)
        else:  # a foreign writer's misaligned tensor: its own aligned copy, still bit-exact
            parts[p.name] = raw.clone().view(p.dtype).view(p.shape)
    return snapshot_type(
        pool_kind=node.kind,
        dtype=node.dtype,
        token_count=node.tokens,
        parts=parts,
        children={
            name: None if child is None else _build(child, flat, snapshot_type)
            for name, child in node.children
        },
        meta=node.meta,
    )


def snapshot_from_bytes(
    data: bytes | bytearray | memoryview,
    *,
    snapshot_type: type[KVSnapshot],
    max_bytes: int | None = None,
) -> KVSnapshot:
    """The snapshot in ``data``, after checking all of it; the inverse of
    [`snapshot_to_bytes`][kvcache_core.snapshot_wire.snapshot_to_bytes], bit for bit.

    The header is checked against the format's schema and bounds first, then the data is
    copied once into memory the snapshot owns while its checksum is computed, and only then
    are tensors made (views of that copy). Nothing of ``data`` is kept: the caller may reuse
    or drop it, and writing to the snapshot's tensors changes nothing else.

    :param data: The blob, e.g. as a store's ``get`` returned it: ``bytes``, ``bytearray`` or
        a ``memoryview`` of any buffer (a strided one is read in order).
    :param snapshot_type: The class to build: [`KVSnapshot`][kvcache_core.KVSnapshot], which
        calls this as [`KVSnapshot.from_bytes`][kvcache_core.KVSnapshot.from_bytes] (passed in
        so that the byte form never imports the type it serves: no import cycle).
    :param max_bytes: Refuse a blob larger than this (a store's or an engine's own limit),
        before anything of it is copied.
    :raises SnapshotMismatchError: The only exception for a bad blob: truncated, oversized,
        corrupted (checksum), foreign (not safetensors, or no kvcache header), of a newer
        format or contract, past the format's bounds, or internally inconsistent; the message
        says which.
    """
    view = _as_view(data, max_bytes)
    text, start = _header(view)
    header = _parse(text, _TABLE_DEPTH, "the header")
    entries, meta_doc, checksum = _table(header, len(view) - start)
    try:
        doc_bytes = meta_doc.encode()
        assert isinstance(header, dict)  # _table refused anything else
        table = {k: v for k, v in header.items() if k != "__metadata__"}
        canonical = _canonical(meta_doc, table)
    except UnicodeEncodeError:  # a JSON escape decoded to a lone surrogate: not what we wrote
        raise _fail("the header holds text that is not valid UTF-8 (a corrupted escape)") from None
    doc = _version(_parse(doc_bytes, _DOC_DEPTH, "kvcache metadata"))
    digits = _digits(checksum)
    schema = _Schema(entries)
    tree = schema.node(doc["snapshot"], 0, "snapshot")
    if schema.used != set(entries):
        unused = sorted(set(entries) - schema.used)
        raise _fail(f"tensors {unused[:8]}{' ...' if len(unused) > 8 else ''} belong to no part")
    flat = _checked_copy(view, start, canonical, digits)
    return _build(tree, flat, snapshot_type)
