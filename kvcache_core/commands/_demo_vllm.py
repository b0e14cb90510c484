"""``kvcache demo --engine vllm``: vLLM instance A prefills into a store, a new process B loads.

Three vLLM processes on one prompt, greedy: a run without any connector (what the tokens must
be, and the time to first token when everything is recomputed), instance A with
``KVCacheConnector`` as ``kv_producer`` (saves the prompt's full blocks into ``--store``) and
instance B, a new process, as ``kv_consumer`` (loads them). It prints whether B's tokens are
identical, how many prompt tokens B loaded and computed (vLLM's own counters), the bytes moved,
the store's throughput and both times to first token. Needs vLLM (``kvcache[vllm]``). Exit
codes: 0 identical, 1 tokens differ or an instance failed, 2 usage error.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from typing import Any

__all__ = ["add_arguments", "run"]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The options only ``--engine vllm`` reads (``--model``, ``--store`` are shared)."""
    group = parser.add_argument_group("--engine vllm")
    group.add_argument("--dtype", choices=("float32", "bfloat16"), default="float32")
    group.add_argument("--block-size", type=int, default=32, metavar="N", help="vLLM's block size")
    group.add_argument(
        "--prompt-tokens", type=int, default=300, metavar="N", help="prompt length (default 300)"
    )


def _rate(nbytes: float, seconds: float) -> str:
    return f"{nbytes / seconds / 1e6:.0f} MB/s" if seconds > 0 else "-"


def run(args: argparse.Namespace) -> int:
    try:
        import vllm  # noqa: F401
    except ImportError:
        print(
            "kvcache demo: error: --engine vllm needs vLLM (pip install 'kvcache[vllm]' on a "
            "CPU machine; docs/integrations/vllm.md)",
            file=sys.stderr,
        )
        return 2
    from ..integrations._vllm_models import build_llama, prompt_words
    from ..integrations._vllm_run import spawn_instance

    work = tempfile.mkdtemp(prefix="kvcache-vllm-demo-")
    model = args.model
    if model == "llama":
        model = build_llama(os.path.join(work, "model"), seed=args.seed)
        shown = f"tiny llama (seed {args.seed})"
    elif os.path.isdir(model):
        shown = model
    else:
        print(f"kvcache demo: error: --model {model!r} is not a directory", file=sys.stderr)
        return 2
    store = args.store
    if store.startswith("memory:"):  # one process only; A and B are two
        store = f"dir:{os.path.join(work, 'store')}"
    prompt = prompt_words(args.prompt_tokens, seed=args.seed + 1)
    common = {
        "model": model,
        "prompts": [prompt],
        "max_tokens": 16,
        "block_size": args.block_size,
        "dtype": args.dtype,
        "max_model_len": max(1024, args.prompt_tokens + 64),
    }

    def connector(role: str, side: str) -> dict[str, Any]:
        extra = {"store": store, "stats_file": os.path.join(work, side)}
        return {"role": role, "module_path": "kvcache_core.integrations.vllm", "extra": extra}

    runs: dict[str, dict[str, Any]] = {}
    for name, conn in (
        ("recompute", None),
        ("A", connector("kv_producer", "a")),
        ("B", connector("kv_consumer", "b")),
    ):
        print(f"kvcache demo: starting vLLM instance {name} ...", file=sys.stderr, flush=True)
        result, err = spawn_instance({**common, "connector": conn})
        if result is None:
            print(f"kvcache demo: instance {name} failed:\n{err[-4000:]}", file=sys.stderr)
            return 1
        runs[name] = result
    base, a, b = runs["recompute"], runs["A"], runs["B"]
    same = base["tokens"] == a["tokens"] == b["tokens"]
    last = b["per_prompt"][-1]
    saved = a["connector"].get("worker", {})
    loaded = b["connector"].get("worker", {})
    summary = {
        "model": shown,
        "store": store,
        "dtype": args.dtype,
        "block_size": args.block_size,
        "prompt_tokens": args.prompt_tokens,
        "tokens_identical": same,
        "b_prompt_tokens_loaded": int(
            last.get("vllm:prompt_tokens_by_source/external_kv_transfer", 0)
        ),
        "b_prompt_tokens_computed": int(last.get("vllm:prompt_tokens_by_source/local_compute", 0)),
        "bytes_saved_by_a": saved.get("saved_bytes", 0),
        "bytes_loaded_by_b": loaded.get("loaded_bytes", 0),
        "save_throughput": _rate(saved.get("saved_bytes", 0), saved.get("save_seconds", 0.0)),
        "load_throughput": _rate(loaded.get("loaded_bytes", 0), loaded.get("load_seconds", 0.0)),
        "ttft_recompute_s": round(base["ttft"][0], 4),
        "ttft_with_store_s": round(b["ttft"][0], 4),
    }
    if args.format == "json":
        print(json.dumps(summary, indent=2))
    else:
        print(f"model {shown}, {args.dtype}, block size {args.block_size}, store {store}")
        print(f"tokens identical (A, B, no connector): {'yes' if same else 'NO'}")
        print(
            f"B's prompt tokens: {summary['b_prompt_tokens_loaded']} loaded from the store, "
            f"{summary['b_prompt_tokens_computed']} computed"
        )
        print(
            f"bytes moved: A saved {summary['bytes_saved_by_a']}, B loaded "
            f"{summary['bytes_loaded_by_b']} (store: save {summary['save_throughput']}, load "
            f"{summary['load_throughput']})"
        )
        print(
            f"time to first token: {summary['ttft_recompute_s']:.3f} s recomputing, "
            f"{summary['ttft_with_store_s']:.3f} s with the store"
        )
    return 0 if same else 1
