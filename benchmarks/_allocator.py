"""Section 2 of ``make bench``: allocator cycles per second, and host syncs per call.

Figures (issue 9, part 3), each the median of interleaved runs in this process:

- ``alloc(256) + free(256)`` of the token allocator against **sglang's algorithm**
  (:class:`SglangAlgorithm`, re-implemented below), target >= 3.5x; the same rate against the
  issue's absolute 290k cycles/s; against sglang's real ``TokenToKVPoolAllocator`` when
  ``sglang`` is importable (``make interop`` builds a venv that has it); the eager-checks
  variant and the naive ``torch.cat`` free list, informational.
- The SWA and HiSparse allocators' cycles against the same algorithm on two sides
  (:class:`SglangPairedAlgorithm`), target >= 2x (issue 18); SWA's also against sglang's real
  ``SWATokenToKVPoolAllocator`` when ``sglang`` is importable, target >= 2x.
- A decode step (issue 18): 64 requests, one new token each, ``alloc(1)`` per request at page
  size 1, against sglang's real token allocator (and its algorithm), target >= 2x; and
  ``alloc_decode`` of 64 requests at page size 16 against the code before issue 18
  (:func:`_decode_before_issue_18`, kept here as the baseline), target >= 2x.
- Host syncs per ``alloc`` and ``free`` call of every allocator, and per settle, counted with
  the CUDA-free proxy the tests use (``tests/allocators/_host_syncs.py``).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

import torch
from _report import figure, informational, interleaved, median_of

# ----------------------------------------------------------------------------- 2. allocator

TARGET_RATIO = 3.5  # vs sglang's algorithm (issue 9)
TARGET_RATE = 290e3  # cycles/s on the issue's machine
TARGET_COMPOSITE = 2.0  # SWA / HiSparse alloc+free vs sglang (issue 18)
TARGET_DECODE = 2.0  # 64 x alloc(1) vs sglang's token allocator (issue 18)


class NaiveFreeList:
    """A tensor of free slots, sliced on alloc, concatenated on every free."""

    def __init__(self, size: int) -> None:
        self.free_slots = torch.arange(1, size + 1, dtype=torch.int64)

    def alloc(self, n: int) -> torch.Tensor | None:
        if n > self.free_slots.numel():
            return None
        out, self.free_slots = self.free_slots[:n], self.free_slots[n:]
        return out

    def free(self, indices: torch.Tensor) -> None:
        self.free_slots = torch.cat((self.free_slots, indices))


class SglangAlgorithm:
    """sglang's token allocator algorithm (``TokenToKVPoolAllocator`` with ``need_sort``), written
    here from how it works, not copied: ``free_pages`` is sliced on alloc; a free outside a
    free group concatenates the ids onto ``release_pages`` (inside one, it collects them and
    ``free_group_end`` frees their concatenation); an alloc that finds ``free_pages`` short
    first merges ``release_pages`` into it and sorts. No check of any kind on free."""

    def __init__(self, size: int) -> None:
        self.size = size
        self.clear()

    def clear(self) -> None:
        self.free_pages = torch.arange(1, self.size + 1, dtype=torch.int64)
        self.release_pages = torch.empty(0, dtype=torch.int64)
        self.is_not_in_free_group = True
        self.free_group: list[torch.Tensor] = []

    def available_size(self) -> int:
        return len(self.free_pages) + len(self.release_pages)

    def merge_and_sort_free(self) -> None:
        if len(self.release_pages) > 0:
            merged = torch.cat((self.free_pages, self.release_pages))
            self.free_pages = torch.sort(merged).values
            self.release_pages = torch.empty(0, dtype=torch.int64)

    def alloc(self, need_size: int) -> torch.Tensor | None:
        if need_size > len(self.free_pages):
            self.merge_and_sort_free()
        if need_size > len(self.free_pages):
            return None
        out = self.free_pages[:need_size]
        self.free_pages = self.free_pages[need_size:]
        return out

    def free(self, free_index: torch.Tensor) -> None:
        if free_index.numel() == 0:
            return
        if self.is_not_in_free_group:
            self.release_pages = torch.cat((self.release_pages, free_index))
        else:
            self.free_group.append(free_index)

    def free_group_begin(self) -> None:
        self.is_not_in_free_group = False
        self.free_group = []

    def free_group_end(self) -> None:
        self.is_not_in_free_group = True
        if self.free_group:
            self.free(torch.cat(self.free_group))


class SglangPairedAlgorithm:
    """sglang's two-sided allocators at page size 1 (SWA: full and window; HiSparse: logical and
    device), same algorithm: a :class:`SglangAlgorithm` per side and a table from first-side
    to second-side slots (0: none). ``alloc`` checks both sides' room, takes from both and
    records the pairs; ``free`` frees the first side, then the table's non-zero entries on the
    second side (a boolean selection: one host sync per call on a GPU), and zeroes them."""

    def __init__(self, size: int, second_size: int) -> None:
        self.first = SglangAlgorithm(size)
        self.second = SglangAlgorithm(second_size)
        self.mapping = torch.zeros(size + 2, dtype=torch.int64)

    def alloc(self, need_size: int) -> torch.Tensor | None:
        if need_size > self.first.available_size():
            return None
        if need_size > self.second.available_size():
            return None
        first = self.first.alloc(need_size)
        second = self.second.alloc(need_size)
        assert first is not None and second is not None
        self.mapping[first] = second
        return first

    def free(self, free_index: torch.Tensor) -> None:
        if free_index.numel() == 0:
            return
        self.first.free(free_index)
        second = self.mapping[free_index]
        second = second[second > 0]
        self.second.free(second)
        self.mapping[free_index] = 0
        assert self.first.available_size() <= self.first.size
        assert self.second.available_size() <= self.second.size


def _import_sglang_token_allocator() -> Any:
    """sglang's ``TokenToKVPoolAllocator`` class (see :func:`_import_sglang`)."""
    return _import_sglang()[0]


def _import_sglang() -> tuple[Any, Any, Any]:
    """sglang's ``TokenToKVPoolAllocator``, ``SWATokenToKVPoolAllocator`` and ``SWAKVPool``
    classes. A plain import first; when that fails for a missing dependency (the interop venv
    installs sglang with ``--no-deps``: no triton), with the interop run's stand-ins for those
    modules (``interop/_stubs.py``, same settings as ``interop/differential.py``), which are
    taken off ``sys.meta_path`` again right after the import so that later sections import as
    usual."""

    def load() -> tuple[Any, Any, Any]:
        from sglang.srt.mem_cache.allocator.swa import SWATokenToKVPoolAllocator
        from sglang.srt.mem_cache.allocator.token import TokenToKVPoolAllocator
        from sglang.srt.mem_cache.swa_memory_pool import SWAKVPool

        return TokenToKVPoolAllocator, SWATokenToKVPoolAllocator, SWAKVPool

    try:
        return load()
    except ImportError:
        pass
    import sys
    from pathlib import Path

    for name in [m for m in sys.modules if m == "sglang" or m.startswith("sglang.")]:
        del sys.modules[name]  # what the failed import left half-initialised
    interop = Path(__file__).resolve().parent.parent / "interop"
    sys.path.insert(0, str(interop))
    import _stubs  # type: ignore[import-not-found]

    before = list(sys.meta_path)
    _stubs.install(hollow=_stubs.SGLANG_HOLLOW, forced=_stubs.SGLANG_FORCED)
    try:
        return load()
    finally:
        sys.meta_path[:] = before
        sys.path.remove(str(interop))


def _real_sglang() -> tuple[Callable[[int], Any] | None, str]:
    """sglang's own token allocator when ``sglang`` is installed (and a note either way)."""
    token, _swa, note = _real_sglang_pair()
    return token, note


def _real_sglang_pair() -> tuple[Callable[[int], Any] | None, Callable[[int], Any] | None, str]:
    """Builders of sglang's own token and SWA allocators when ``sglang`` is installed (and a
    note either way). Both with ``need_sort=True``, sglang's setting for its paged path."""
    import importlib.util

    if importlib.util.find_spec("sglang") is None:
        return None, None, "sglang is not installed here (make interop builds a venv with it)"
    try:
        allocator, swa_allocator, swa_pool = _import_sglang()
        import sglang

        version = getattr(sglang, "__version__", "?")

        def make(size: int) -> Any:
            return allocator(size, torch.float32, "cpu", None, True)  # need_sort=True

        def make_swa(size: int) -> Any:
            pool = swa_pool(
                size=size,
                size_swa=size,
                page_size=1,
                dtype=torch.float32,
                head_num=1,
                head_dim=1,
                swa_attention_layer_ids=[1],
                full_attention_layer_ids=[0],
                enable_kvcache_transpose=False,
                device="cpu",
            )
            return swa_allocator(size, size, 1, torch.float32, "cpu", pool, need_sort=True)

        probe = make(16)
        probe.free(probe.alloc(4))
        probe = make_swa(16)
        probe.free(probe.alloc(4))
    except Exception as exc:  # an incomplete install: say so, measure the rest
        return None, None, f"sglang is installed but its allocators did not load: {exc!r}"[:160]
    return make, make_swa, f"sglang {version}"


def _config(kind: str, size: int, page_size: int) -> Any:
    from kvcache_core import PoolConfig

    common: dict[str, Any] = {"size": size, "page_size": page_size, "layer_num": 2}
    if kind == "swa":
        return PoolConfig(**common, swa_size=size, head_num=1, head_dim=1, swa_layer_ids=(1,))
    if kind == "hisparse":
        common["layer_num"] = 1
        return PoolConfig(
            **common, kv_lora_rank=1, qk_rope_head_dim=1, index_head_dim=1, hisparse_ratio=2
        )
    return PoolConfig(
        **common,
        head_num=1,
        head_dim=1,
        mamba_layer_ids=(1,),
        mamba_size=8,
        temporal_state_shape=(1,),
    )


def _make(kind: str, size: int, page_size: int = 1) -> Any:
    from kvcache_plugins import hisparse, mamba, swa

    module = {"swa": swa, "hisparse": hisparse, "mamba": mamba}[kind]
    return module.create(_config(kind, size, page_size))[1]


def _rate_table(quick: bool, repeat: int) -> None:
    from kvcache_core import PagedSlotAllocator
    from kvcache_plugins.mha import MHATokenToKVPool

    size, cycles, chunk = 65536, (2000 if quick else 20000), 256
    pool = MHATokenToKVPool(8, 1, torch.float32, 1, 1, 1)
    load = ", ".join(f"{x:.2f}" for x in os.getloadavg())
    print(
        f"== allocator: alloc({chunk}) + free({chunk}), {size} slots, {cycles} cycles, "
        f"median of {repeat} interleaved runs, {torch.get_num_threads()} threads, load {load}"
    )
    real, real_swa, real_note = _real_sglang_pair()
    makers: dict[str, Callable[[], Any]] = {
        "kvcache": lambda: PagedSlotAllocator(size, 1, pool),
        "sglang algorithm": lambda: SglangAlgorithm(size),
        "kvcache eager": lambda: PagedSlotAllocator(size, 1, pool, eager_checks=True),
        "naive cat": lambda: NaiveFreeList(size),
        "swa": lambda: _make("swa", size),
        "hisparse": lambda: _make("hisparse", size),
        "sglang paired": lambda: SglangPairedAlgorithm(size, size),
    }
    if real is not None:
        makers["sglang real"] = lambda: real(size)
    if real_swa is not None:
        makers["sglang real swa"] = lambda: real_swa(size)
    composite_cycles = max(cycles // 4, 200)
    composites = ("swa", "hisparse", "sglang paired", "sglang real swa")

    def run(name: str, make: Callable[[], Any]) -> Callable[[], None]:
        n = composite_cycles if name in composites else cycles
        fresh = [make() for _ in range(repeat)]  # built outside the timed region

        def cycle() -> None:
            allocator = fresh.pop()
            for _ in range(n):
                allocator.free(allocator.alloc(chunk))

        return cycle

    times = median_of(interleaved({name: run(name, make) for name, make in makers.items()}, repeat))
    rate = {name: cycles / t for name, t in times.items()}
    for name in composites:
        if name in times:
            rate[name] = composite_cycles / times[name]

    def k(name: str) -> str:
        return f"{rate[name] / 1e3:.1f}k/s"

    ours, base = rate["kvcache"], rate["sglang algorithm"]
    figure(
        "alloc+free vs sglang algorithm",
        k("kvcache"),
        f"sglang algo {k('sglang algorithm')}",
        ours / base,
        TARGET_RATIO,
    )
    figure(
        "alloc+free absolute",
        k("kvcache"),
        f"{TARGET_RATE / 1e3:.0f}k/s (issue target)",
        ours / TARGET_RATE,
        1.0,
    )
    if real is not None:
        figure(
            "alloc+free vs sglang (real)",
            k("kvcache"),
            f"{real_note} {k('sglang real')}",
            ours / rate["sglang real"],
            TARGET_RATIO,
        )
    else:
        print(f"  alloc+free vs sglang (real)   not measured: {real_note}")
    informational(
        "alloc+free, eager_checks",
        k("kvcache eager"),
        f"sglang algo {k('sglang algorithm')}",
        rate["kvcache eager"] / base,
        note="checks every free on the spot",
    )
    informational(
        "alloc+free vs naive cat",
        k("kvcache"),
        f"naive cat {k('naive cat')}",
        ours / rate["naive cat"],
    )
    paired = rate["sglang paired"]
    for name, label in (("swa", "SWA"), ("hisparse", "HiSparse")):
        figure(
            f"{label} alloc+free",
            k(name),
            f"sglang paired algo {k('sglang paired')}",
            rate[name] / paired,
            TARGET_COMPOSITE,
            note=f"page size 1, {composite_cycles} cycles",
        )
    if real_swa is not None:
        figure(
            "SWA alloc+free vs sglang (real)",
            k("swa"),
            f"{real_note} {k('sglang real swa')}",
            rate["swa"] / rate["sglang real swa"],
            TARGET_COMPOSITE,
            note="SWATokenToKVPoolAllocator, need_sort=True",
        )
    else:
        print(f"  SWA alloc+free vs sglang (real) not measured: {real_note}")


def _decode_table(quick: bool, repeat: int) -> None:
    """A decode step: 64 requests, one new token each. Page size 1: ``alloc(1)`` per request
    (how sglang's scheduler allocates at page size 1), against sglang. Page size 16: one
    ``alloc_decode`` call for the 64 requests, every request continuing its last page but
    one in 16 (calls per second; no peer on CPU: sglang's runs a GPU kernel)."""
    from kvcache_core import PagedSlotAllocator
    from kvcache_plugins.mha import MHATokenToKVPool

    requests, size = 64, 65536
    steps = 128 if quick else 1000  # 64,000 tokens at most: the pool never runs short
    pool = MHATokenToKVPool(8, 1, torch.float32, 1, 1, 1)
    real, real_note = _real_sglang()
    makers: dict[str, Callable[[], Any]] = {
        "kvcache": lambda: PagedSlotAllocator(size, 1, pool),
        "sglang algorithm": lambda: SglangAlgorithm(size),
    }
    if real is not None:
        makers["sglang real"] = lambda: real(size)

    def run(make: Callable[[], Any]) -> Callable[[], None]:
        fresh = [make() for _ in range(repeat)]

        def step() -> None:
            alloc = fresh.pop().alloc
            for _ in range(steps):
                for _ in range(requests):
                    alloc(1)

        return step

    times = median_of(interleaved({name: run(make) for name, make in makers.items()}, repeat))
    rate = {name: steps / t for name, t in times.items()}
    print(
        f"== decode step: {requests} requests x alloc(1), page size 1, {steps} steps, "
        f"median of {repeat} interleaved runs"
    )

    def k(name: str) -> str:
        return f"{rate[name] / 1e3:.2f}k steps/s"

    if real is not None:
        figure(
            "decode 64 x alloc(1) vs sglang",
            k("kvcache"),
            f"{real_note} {k('sglang real')}",
            rate["kvcache"] / rate["sglang real"],
            TARGET_DECODE,
        )
    else:
        print(f"  decode 64 x alloc(1) vs sglang  not measured: {real_note}")
    informational(
        "decode 64 x alloc(1) vs algo",
        k("kvcache"),
        f"sglang algo {k('sglang algorithm')}",
        rate["kvcache"] / rate["sglang algorithm"],
    )
    _alloc_decode_line(quick, repeat)


def _decode_before_issue_18() -> type:
    """``PagedSlotAllocator`` with ``alloc_decode`` as it was before issue 18 (the baseline of
    that issue's target, kept here so that the ratio is measured in one run): per-element
    ``int()`` conversions, a Python loop per pass, ``torch.tensor(list)`` and a gather,
    reduction and read back of the free marks."""
    from kvcache_core import AllocatorError, PagedSlotAllocator

    class DecodeBeforeIssue18(PagedSlotAllocator):
        def alloc_decode(self, seq_lens: torch.Tensor, last_loc: torch.Tensor) -> Any:
            seqs = [int(x) for x in seq_lens.reshape(-1).tolist()]
            lasts = [int(x) for x in last_loc.reshape(-1).tolist()]
            if len(seqs) != len(lasts):
                raise AllocatorError("seq_lens and last_loc must have the same length")
            P = self.page_size
            free_ids = self._free  # the old code's own bookkeeping
            needs_page = [(s - 1) % P == 0 for s in seqs]
            checked: list[tuple[int, int]] = []
            for s, last, fresh in zip(seqs, lasts, needs_page, strict=True):
                if s < 1:
                    raise AllocatorError(f"seq_len must be >= 1 for decode, got {s}")
                if s > 1 and (self.check_every_last_loc or not fresh):
                    checked.append((last, s - 1))
            if checked:
                for last, before in checked:
                    if last < P or last >= self.size + P or last % P != (before - 1) % P:
                        raise AllocatorError(f"last_loc {last} cannot be the last slot")
                self.check_frees()
                free_ids.sync_marks()
                held = torch.tensor([last for last, _ in checked], dtype=torch.int64)
                free = torch.index_select(free_ids.is_free, 0, held // P).bool()
                if bool(free.any()):
                    raise AllocatorError(f"last_loc {int(held[free][0])} lies in a free page")
            fresh_pages = sum(needs_page)
            if not self.has_room(fresh_pages):
                return None
            pages = iter(free_ids.take(fresh_pages).tolist())
            result = [
                next(pages) * P if fresh else last + 1
                for last, fresh in zip(lasts, needs_page, strict=True)
            ]
            return torch.tensor(result, dtype=torch.int64)

    return DecodeBeforeIssue18


def _alloc_decode_line(quick: bool, repeat: int) -> None:
    """``alloc_decode`` of 64 requests at page size 16, calls per second, against the code
    before issue 18 in the same run (see above)."""
    from kvcache_core import PagedSlotAllocator
    from kvcache_plugins.mha import MHATokenToKVPool

    P, requests, calls = 16, 64, (200 if quick else 2000)
    size = P * requests * 4
    pool = MHATokenToKVPool(8, P, torch.float32, 1, 1, 1)

    def prepared(cls: type = PagedSlotAllocator) -> tuple[Any, torch.Tensor, torch.Tensor]:
        alloc = cls(size, P, pool)
        pages = alloc.alloc(P * requests).reshape(requests, P)
        # request i holds 2 + i % 15 tokens of its page (never a full page): the next token
        # continues the page for all but the requests that restart below
        held = torch.tensor([2 + i % 15 for i in range(requests)])
        last = pages[torch.arange(requests), held - 1]
        seq = held + 1
        seq[::16] = P + 1  # one request in 16 starts a fresh page
        last[::16] = pages[::16, P - 1]
        return alloc, seq, last

    def run(cls: type = PagedSlotAllocator) -> Callable[[], None]:
        fresh = [prepared(cls) for _ in range(repeat)]

        def go() -> None:
            alloc, seq, last = fresh.pop()
            state = alloc.backup_state()
            for _ in range(calls):
                alloc.alloc_decode(seq, last)
                alloc.restore_state(state)

        return go

    def baseline() -> Callable[[], None]:
        fresh = [prepared() for _ in range(repeat)]

        def go() -> None:
            alloc, _, _ = fresh.pop()
            state = alloc.backup_state()
            for _ in range(calls):
                alloc.restore_state(state)

        return go

    before = _decode_before_issue_18()
    times = median_of(
        interleaved({"decode": run(), "before": run(before), "restore only": baseline()}, repeat)
    )
    ours = (times["decode"] - times["restore only"]) / calls
    old = (times["before"] - times["restore only"]) / calls
    figure(
        "alloc_decode 64 req, P=16",
        f"{1e6 * ours:.1f} us/call",
        f"before issue 18 {1e6 * old:.1f} us/call",
        old / ours,
        TARGET_DECODE,
        note="restore_state between calls timed apart and subtracted",
    )


# ----------------------------------------------------------------------------- host syncs


def _on_device(*sides: Any) -> None:
    """Host allocators made to behave as on an accelerator: a settle copies its queue to the
    host once (instead of reading the ids in place, which the proxy would count), and the
    slots they hand out are device data (so a composite that reads them back is counted)."""
    as_device = _host_syncs().as_device

    def on_device(method: Callable[..., Any]) -> Callable[..., Any]:
        def call(*args: Any, **kwargs: Any) -> Any:
            out = method(*args, **kwargs)
            return None if out is None else as_device(out)

        return call

    for side in sides:
        side._on_host = False
        for name in ("alloc", "alloc_extend", "alloc_decode"):
            if hasattr(side, name):
                setattr(side, name, on_device(getattr(side, name)))


def _sync_rows() -> list[tuple[str, Callable[[], Any], Callable[[Any], Any]]]:
    """(label, build, alloc one request) for every allocator in the table."""
    from kvcache_core import PagedSlotAllocator

    as_device = _host_syncs().as_device
    from kvcache_plugins.mha import MHATokenToKVPool

    def plain(page_size: int) -> Any:
        pool = MHATokenToKVPool(64, page_size, torch.float32, 1, 1, 1)
        alloc = PagedSlotAllocator(64, page_size, pool)
        _on_device(alloc)
        return alloc

    def swa(page_size: int) -> Any:
        alloc = _make("swa", 64, page_size)
        alloc.full_to_swa_index_mapping = as_device(alloc.full_to_swa_index_mapping)
        _on_device(alloc.full_attn_allocator, alloc.swa_attn_allocator)
        return alloc

    def hisparse(page_size: int) -> Any:
        alloc = _make("hisparse", 64, page_size)
        alloc.logical_to_device = as_device(alloc.logical_to_device)
        _on_device(alloc._logical, alloc._device)
        return alloc

    def hybrid() -> Any:
        alloc = _make("mamba", 64)
        _on_device(alloc)
        return alloc

    def sglang_token() -> Any:
        alloc = SglangAlgorithm(64)
        alloc.free_pages = as_device(alloc.free_pages)
        return alloc

    def sglang_paired() -> Any:
        alloc = SglangPairedAlgorithm(64, 64)
        alloc.mapping = as_device(alloc.mapping)
        for side in (alloc.first, alloc.second):
            side.free_pages = as_device(side.free_pages)
        return alloc

    return [
        ("token", lambda: plain(1), lambda a: a.alloc(4)),
        ("paged (P=4)", lambda: plain(4), lambda a: a.alloc(4)),
        ("SWA", lambda: swa(1), lambda a: a.alloc(4)),
        ("SWA (P=4)", lambda: swa(4), lambda a: a.alloc(4)),
        ("HiSparse", lambda: hisparse(1), lambda a: a.alloc(4)),
        ("HiSparse (P=4)", lambda: hisparse(4), lambda a: a.alloc(4)),
        ("Mamba hybrid, token side", hybrid, lambda a: a.alloc(4)),
        ("Mamba hybrid, request slots", lambda: hybrid().mamba_allocator, lambda a: a.alloc(1)),
        ("sglang algorithm (token)", sglang_token, lambda a: a.alloc(4)),
        ("sglang algorithm (SWA/HiSp.)", sglang_paired, lambda a: a.alloc(4)),
    ]


def _host_syncs() -> Any:
    """The tests' host-sync counter (``tests/allocators/_host_syncs.py``): a test helper, so
    it is imported from the checkout, which goes on ``sys.path`` for it."""
    import importlib
    import sys
    from pathlib import Path

    root = str(Path(__file__).resolve().parent.parent)
    if root not in sys.path:
        sys.path.insert(0, root)
    return importlib.import_module("tests.allocators._host_syncs")


def bench_host_syncs() -> None:
    """Host syncs per call, counted with the tests' CUDA-free proxy: ids (and the allocators'
    device tables) are CPU data standing for device data, recording every read to the host."""
    calls = 8
    print("== host syncs per call (CUDA-free proxy, tests/allocators/_host_syncs; target: free 0)")
    print(f"  {'allocator':<30} {'alloc':>6} {'free':>6}   settle of {calls} queued frees")
    for label, build, take in _sync_rows():
        alloc_syncs, free_syncs, settle = _sync_row(build, take, calls)
        mark = "" if free_syncs == 0 else "  <- syncs in free"
        print(f"  {label:<30} {alloc_syncs:>6} {free_syncs:>6}   {settle}{mark}")


def _sync_row(
    build: Callable[[], Any], take: Callable[[Any], Any], calls: int
) -> tuple[int, int, str]:
    """(syncs of one alloc, most syncs of one free, syncs of the settle after ``calls``
    frees, or why there is none)."""
    as_device, count_host_syncs = _host_syncs().as_device, _host_syncs().count_host_syncs

    alloc = build()
    held = [take(alloc) for _ in range(calls)]
    alloc_syncs = len(count_host_syncs(lambda: take(alloc)))
    free_syncs = max(len(count_host_syncs(lambda s=s: alloc.free(as_device(s)))) for s in held)
    check = getattr(alloc, "check_frees", None)
    settle = "n/a (no queue)" if check is None else str(len(count_host_syncs(check)))
    return alloc_syncs, free_syncs, settle


def bench_allocator(quick: bool, repeat: int) -> None:
    _rate_table(quick, repeat)
    _decode_table(quick, repeat)
    bench_host_syncs()
