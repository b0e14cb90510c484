"""What generating on a kvcache pool costs transformers, against its own ``DynamicCache``.

Run: ``.venv/bin/python benchmarks/bench_transformers.py [--repeat N]``. A seeded Llama-style
model (hidden 256, 4 layers, 4 query heads and 2 KV heads of 64, batch 1) decodes 64 tokens
one forward pass at a time, after an untimed prefill, once on ``DynamicCache`` and once on a
``KVPoolCache`` over the ``mha`` pool, interleaved; each figure is the per layer-step time
(decode time / (64 x 4 layers)) against ``DynamicCache``'s in the same run:

1. after a 16-token prompt: target <= 1.10x (the pool's bookkeeping per step is small);
2. after a 2,048-token prompt: target <= 1.00x. ``DynamicCache`` concatenates every layer's
   whole cache at every step; the pool (kept head-major, as ``KVPoolCache.for_model`` builds
   it) writes one row and attention reads the row's run of slots in place, each head one
   contiguous block, so the pool must not be slower.

Each of those sections gets a pool of exactly the slots one run needs, so every run holds one
run of consecutive slots, as a fresh allocator hands out. A third, informational line runs
the 2,048-token case on scattered slots (a shuffled half of a pool twice that size, as after
retractions in a long-running server): there attention reads a gathered head-major copy.

Both models run with one torch thread: on a shared machine two threads mostly measure their
wait for the other processes. Timings are process CPU time (one thread: the work itself, not
the other processes' share of the cores). The runs are interleaved in pairs (each side first
in every other round), ``--repeat`` pairs (default 9); the ratio judged against the target is
that of each side's best run, and the median over pairs of pool time / ``DynamicCache`` time
is printed beside it (on a loaded shared machine the two differ by several percent: quote
several runs).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402
from _report import figure, informational  # noqa: E402
from transformers import DynamicCache  # noqa: E402

from kvcache_core.integrations._hf_tiny_models import tiny_model  # noqa: E402
from kvcache_core.integrations.transformers import KVPoolCache  # noqa: E402

LAYERS = 4
NEW_TOKENS = 64


def _decode(
    model: Any, make_cache: Callable[[], Any], prompt: int, before: Callable[[Any], Any] | None
) -> Callable[[], float]:
    """A run: prefill ``prompt`` tokens (untimed), then time ``NEW_TOKENS`` decode steps.
    ``before(cache)`` prepares a pool cache's allocator (and returns what to give back)."""
    ids = (torch.arange(prompt) % 100 + 3).reshape(1, -1)

    def run() -> float:
        cache = make_cache()
        held = before(cache) if before is not None else None
        with torch.no_grad():
            logits = model(input_ids=ids, cache=cache, use_cache=True).logits
            token = logits[:, -1:].argmax(-1)
            start = time.process_time()
            for _ in range(NEW_TOKENS):
                logits = model(input_ids=token, cache=cache, use_cache=True).logits
                token = logits[:, -1:].argmax(-1)
            elapsed = time.process_time() - start
        if isinstance(cache, KVPoolCache):
            cache.release()
            if held is not None:
                cache.allocator.free(held)
        return elapsed

    return run


def _scatter(cache: KVPoolCache) -> torch.Tensor:
    """Take every free slot, give back a shuffled half (handed out in that order next)."""
    allocator = cache.allocator
    everything = allocator.alloc(allocator.available_size())
    order = torch.randperm(everything.numel(), generator=torch.Generator().manual_seed(0))
    half = everything.numel() // 2
    allocator.free(everything[order[:half]])
    held: torch.Tensor = everything[order[half:]]
    return held


def section(model: Any, prompt: int, repeat: int, target: float | None) -> bool:
    scattered = target is None
    size = (prompt + NEW_TOKENS) * (2 if scattered else 1)
    pool_cache = KVPoolCache.for_model(model, "mha", size=size)
    runs = {
        "dynamic": _decode(model, lambda: DynamicCache(config=model.config), prompt, None),
        "pool": _decode(model, lambda: pool_cache, prompt, _scatter if scattered else None),
    }
    best = {name: float("inf") for name in runs}
    pairs: list[float] = []
    for round_ in range(repeat):  # interleaved, each side first every other round
        order = list(runs) if round_ % 2 == 0 else list(runs)[::-1]
        took = {name: runs[name]() for name in order}
        pairs.append(took["pool"] / took["dynamic"])
        for name, seconds in took.items():
            best[name] = min(best[name], seconds)
    steps = NEW_TOKENS * LAYERS
    ours, base = best["pool"] / steps * 1e6, best["dynamic"] / steps * 1e6
    ratio = ours / base
    note = (
        f"best of {repeat}; median of the {repeat} paired ratios {statistics.median(pairs):.2f}x; "
        f"{NEW_TOKENS} decode steps"
    )
    times = (f"{ours:.1f} us", f"DynamicCache {base:.1f} us")
    if scattered:
        informational(f"layer-step, {prompt} scattered", *times, ratio, note=note)
        return True
    assert target is not None
    label = f"layer-step, {prompt}-token context"
    figure(label, *times, ratio, target, higher_is_better=False, note=note)
    return ratio <= target


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=9)
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    model = tiny_model("llama", hidden=256, layers=LAYERS)
    print(
        f"transformers on a kvcache pool vs DynamicCache (hidden 256, {LAYERS} layers, batch 1, "
        f"{NEW_TOKENS} new tokens, pool 'mha', head-major)"
    )
    met = [
        section(model, 16, args.repeat, 1.10),
        section(model, 2048, args.repeat, 1.00),
        section(model, 2048, args.repeat, None),
    ]
    return 0 if all(met) else 1


if __name__ == "__main__":
    sys.exit(main())
