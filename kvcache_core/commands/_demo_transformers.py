"""``kvcache demo --engine transformers``: a real engine's attention reads what a pool stores.

Generates with transformers twice on the same prompts (a batch of two, the second left-padded):
once with its own ``DynamicCache``, once with a
[`KVPoolCache`][kvcache_core.integrations.transformers.KVPoolCache] on a discovered pool,
retracting a row three times in the middle of generation (offload through ``get_cpu_copy``,
free, garbage written into every free slot, resume into new slots through ``load_cpu_copy``).
Tokens must be identical. The model is a tiny seeded one built from a config, or a local
checkpoint directory loaded offline. Exit codes: 0 identical, 1 tokens differ (or the pool
raised), 2 usage error.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any

__all__ = ["NEW_TOKENS", "RETRACT_AT", "run"]

#: Tokens generated per row, and the forward passes after which the last row is retracted.
NEW_TOKENS = 16
RETRACT_AT = (4, 8, 12)


def _load_model(spec: str, seed: int) -> tuple[Any, str]:
    """The tiny model ``spec`` names, or the checkpoint directory at path ``spec``."""
    from ..integrations._hf_tiny_models import TINY_MODELS, tiny_model

    if spec in TINY_MODELS:
        return tiny_model(spec, seed=seed), f"tiny {spec} (seed {seed})"
    path = Path(spec)
    if not path.is_dir():
        raise ValueError(
            f"--model {spec!r} is neither one of {', '.join(TINY_MODELS)} nor a checkpoint "
            "directory"
        )
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(path, local_files_only=True)
    return model.eval(), str(path)


def _generate(model: Any, cache: Any, processors: list[Any]) -> tuple[Any, float]:
    import torch
    from transformers import LogitsProcessorList

    ids = torch.tensor([[5, 6, 7, 8, 9, 10, 11, 12], [0, 0, 0, 9, 10, 11, 12, 13]])
    pad = model.config.pad_token_id
    mask = (ids != (0 if pad is None else pad)).long()
    start = time.perf_counter()
    out = model.generate(
        ids.to(model.device),
        attention_mask=mask.to(model.device),
        cache=cache,
        max_new_tokens=NEW_TOKENS,
        min_new_tokens=NEW_TOKENS,
        do_sample=False,
        logits_processor=LogitsProcessorList(processors),
        return_dict_in_generate=True,
        output_logits=True,
    )
    return out, time.perf_counter() - start


def run(args: argparse.Namespace) -> int:
    """Run the demo for ``args`` (``--model``, ``--pool``, ``--page-size``, ``--seed``)."""
    if getattr(args, "format", "text") != "text":
        print("kvcache demo: error: --engine transformers prints text only", file=sys.stderr)
        return 2
    page_size = args.page_size if args.page_size is not None else 1
    if page_size <= 0:
        print("kvcache demo: error: --page-size must be positive", file=sys.stderr)
        return 2
    try:
        import transformers
        from transformers import DynamicCache
    except ImportError:
        print(
            "kvcache demo: error: --engine transformers needs transformers: "
            "pip install 'kvcache[hf]'",
            file=sys.stderr,
        )
        return 2
    from ..errors import KVCacheError
    from ..integrations._hf_drill import RetractionDrill
    from ..integrations.transformers import KVPoolCache

    try:
        model, described = _load_model(args.model, args.seed)
    except (ValueError, OSError) as exc:
        print(f"kvcache demo: error: {exc}", file=sys.stderr)
        return 2
    pool = None if args.pool == "all" else args.pool
    config = model.config
    print(
        f"kvcache demo --engine transformers: {described}: {type(model).__name__}, "
        f"{config.num_hidden_layers} layers, {model.dtype} (transformers "
        f"{transformers.__version__})"
    )
    _generate(model, DynamicCache(config=config), [])  # warm-up: first calls set things up
    want, base_time = _generate(model, DynamicCache(config=config), [])
    try:
        cache = KVPoolCache.for_model(model, pool, size=256, page_size=page_size)
        chosen = "named" if pool else "chosen by capabilities"
        print(f"  pool: {cache.pool_name} ({chosen}), page size {page_size}")
        got, pool_time = _generate(model, cache, [RetractionDrill(cache, RETRACT_AT)])
    except KVCacheError as exc:
        print(f"  pool raised: {type(exc).__name__}: {exc}")
        return 1
    import torch

    tokens = torch.equal(want.sequences, got.sequences)
    logits = all(torch.equal(a, b) for a, b in zip(want.logits, got.logits, strict=True))
    print(f"  tokens identical: {'yes' if tokens else 'NO'}")
    print(f"  logits identical: {'yes' if logits else 'no'}")
    print(f"  retractions: {cache.retractions}, bytes offloaded: {cache.bytes_offloaded:,}")
    print(
        f"  time: DynamicCache {base_time:.3f} s, KVPoolCache {pool_time:.3f} s (wall clock, "
        "one run each after a warm-up; the pool's includes its retractions)"
    )
    return 0 if tokens else 1
