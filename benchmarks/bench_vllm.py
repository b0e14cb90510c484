"""What KVCacheConnector buys and costs in vLLM, against recomputing and against vLLM's own
ExampleConnector, measured in one run on one machine.

Run (in the vLLM venv that ``make vllm`` builds): ``.venv-vllm/bin/python
benchmarks/bench_vllm.py [--tokens 2000] [--rounds 3] [--quick]``.

A Llama of about 100M parameters (12 layers of 768, 4 KV heads, a 32,000-word vocabulary,
fp32, seeded random weights) serves prompts of ``--tokens`` tokens, block size 128. Each line
below is one vLLM process; every time to first token (TTFT) is the median over ``--rounds``
different prompts of one length (local prefix cache reset between them, so every round
prefills or loads again):

* recompute: no connector (the baseline);
* A/dir, A/redis: KVCacheConnector ``kv_producer`` saving into ``dir:`` / a redis-server;
* B/dir, B/redis: a new process, ``kv_consumer``, loading those prompts;
* A/example, B/example: vLLM's ExampleConnector (safetensors files per layer) doing the same.

Ratios and targets (docs/integrations/vllm.md quotes a run):

1. recompute TTFT / B's TTFT, from dir: and from Redis: target >= 5x;
2. B/dir TTFT / B/example TTFT: target <= 1.0x;
3. A's save overhead (A/dir TTFT - recompute TTFT) / ExampleConnector's (A/example - recompute):
   target <= 1.0x;
4. A/dir TTFT / recompute TTFT (prefill while saving): target <= 1.15x.

The first token of every round is checked against the recompute run's. ``--quick`` (a tiny
model, 300 tokens, one round) only proves the script runs.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
from typing import Any

from kvcache_core.integrations._vllm_models import (
    BENCH_SHAPE,
    TINY_SHAPE,
    build_llama,
    prompt_words,
)
from kvcache_core.integrations._vllm_run import spawn_instance
from kvcache_core.stores.local_redis import LocalRedis


def instance(spec: dict[str, Any]) -> dict[str, Any]:
    result, stderr = spawn_instance(spec)
    if result is None:
        raise SystemExit(f"an instance failed:\n{stderr[-5000:]}")
    return result


def ours(role: str, store: str, stats: str) -> dict[str, Any]:
    return {
        "role": role,
        "module_path": "kvcache_core.integrations.vllm",
        "extra": {"store": store, "stats_file": stats},
    }


def example(path: str) -> dict[str, Any]:
    return {
        "name": "ExampleConnector",
        "role": "kv_both",
        "extra": {"shared_storage_path": path},
    }


def verdict(ok: bool) -> str:
    return "meets" if ok else "MISSES"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tokens", type=int, default=2000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args()
    shape, tokens, rounds = BENCH_SHAPE, args.tokens, args.rounds
    if args.quick:
        shape, tokens, rounds = TINY_SHAPE, 300, 1
    work = tempfile.mkdtemp(prefix="kvcache-bench-vllm-")
    try:
        model = build_llama(os.path.join(work, "model"), seed=0, shape=shape)
        prompts = [prompt_words(tokens, seed=1000 + r, vocab=shape.vocab) for r in range(rounds)]
        common = {
            "model": model,
            "prompts": prompts,
            "block_size": 128,
            # room above the prompt: vLLM refuses a text longer than 6 characters per token of
            # max_model_len before tokenizing, and these words are up to 7 with the space
            "max_model_len": min(shape.max_positions, 2 * tokens + 256),
            "ttft_only": True,
            "kv_cache_memory_bytes": 1 << 30,
        }
        runs: dict[str, dict[str, Any]] = {}
        with LocalRedis(timeout=30.0) as redis:
            plan = [
                ("recompute", None),
                ("A/dir", ours("kv_producer", f"dir:{work}/store", f"{work}/a-dir")),
                ("B/dir", ours("kv_consumer", f"dir:{work}/store", f"{work}/b-dir")),
                ("A/redis", ours("kv_producer", redis.url, f"{work}/a-redis")),
                ("B/redis", ours("kv_consumer", redis.url, f"{work}/b-redis")),
                ("A/example", example(f"{work}/example")),
                ("B/example", example(f"{work}/example")),
            ]
            for name, conn in plan:
                print(f"running {name} ...", file=sys.stderr, flush=True)
                runs[name] = instance({**common, "connector": conn})
    finally:
        shutil.rmtree(work, ignore_errors=True)
    ttft = {name: statistics.median(r["ttft"]) for name, r in runs.items()}
    firsts = {name: r["first_tokens"] for name, r in runs.items()}
    agree = all(f == firsts["recompute"] for f in firsts.values())
    print(f"model: {shape.layers} layers of {shape.hidden}, {shape.kv_heads} KV heads, fp32; "
          f"{tokens}-token prompts, block size 128, median of {rounds} round(s)")  # fmt: skip
    for name, value in ttft.items():
        extra = ""
        side = runs[name].get("connector", {}).get("worker", {})
        if side.get("loaded_bytes"):
            rate = side["loaded_bytes"] / max(side["load_seconds"], 1e-9) / 1e6
            extra = f"  (loaded {side['loaded_bytes'] / 1e6:.0f} MB at {rate:.0f} MB/s)"
        if side.get("saved_bytes"):
            rate = side["saved_bytes"] / max(side["save_seconds"], 1e-9) / 1e6
            extra = f"  (saved {side['saved_bytes'] / 1e6:.0f} MB at {rate:.0f} MB/s)"
        print(f"  TTFT {name:10s} {value:8.3f} s{extra}")
    base = ttft["recompute"]
    lines = [
        ("recompute / B/dir TTFT", base / ttft["B/dir"], ">= 5x", base / ttft["B/dir"] >= 5),
        ("recompute / B/redis TTFT", base / ttft["B/redis"], ">= 5x", base / ttft["B/redis"] >= 5),
        (
            "B/dir / B/example TTFT",
            ttft["B/dir"] / ttft["B/example"],
            "<= 1.0x",
            ttft["B/dir"] <= ttft["B/example"],
        ),
    ]
    ours_overhead = ttft["A/dir"] - base
    theirs = ttft["A/example"] - base
    ratio = ours_overhead / theirs if theirs > 0 else float("inf")
    lines.append(("save overhead A/dir / A/example", ratio, "<= 1.0x", ours_overhead <= theirs))
    lines.append(("A/dir / recompute TTFT", ttft["A/dir"] / base, "<= 1.15x",
                  ttft["A/dir"] <= 1.15 * base))  # fmt: skip
    for label, value, target, ok in lines:
        print(f"  {label:34s} {value:7.2f}x  target {target:8s} {verdict(ok)}")
    print(f"  first tokens equal to recompute's in every run: {'yes' if agree else 'NO'}")
    return 0 if agree else 1


if __name__ == "__main__":
    sys.exit(main())
