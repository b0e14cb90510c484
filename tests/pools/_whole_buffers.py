"""Whole-buffer models of every built-in pool, shared by the state machines and the rejection
table in ``test_whole_buffers.py``.

Why whole buffers: a pool that writes one stray row (a neighbour, another layer, the other half
of a composite pool) passes every test that reads back only the rows it wrote. Here each pool
kind has a *harness* that keeps an ``expected`` copy of every byte of every buffer and updates
it from what a call is specified to do (a write, a reload, a page granted), never from what the
pool did; after every step the real buffers must equal it byte for byte. Row 0 of every buffer
is padding (writes for tokens without a window slot or without device residency land there on
purpose, several at once), so it is the one row not compared.

A harness knows three things about its pool: its buffers (``buffers``, every tensor indexed by
slot along dim 1), how to write random content at some token slots through a chosen location
form (``write``), and what a token's content is (``token_rows``/``put_token_rows``), which is
what an offload must carry and a reload must put back at the new slots.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

import torch
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from kvcache_core import KVWriteLoc, PoolConfig
from kvcache_plugins import dsa, hisparse, mamba, mha, mla, swa

FP8 = getattr(torch, "float8_e4m3fn", torch.bfloat16)


@dataclass(frozen=True)
class Layer:
    layer_id: int


def as_bytes(t: torch.Tensor) -> torch.Tensor:
    """``[dim0, rows, bytes per row]`` view of the bytes of a buffer (bit-exact comparison);
    a 1-D table is one "layer" of one-element rows."""
    t = t.contiguous()
    if t.dim() == 1:
        t = t.reshape(1, -1)
    return t.reshape(t.shape[0], t.shape[1], -1).view(torch.uint8)


def clone_all(buffers: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    return {name: t.clone() for name, t in buffers.items()}


def differences(actual: dict[str, torch.Tensor], expected: dict[str, torch.Tensor]) -> list[str]:
    """Human-readable list of (buffer, layer, row) that differ, row 0 (padding) excluded."""
    out: list[str] = []
    for name, want in expected.items():
        got = as_bytes(actual[name])[:, 1:]
        diff = (got != as_bytes(want)[:, 1:]).any(-1)
        for layer, row in diff.nonzero().tolist()[:5]:
            out.append(f"{name}: layer {layer} row {row + 1}")
    return out


def assert_same_buffers(actual: dict[str, torch.Tensor], expected: dict[str, torch.Tensor]) -> None:
    assert actual.keys() == expected.keys()
    bad = differences(actual, expected)
    assert not bad, "buffers differ from the model: " + ", ".join(bad)


def _rand(gen: torch.Generator, shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
    return torch.randn(shape, generator=gen).to(dtype)


def _loc(slots: torch.Tensor, mode: str) -> torch.Tensor | KVWriteLoc:
    """The location forms every pool accepts: a bare tensor, a record, a record whose
    ``full_loc`` overrides a nonsense ``loc`` (full-attention pools must use ``full_loc``)."""
    if mode == "bare":
        return slots
    if mode == "writeloc":
        return KVWriteLoc(loc=slots)
    if mode == "full_loc":
        return KVWriteLoc(loc=torch.full_like(slots, 10**6), full_loc=slots)
    raise AssertionError(mode)


# -- harnesses --------------------------------------------------------------------------------
class Harness:
    """Base: a pool, its allocator and the model of every buffer."""

    kind = ""
    modes: tuple[str, ...] = ("bare", "writeloc", "full_loc")

    def __init__(self, page_size: int) -> None:
        self.page_size = page_size
        self.pool, self.alloc = self.build(page_size)
        self.expected = clone_all(self.buffers())

    def build(self, page_size: int) -> tuple[Any, Any]:
        raise NotImplementedError

    def buffers(self) -> dict[str, torch.Tensor]:
        raise NotImplementedError

    def write(self, slots: torch.Tensor, mode: str, gen: torch.Generator) -> None:
        raise NotImplementedError

    def token_rows(self, slots: torch.Tensor) -> dict[str, torch.Tensor]:
        """The model's content of tokens ``slots`` (what an offload must carry)."""
        return {n: self.expected[n][:, slots].clone() for n in self.token_buffers()}

    def put_token_rows(self, slots: torch.Tensor, rows: dict[str, torch.Tensor]) -> None:
        """What a reload of ``rows`` at the new ``slots`` must leave in the buffers."""
        for n in self.token_buffers():
            self.expected[n][:, slots] = rows[n]

    def token_buffers(self) -> tuple[str, ...]:
        return tuple(self.buffers())

    # allocation hooks (HiSparse fills pages it grants residency to)
    def before_alloc(self, allocated: set[int]) -> object:
        return None

    def after_alloc(self, token: object) -> None:
        return None


class MHAHarness(Harness):
    kind = "mha"

    def build(self, page_size: int) -> tuple[Any, Any]:
        cfg = PoolConfig(
            size=16 * page_size,
            page_size=page_size,
            dtype=torch.bfloat16,
            layer_num=2,
            head_num=2,
            head_dim=4,
            v_head_dim=3,
            start_layer=1,
        )
        return mha.create(cfg)

    def buffers(self) -> dict[str, torch.Tensor]:
        return {"k": self.pool._k.data, "v": self.pool._v.data}

    def write(self, slots: torch.Tensor, mode: str, gen: torch.Generator) -> None:
        pool, n = self.pool, slots.numel()
        for local in range(pool.layer_num):
            k = _rand(gen, (n, pool.head_num, pool.head_dim), pool.dtype)
            v = _rand(gen, (n, pool.head_num, pool.v_head_dim), pool.dtype)
            pool.set_kv_buffer(Layer(pool.start_layer + local), _loc(slots, mode), k, v)
            self.expected["k"][local, slots] = k
            self.expected["v"][local, slots] = v


class MLAHarness(Harness):
    kind = "mla"
    modes = ("bare", "writeloc", "full_loc", "mla", "mla-writeloc")

    def config(self, page_size: int) -> PoolConfig:
        return PoolConfig(
            size=16 * page_size,
            page_size=page_size,
            dtype=torch.bfloat16,
            layer_num=2,
            kv_lora_rank=5,
            qk_rope_head_dim=3,
            index_head_dim=4,
            start_layer=0,
            options={"index_dtype": FP8},
        )

    def build(self, page_size: int) -> tuple[Any, Any]:
        return mla.create(self.config(page_size))

    def buffers(self) -> dict[str, torch.Tensor]:
        return {"latent": self.pool._latent.data}

    def _write_latent(self, slots: torch.Tensor, mode: str, gen: torch.Generator) -> None:
        pool, n, rank = self.pool, slots.numel(), self.pool.kv_lora_rank
        for local in range(pool.layer_num):
            latent = _rand(gen, (n, 1, pool.latent_dim), pool.dtype)
            layer = Layer(pool.start_layer + local)
            if mode.startswith("mla"):
                loc = _loc(slots, "writeloc" if mode.endswith("writeloc") else "bare")
                pool.set_mla_kv_buffer(layer, loc, latent[..., :rank], latent[..., rank:])
            else:
                pool.set_kv_buffer(layer, _loc(slots, mode), latent, torch.zeros(n, 2))
            self._expect_latent(local, slots, latent)

    def _expect_latent(self, local: int, slots: torch.Tensor, latent: torch.Tensor) -> None:
        self.expected["latent"][local, slots] = latent

    def write(self, slots: torch.Tensor, mode: str, gen: torch.Generator) -> None:
        self._write_latent(slots, mode, gen)


class DSAHarness(MLAHarness):
    kind = "dsa"

    def build(self, page_size: int) -> tuple[Any, Any]:
        return dsa.create(self.config(page_size))

    def buffers(self) -> dict[str, torch.Tensor]:
        return {
            **super().buffers(),
            "index_k": self.pool._index_k.data,
            "index_k_scale": self.pool._index_scale.data,
        }

    def write(self, slots: torch.Tensor, mode: str, gen: torch.Generator) -> None:
        self._write_latent(slots, mode, gen)
        pool, n = self.pool, slots.numel()
        for local in range(pool.layer_num):
            keys = _rand(gen, (n, pool.index_head_dim), pool.index_dtype)
            scales = torch.rand(n, generator=gen) + 0.5
            pool.set_index_k_scale_buffer(pool.start_layer + local, slots, keys, scales[:, None])
            stored = keys.view(torch.uint8) if pool.index_store_dtype == torch.uint8 else keys
            self.expected["index_k"][local, slots] = stored
            self.expected["index_k_scale"][local, slots] = scales


class HiSparseHarness(DSAHarness):
    """Store, device, indexer; the device rows follow the table, and granting residency to a
    page that holds allocated tokens fills it from the store (docs/pools/hisparse.md)."""

    kind = "hisparse"

    def build(self, page_size: int) -> tuple[Any, Any]:
        cfg = replace(self.config(page_size), size=8 * page_size, hisparse_ratio=2)
        return hisparse.create(cfg)

    def buffers(self) -> dict[str, torch.Tensor]:
        return {**super().buffers(), "device": self.pool._device_latent.data}

    def table(self) -> torch.Tensor:
        return self.alloc.logical_to_device

    def _expect_latent(self, local: int, slots: torch.Tensor, latent: torch.Tensor) -> None:
        self.expected["latent"][local, slots] = latent
        dev = self.table()[slots]
        self.expected["device"][local, dev[dev >= 0]] = latent[dev >= 0]

    def token_buffers(self) -> tuple[str, ...]:
        return ("latent", "index_k", "index_k_scale")

    def token_rows(self, slots: torch.Tensor) -> dict[str, torch.Tensor]:
        rows = super().token_rows(slots)  # a token's content is its device row when resident
        dev = self.table()[slots]
        resident = dev >= 0
        rows["latent"][:, resident] = self.expected["device"][:, dev[resident]]
        return rows

    def put_token_rows(self, slots: torch.Tensor, rows: dict[str, torch.Tensor]) -> None:
        super().put_token_rows(slots, rows)
        dev = self.table()[slots]
        resident = dev >= 0
        self.expected["device"][:, dev[resident]] = rows["latent"][:, resident]

    def before_alloc(self, allocated: set[int]) -> object:
        return self.table().clone(), set(allocated)

    def after_alloc(self, token: object) -> None:
        before, allocated = token  # type: ignore[misc]
        after, P = self.table(), self.page_size
        for page in range(1, self.pool.size // P + 1):
            slots = torch.arange(page * P, (page + 1) * P)
            granted = int(before[page * P]) < 0 <= int(after[page * P])
            if granted and allocated & set(slots.tolist()):
                self.expected["device"][:, after[slots]] = self.expected["latent"][:, slots]


class SWAHarness(Harness):
    """Full rows at full slots; window rows at the table's window slots (0: none, padding)."""

    kind = "swa"
    modes = ("bare", "writeloc", "full_loc", "swa_loc")

    def build(self, page_size: int) -> tuple[Any, Any]:
        cfg = PoolConfig(
            size=16 * page_size,
            page_size=page_size,
            dtype=torch.float16,
            layer_num=3,
            head_num=2,
            head_dim=4,
            swa_layer_ids=(1,),
            swa_size=10 * page_size,
            swa_head_num=1,
            swa_head_dim=3,
        )
        return swa.create(cfg)

    def buffers(self) -> dict[str, torch.Tensor]:
        pool = self.pool
        return {
            "full_k": pool.full_pool._k.data,
            "full_v": pool.full_pool._v.data,
            "swa_k": pool.swa_pool._k.data,
            "swa_v": pool.swa_pool._v.data,
        }

    def table(self) -> torch.Tensor:
        return self.alloc.full_to_swa_index_mapping

    def write(self, slots: torch.Tensor, mode: str, gen: torch.Generator) -> None:
        pool, n = self.pool, slots.numel()
        window = self.table()[slots]
        for layer_id in range(pool.layer_num):
            sub, local, is_window = pool._resolve(layer_id)
            k = _rand(gen, (n, sub.head_num, sub.head_dim), pool.dtype)
            v = _rand(gen, (n, sub.head_num, sub.v_head_dim), pool.dtype)
            if mode == "swa_loc":
                loc: torch.Tensor | KVWriteLoc = KVWriteLoc(loc=slots, swa_loc=window)
            elif mode == "full_loc" and is_window:
                loc = KVWriteLoc(loc=slots, full_loc=torch.full_like(slots, 10**6))
            else:
                loc = _loc(slots, mode)
            pool.set_kv_buffer(Layer(layer_id), loc, k, v)
            side, rows = ("swa", window) if is_window else ("full", slots)
            keep = rows > 0
            self.expected[f"{side}_k"][local, rows[keep]] = k[keep]
            self.expected[f"{side}_v"][local, rows[keep]] = v[keep]

    def token_rows(self, slots: torch.Tensor) -> dict[str, torch.Tensor]:
        window = self.table()[slots]
        mask = window > 0
        return {
            "full_k": self.expected["full_k"][:, slots].clone(),
            "full_v": self.expected["full_v"][:, slots].clone(),
            "swa_k": self.expected["swa_k"][:, window[mask]].clone(),
            "swa_v": self.expected["swa_v"][:, window[mask]].clone(),
            "mask": mask,
        }

    def put_token_rows(self, slots: torch.Tensor, rows: dict[str, torch.Tensor]) -> None:
        self.expected["full_k"][:, slots] = rows["full_k"]
        self.expected["full_v"][:, slots] = rows["full_v"]
        window = self.table()[slots]
        assert torch.equal(window > 0, rows["mask"]), "reload must recreate exactly the mask"
        self.expected["swa_k"][:, window[rows["mask"]]] = rows["swa_k"]
        self.expected["swa_v"][:, window[rows["mask"]]] = rows["swa_v"]


class MambaHarness(Harness):
    """Attention KV by token slot; conv and temporal state by request slot."""

    kind = "mamba"

    def build(self, page_size: int) -> tuple[Any, Any]:
        cfg = PoolConfig(
            size=16 * page_size,
            page_size=page_size,
            dtype=torch.bfloat16,
            layer_num=3,
            head_num=1,
            head_dim=4,
            mamba_layer_ids=(1,),
            mamba_size=6,
            conv_state_shapes=((2, 3),),
            temporal_state_shape=(2, 2),
        )
        return mamba.create(cfg)

    def buffers(self) -> dict[str, torch.Tensor]:
        att = self.pool.attention_pool
        out = {"k": att._k.data, "v": att._v.data}
        out.update({f"state_{n}": b.data for n, b in self.pool.mamba_pool._buffers.items()})
        return out

    def token_buffers(self) -> tuple[str, ...]:
        return ("k", "v")

    def state_buffers(self) -> tuple[str, ...]:
        return tuple(n for n in self.buffers() if n.startswith("state_"))

    def write(self, slots: torch.Tensor, mode: str, gen: torch.Generator) -> None:
        pool, att, n = self.pool, self.pool.attention_pool, slots.numel()
        for local, layer_id in enumerate(pool.attention_layer_ids):
            k = _rand(gen, (n, att.head_num, att.head_dim), pool.dtype)
            v = _rand(gen, (n, att.head_num, att.v_head_dim), pool.dtype)
            pool.set_kv_buffer(Layer(layer_id), _loc(slots, mode), k, v)
            self.expected["k"][local, slots] = k
            self.expected["v"][local, slots] = v

    def write_state(self, request: int, gen: torch.Generator) -> None:
        """What a Mamba kernel does: write the state views of one request slot."""
        for local, layer_id in enumerate(self.pool.mamba_layer_ids):
            convs, temporal = self.pool.get_mamba_state(layer_id)
            for name, view in zip(self.state_buffers(), (*convs, temporal), strict=True):
                value = _rand(gen, tuple(view.shape[1:]), view.dtype)
                view[request] = value
                self.expected[name][local, request] = value

    def clear_state(self, request: int) -> None:
        self.pool.clear_slots(torch.tensor([request]))
        for name in self.state_buffers():
            self.expected[name][:, request] = 0

    def state_rows(self, request: int) -> dict[str, torch.Tensor]:
        return {n: self.expected[n][:, request].clone() for n in self.state_buffers()}

    def put_state_rows(self, request: int, rows: dict[str, torch.Tensor]) -> None:
        for n in self.state_buffers():
            self.expected[n][:, request] = rows[n]


HARNESSES: dict[str, Callable[[int], Harness]] = {
    "mha": MHAHarness,
    "mla": MLAHarness,
    "dsa": DSAHarness,
    "hisparse": HiSparseHarness,
    "swa": SWAHarness,
    "mamba": MambaHarness,
}


# -- the state machine ----------------------------------------------------------------------------
@dataclass
class Request:
    slots: list[int]
    mamba: int | None = None


class WholeBufferMachine(RuleBasedStateMachine):
    """Requests come, are written (every location form), grow by extend and decode, are
    offloaded, freed and reloaded into new slots, and keep growing and being written after
    that; after every step every buffer equals the model byte for byte."""

    harness_class: Callable[[int], Harness] = MHAHarness
    page_size = 1

    def __init__(self) -> None:
        super().__init__()
        self.h = self.harness_class(self.page_size)
        self.gen = torch.Generator().manual_seed(0)
        self.requests: list[Request] = []

    # -- helpers --------------------------------------------------------------------------
    def allocated(self) -> set[int]:
        return {s for r in self.requests for s in r.slots}

    def pick(self, i: int) -> Request:
        return self.requests[i % len(self.requests)]

    def alloc_tokens(self, call: Callable[[], torch.Tensor | None]) -> torch.Tensor | None:
        token = self.h.before_alloc(self.allocated())
        out = call()
        if out is not None:
            self.h.after_alloc(token)
        return out

    def extend_call(self, req: Request | None, grow: int) -> torch.Tensor | None:
        n = 0 if req is None else len(req.slots)
        last = -1 if req is None else req.slots[-1]
        return self.alloc_tokens(
            lambda: self.h.alloc.alloc_extend(
                torch.tensor([n]), torch.tensor([n + grow]), torch.tensor([last]), grow
            )
        )

    def can_grow(self, req: Request) -> bool:
        return True

    def new_mamba_slot(self) -> int | None:
        return None

    # -- rules ----------------------------------------------------------------------------
    @initialize(n=st.integers(1, 7))
    def first_request(self, n: int) -> None:
        """Start with one request, so that every rule is enabled from the first step."""
        self.new_request(n)

    @rule(n=st.integers(1, 7))
    def new_request(self, n: int) -> None:
        out = self.extend_call(None, n)
        if out is not None:
            self.requests.append(Request(out.tolist(), self.new_mamba_slot()))

    @precondition(lambda self: self.requests)
    @rule(i=st.integers(0, 50), mode=st.sampled_from(range(5)), tail=st.integers(0, 7))
    def write(self, i: int, mode: int, tail: int) -> None:
        req = self.pick(i)
        slots = torch.tensor(req.slots[-tail:] if tail else req.slots)
        self.h.write(slots, self.h.modes[mode % len(self.h.modes)], self.gen)

    @precondition(lambda self: self.requests)
    @rule(i=st.integers(0, 50), mode=st.sampled_from(range(5)))
    def decode(self, i: int, mode: int) -> None:
        req = self.pick(i)
        if not self.can_grow(req):
            return
        n = len(req.slots)
        out = self.alloc_tokens(
            lambda: self.h.alloc.alloc_decode(torch.tensor([n + 1]), torch.tensor(req.slots[-1:]))
        )
        if out is not None:
            req.slots.append(int(out[0]))
            self.h.write(out, self.h.modes[mode % len(self.h.modes)], self.gen)

    @precondition(lambda self: self.requests)
    @rule(i=st.integers(0, 50), grow=st.integers(1, 5))
    def extend(self, i: int, grow: int) -> None:
        req = self.pick(i)
        if not self.can_grow(req):
            return
        out = self.extend_call(req, grow)
        if out is not None:
            req.slots.extend(out.tolist())

    @precondition(lambda self: self.requests)
    @rule(i=st.integers(0, 50))
    def free(self, i: int) -> None:
        req = self.pick(i)
        self.h.alloc.free(torch.tensor(req.slots))
        self.free_mamba(req)
        self.requests.remove(req)

    def free_mamba(self, req: Request) -> None:
        return None

    @precondition(lambda self: self.requests)
    @rule(i=st.integers(0, 50), with_state=st.booleans(), filler=st.booleans())
    def offload_and_reload(self, i: int, with_state: bool, filler: bool) -> None:
        """Retraction and resume, as engines do them (docs/contract.md)."""
        req = self.pick(i)
        old = torch.tensor(req.slots)
        rows = self.h.token_rows(old)
        mamba_in = self.snapshot_state_arg(req, with_state)
        snap = self.h.alloc.get_cpu_copy(old, mamba_indices=mamba_in)
        self.h.alloc.free(old)
        self.requests.remove(req)
        pad = self.extend_call(None, self.page_size) if filler else None  # land elsewhere
        new = self.extend_call(None, old.numel())
        if pad is not None:
            self.h.alloc.free(pad)
        if new is None:  # no room now: the request stays offloaded (dropped from the model)
            self.drop_state(req, with_state)
            return
        mamba_out = self.reload_state_arg(req, with_state)
        self.h.alloc.load_cpu_copy(snap, new, mamba_indices=mamba_out)
        self.h.put_token_rows(new, rows)
        self.requests.append(Request(new.tolist(), req.mamba))
        self.after_reload(self.requests[-1], with_state)

    # Mamba hooks (no-ops elsewhere)
    def snapshot_state_arg(self, req: Request, with_state: bool) -> torch.Tensor | None:
        return None

    def reload_state_arg(self, req: Request, with_state: bool) -> torch.Tensor | None:
        return None

    def drop_state(self, req: Request, with_state: bool) -> None:
        return None

    def after_reload(self, req: Request, with_state: bool) -> None:
        return None

    @invariant()
    def buffers_match_the_model(self) -> None:
        assert_same_buffers(self.h.buffers(), self.h.expected)


class SWAMachine(WholeBufferMachine):
    harness_class = SWAHarness

    def can_grow(self, req: Request) -> bool:
        # A request whose last token left the window has nothing to attend from: engines never
        # decode it (the window is always the request's tail).
        return bool(self.h.alloc.full_to_swa_index_mapping[req.slots[-1]] > 0)

    @precondition(lambda self: self.requests)
    @rule(i=st.integers(0, 50), k=st.integers(1, 4))
    def leave_window(self, i: int, k: int) -> None:
        """Leading whole pages slide out of the window (never the last page)."""
        req, P = self.pick(i), self.page_size
        pages = list(dict.fromkeys(s // P for s in req.slots))
        gone = set(pages[: min(k, len(pages) - 1)])
        if gone:
            self.h.alloc.free_swa(torch.tensor([s for s in req.slots if s // P in gone]))

    @precondition(lambda self: self.requests)
    @rule(i=st.integers(0, 50))
    def reload_managing_window_slots(self, i: int) -> None:
        """A reload that takes full and window slots itself, records the pairs with
        ``set_full_to_swa_mapping`` and loads through the pool (docs/pools/swa.md)."""
        req, P, alloc = self.pick(i), self.page_size, self.h.alloc
        old = torch.tensor(req.slots)
        rows = self.h.token_rows(old)
        snap = alloc.get_cpu_copy(old)
        alloc.free(old)
        self.requests.remove(req)
        n = old.numel()
        new = alloc.full_attn_allocator.alloc_extend(
            torch.tensor([0]), torch.tensor([n]), torch.tensor([-1]), n
        )
        if new is None:
            return
        masked = new[rows["mask"]]
        pages, inv = torch.unique(masked // P, return_inverse=True)
        window = alloc.swa_attn_allocator.alloc(pages.numel() * P)
        if window is None:
            alloc.full_attn_allocator.free(new)
            return
        if masked.numel():
            first = window.reshape(-1, P)[:, 0]
            alloc.set_full_to_swa_mapping(masked, first[inv] + masked % P)
        self.h.pool.load_cpu_copy(snap, new)
        self.h.put_token_rows(new, rows)
        self.requests.append(Request(new.tolist()))


class HiSparseMachine(WholeBufferMachine):
    harness_class = HiSparseHarness

    @precondition(lambda self: self.requests)
    @rule(i=st.integers(0, 50))
    def evict_from_device(self, i: int) -> None:
        self.h.alloc.free_device(torch.tensor(self.pick(i).slots))

    @precondition(lambda self: self.requests)
    @rule(i=st.integers(0, 50))
    def bring_back_to_device(self, i: int) -> None:
        req = self.pick(i)
        self.alloc_tokens(lambda: self.h.alloc.alloc_device(torch.tensor(req.slots)))

    @precondition(lambda self: self.requests)
    @rule(i=st.integers(0, 50))
    def reload_cold(self, i: int) -> None:
        """Reload into logical slots that are not resident (the store and indexer only); a
        later decode or extend grants the last page again, filled from the store."""
        req, P, alloc = self.pick(i), self.page_size, self.h.alloc
        old = torch.tensor(req.slots)
        rows = self.h.token_rows(old)
        snap = alloc.get_cpu_copy(old)
        alloc.free(old)
        self.requests.remove(req)
        n = old.numel()
        got = alloc.alloc_logical_only(-(-n // P) * P)
        if got is None:
            return
        new = got[:n]
        alloc.load_cpu_copy(snap, new)
        self.h.put_token_rows(new, rows)
        self.requests.append(Request(new.tolist()))


class MambaMachine(WholeBufferMachine):
    harness_class = MambaHarness

    def new_mamba_slot(self) -> int | None:
        got = self.h.alloc.mamba_allocator.alloc(1)
        if got is None:
            return None
        slot = int(got[0])
        assert isinstance(self.h, MambaHarness)
        self.h.clear_state(slot)
        return slot

    def free_mamba(self, req: Request) -> None:
        if req.mamba is not None:
            self.h.alloc.mamba_allocator.free(torch.tensor([req.mamba]))

    @precondition(lambda self: any(r.mamba is not None for r in self.requests))
    @rule(i=st.integers(0, 50))
    def write_state(self, i: int) -> None:
        owners = [r for r in self.requests if r.mamba is not None]
        req = owners[i % len(owners)]
        assert isinstance(self.h, MambaHarness) and req.mamba is not None
        self.h.write_state(req.mamba, self.gen)

    def snapshot_state_arg(self, req: Request, with_state: bool) -> torch.Tensor | None:
        if not with_state or req.mamba is None:
            return None
        assert isinstance(self.h, MambaHarness)
        self._saved_state = self.h.state_rows(req.mamba)
        return torch.tensor(req.mamba)  # 0-d, as engines pass a request's slot

    def reload_state_arg(self, req: Request, with_state: bool) -> torch.Tensor | None:
        if not with_state or req.mamba is None:
            return None  # the engine kept the state in its slot: nothing to move
        self.h.alloc.mamba_allocator.free(torch.tensor([req.mamba]))
        got = self.h.alloc.mamba_allocator.alloc(1)
        assert got is not None
        req.mamba = int(got[0])
        return got

    def drop_state(self, req: Request, with_state: bool) -> None:
        self.free_mamba(req)

    def after_reload(self, req: Request, with_state: bool) -> None:
        if with_state and req.mamba is not None:
            assert isinstance(self.h, MambaHarness)
            self.h.put_state_rows(req.mamba, self._saved_state)


def machine(kind: str, page_size: int) -> type[WholeBufferMachine]:
    """The state machine of one pool kind at one page size."""
    base = {"swa": SWAMachine, "hisparse": HiSparseMachine, "mamba": MambaMachine}.get(
        kind, WholeBufferMachine
    )
    return type(
        f"{kind.upper()}P{page_size}Machine",
        (base,),
        {"harness_class": HARNESSES[kind], "page_size": page_size},
    )
