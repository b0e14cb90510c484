"""One vLLM instance in its own process: ``python -m kvcache_core.integrations._vllm_run JSON``.

The demo, the end-to-end tests and the benchmark start instance A and instance B through this
module, so each is a new process (as two servers are) and vLLM's worker processes start under a
``__main__`` guard, as vLLM requires. The JSON argument says what to serve; the last line
printed is ``KVCACHE_RESULT {json}``: the greedy tokens of every prompt, the time to first token
of each, vLLM's own prompt-token counters and the connector's counters.
"""

from __future__ import annotations

import glob
import json
import os
import subprocess
import sys
import time
from typing import Any

RESULT_PREFIX = "KVCACHE_RESULT "

__all__ = ["RESULT_PREFIX", "run_instance", "spawn_instance"]


def spawn_instance(
    spec: dict[str, Any], *, timeout: float | None = None
) -> tuple[dict[str, Any] | None, str]:
    """Run one instance in a new process: its result (None when it failed) and its stderr."""
    proc = subprocess.run(
        [sys.executable, "-m", "kvcache_core.integrations._vllm_run", json.dumps(spec)],
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
    for line in reversed(proc.stdout.splitlines()):
        if line.startswith(RESULT_PREFIX):
            result: dict[str, Any] = json.loads(line[len(RESULT_PREFIX) :])
            return result, proc.stderr
    return None, proc.stderr


def _counters(llm: Any) -> dict[str, float]:
    """vLLM's counters this run cares about, summed over label sets, by ``name[/source]``."""
    found: dict[str, float] = {}
    for metric in llm.get_metrics():
        name = str(metric.name)
        if not name.startswith(("vllm:prompt_tokens", "vllm:external_prefix", "vllm:num_pre")):
            continue
        value = getattr(metric, "value", None)
        if not isinstance(value, (int, float)):
            continue
        source = getattr(metric, "labels", {}).get("source")
        key = f"{name}/{source}" if source else name
        found[key] = found.get(key, 0.0) + float(value)
    return found


def _connector_stats(stats_file: str | None) -> dict[str, Any]:
    merged: dict[str, Any] = {}
    if not stats_file:
        return merged
    for path in sorted(glob.glob(f"{stats_file}.*.json")):
        with open(path, encoding="utf-8") as fh:
            side = os.path.basename(path)[len(os.path.basename(stats_file)) + 1 : -5]
            merged[side] = json.load(fh)
    return merged


def run_instance(spec: dict[str, Any]) -> dict[str, Any]:
    """Serve ``spec["prompts"]`` greedily on ``spec["model"]``; see the module for the keys."""
    from vllm import LLM, SamplingParams
    from vllm.config import KVTransferConfig

    transfer = None
    connector = spec.get("connector")
    if connector:
        transfer = KVTransferConfig(
            kv_connector=connector.get("name", "KVCacheConnector"),
            kv_connector_module_path=connector.get("module_path"),
            kv_role=connector["role"],
            kv_connector_extra_config=connector.get("extra", {}),
        )
    engine: dict[str, Any] = {
        "model": spec["model"],
        "enforce_eager": True,
        "max_model_len": int(spec.get("max_model_len", 1024)),
        "dtype": spec.get("dtype", "float32"),
        "block_size": int(spec.get("block_size", 128)),
        "seed": 0,
        "disable_log_stats": False,
        "enable_prefix_caching": bool(spec.get("prefix_caching", True)),
        "kv_transfer_config": transfer,
    }
    # A bounded KV space: vLLM's CPU default reserves most of the machine's memory, and several
    # instances (and other work) share it here.
    engine["kv_cache_memory_bytes"] = int(spec.get("kv_cache_memory_bytes", 256 << 20))
    engine["gpu_memory_utilization"] = float(spec.get("memory_utilization", 0.3))
    if spec.get("max_num_seqs"):
        engine["max_num_seqs"] = int(spec["max_num_seqs"])
    if spec.get("max_num_batched_tokens"):
        engine["max_num_batched_tokens"] = int(spec["max_num_batched_tokens"])
    started = time.perf_counter()
    llm = LLM(**engine)
    startup = time.perf_counter() - started
    params = SamplingParams(
        temperature=0.0, max_tokens=int(spec.get("max_tokens", 8)), ignore_eos=True
    )
    prompts = list(spec["prompts"])
    tokens: list[list[int]] = []
    ttft: list[float] = []
    first_tokens: list[int] = []
    wall: list[float] = []
    per_prompt: list[dict[str, float]] = []  # vLLM's counters moved by each prompt
    if spec.get("batch"):  # every prompt at once (the preemption runs)
        t0 = time.perf_counter()
        outputs = llm.generate(prompts, params, use_tqdm=False)
        wall.append(time.perf_counter() - t0)
        tokens = [list(o.outputs[0].token_ids) for o in outputs]
    else:
        for prompt in prompts:
            if spec.get("reset_prefix_cache"):  # each prompt on its own, not on an earlier one's
                llm.reset_prefix_cache()
            before = _counters(llm)
            if spec.get("measure_ttft", True):
                first = SamplingParams(temperature=0.0, max_tokens=1, ignore_eos=True)
                t0 = time.perf_counter()
                head = llm.generate([prompt], first, use_tqdm=False)[0]
                ttft.append(time.perf_counter() - t0)
                first_tokens.append(int(head.outputs[0].token_ids[0]))
                if spec.get("reset_prefix_cache_between", True):
                    llm.reset_prefix_cache()
                if spec.get("ttft_only"):
                    continue
                before = _counters(llm)  # the counters of the full generation alone
            t0 = time.perf_counter()
            out = llm.generate([prompt], params, use_tqdm=False)[0]
            wall.append(time.perf_counter() - t0)
            tokens.append(list(out.outputs[0].token_ids))
            after = _counters(llm)
            per_prompt.append({k: v - before.get(k, 0.0) for k, v in after.items()})
    stats_file = (connector or {}).get("extra", {}).get("stats_file")
    return {
        "tokens": tokens,
        "ttft": ttft,
        "first_tokens": first_tokens,
        "wall": wall,
        "startup": startup,
        "counters": _counters(llm),
        "per_prompt": per_prompt,
        "connector": _connector_stats(stats_file),
    }


def main(argv: list[str]) -> int:
    spec = json.loads(argv[0])
    result = run_instance(spec)
    print(RESULT_PREFIX + json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
