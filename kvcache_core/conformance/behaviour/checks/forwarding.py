"""The allocator's offload calls forward every argument to its pool, checked by behaviour.

Why by behaviour: an allocator that accepted ``mamba_indices`` and dropped it lost recurrent
state on resume in a real engine, and its signature was perfect. Reading its source is not
enough either (a wrapper, a ``**kwargs`` relay, a subclass...). So the check replaces the pool's
own ``get_cpu_copy``/``load_cpu_copy`` on the instance the allocator holds with recorders that
call through, calls the allocator with distinct values for every argument, and compares what
the pool received. The steps are Python source executed as written, so the reproduction is the
code that ran.
"""

from __future__ import annotations

from typing import Any

import torch

from ....contracts.spec import Capability
from .._check import BehaviourFailure, behaviour_check
from .._context import CheckContext

_HINT = (
    "forward every argument by keyword: return self.get_kvcache().get_cpu_copy(indices, "
    "mamba_indices=mamba_indices) (and likewise load_cpu_copy(snapshot, indices, "
    "mamba_indices=mamba_indices))"
)

_RECORDER = [
    "import inspect",
    "from kvcache_core import OffloadablePool",
    "",
    "def record(target, name, seen):",
    "    # Replace target.<name> with a recorder that calls through. What it records is keyed",
    "    # by the contract's parameter names: the pool's own parameters are read by position",
    "    # (a pool may call `indices` something else, and an allocator may pass it positionally).",
    "    original = getattr(target, name)",
    "    signature = inspect.signature(original)",
    "    own = list(signature.parameters)",
    "    contract = [p for p in inspect.signature(getattr(OffloadablePool, name)).parameters",
    "                if p != 'self']",
    "    def recording(*args, **kwargs):",
    "        bound = signature.bind(*args, **kwargs).arguments",
    "        seen.append({c: bound[o] for o, c in zip(own, contract) if o in bound})",
    "        return original(*args, **kwargs)",
    "    setattr(target, name, recording)",
    "",
    "def forwarded(arguments, name, sent):",
    "    # Whether the pool got sent (the same object, or equal values) as name.",
    "    got = arguments.get(name)",
    "    if sent is None or got is sent:",
    "        return got is sent",
    "    return isinstance(got, torch.Tensor) and got.tolist() == sent.tolist()",
    "",
    "held = allocator.get_kvcache()",
    "offloads, reloads = [], []",
    "record(held, 'get_cpu_copy', offloads)",
    "record(held, 'load_cpu_copy', reloads)",
]


def _describe(value: object) -> str:
    if isinstance(value, torch.Tensor):
        return f"tensor {value.tolist()}"
    return repr(value)


def _same(seen: object, sent: object) -> bool:
    if sent is None:
        return seen is None
    if seen is sent:
        return True
    if isinstance(sent, torch.Tensor):
        return (
            isinstance(seen, torch.Tensor)
            and seen.shape == sent.shape
            and seen.detach().cpu().tolist() == sent.detach().cpu().tolist()
        )
    return False


@behaviour_check("allocator-forwards-offload", requires={Capability.OFFLOAD}, hint=_HINT)
def allocator_forwards_offload(ctx: CheckContext) -> None:
    """``allocator.get_cpu_copy``/``load_cpu_copy`` hand the pool exactly the arguments they
    got: the same indices, the same snapshot and the same ``mamba_indices`` (None included)."""
    pool, allocator = ctx.build()
    n = ctx.config.page_size * max(1, -(-3 // ctx.config.page_size))
    ns: dict[str, Any] = {"torch": torch, "pool": pool, "allocator": allocator}
    steps: list[str] = list(_RECORDER)
    exec(compile("\n".join(steps), "<recorder>", "exec"), ns)
    # (source run, method, what the allocator was given) per probe.
    probes: list[tuple[list[str], str, dict[str, str]]] = [
        (
            [
                f"src = allocator.alloc({n})",
                "state_slots = torch.tensor([1])",
                "snapshot = allocator.get_cpu_copy(src, mamba_indices=state_slots)",
            ],
            "get_cpu_copy",
            {"indices": "src", "mamba_indices": "state_slots"},
        ),
        (
            ["plain = allocator.get_cpu_copy(src)"],
            "get_cpu_copy",
            {"indices": "src", "mamba_indices": "None"},
        ),
        (
            [
                f"dst = allocator.alloc({n})",
                "new_state_slots = torch.tensor([2])",
                "allocator.load_cpu_copy(snapshot, dst, mamba_indices=new_state_slots)",
            ],
            "load_cpu_copy",
            {"snapshot": "snapshot", "indices": "dst", "mamba_indices": "new_state_slots"},
        ),
        (
            [
                f"dst2 = allocator.alloc({n})",
                "allocator.load_cpu_copy(plain, dst2)",
            ],
            "load_cpu_copy",
            {"snapshot": "plain", "indices": "dst2", "mamba_indices": "None"},
        ),
    ]
    for source, method, sent in probes:
        seen_list = ns["offloads" if method == "get_cpu_copy" else "reloads"]
        before = len(seen_list)
        problem: str | None = None
        try:
            exec(compile("\n".join(source), f"<{method}>", "exec"), ns)
        except Exception as exc:
            problem = f"raised {type(exc).__name__}: {exc}"
        steps += source
        call = source[-1]
        if problem is None:
            calls = seen_list[before:]
            if len(calls) != 1:
                problem = f"called the pool's {method} {len(calls)} time(s), not once"
            else:
                got = calls[0]
                for name, expr in sent.items():
                    value = eval(expr, ns)
                    seen = got.get(name)
                    if not _same(seen, value):
                        shown = (
                            "nothing (left to its default)"
                            if name not in got
                            else (_describe(seen))
                        )
                        problem = (
                            f"passed the pool {name}={shown}, but was given "
                            f"{name}={_describe(value)}"
                        )
                        log = "reloads" if method == "load_cpu_copy" else "offloads"
                        steps.append(
                            f"assert forwarded({log}[-1], {name!r}, {expr}), "
                            f"'{name} was not forwarded as given'"
                        )
                        break
        if problem is not None:
            raise BehaviourFailure(
                f"allocator {call.strip()} {problem}",
                reproduction=ctx.reproduction(steps),
            )
