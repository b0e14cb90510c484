"""A large synthetic pool module for drift's speed and correctness (tests and benchmarks)."""

from __future__ import annotations

TEMPLATE_CLASS = '''
class Pool{i}(BasePool):
    """Pool number {i}: a few buffers, an offload override and some helpers."""

    def __init__(self, size: int) -> None:
        super().__init__(size)
        self.extra_{i} = [0] * size
        self.scale_{i} = 1.0

    def get_cpu_copy(self, indices{extra}) -> dict:
        rows = [self.rows[i] for i in indices]
        return {{"kind": "pool{i}", "rows": rows}}

    def helper_{i}(self, values: list[int]) -> int:
        total = 0
        for value in values:
            if value % 3 == 0:
                total += value * {i}
            else:
                total -= value
        return total
'''

TEMPLATE_CALL = """
def retract_{i}(pool: BasePool, idx: list[int], state: object) -> object:
    snapshot = pool.get_cpu_copy(idx{kw})
    return snapshot
"""

HEADER = '''"""Generated: {n} pools, {m} call sites."""


class BasePool:
    def __init__(self, size: int) -> None:
        self.rows = list(range(size))

    def get_cpu_copy(self, indices, mamba_indices=None) -> dict:
        return {{"rows": [self.rows[i] for i in indices]}}
'''


def generate(
    target_bytes: int = 150_000, narrow_every: int = 50, kw_every: int = 40
) -> tuple[str, set[str], int]:
    """Source of about ``target_bytes``, the narrowed classes, and the keyword call count."""
    parts = [HEADER]
    narrowed: set[str] = set()
    keyword_calls = 0
    i = 0
    size = len(HEADER)
    while size < target_bytes:
        narrow = i % narrow_every == 1
        if narrow:
            narrowed.add(f"Pool{i}")
        cls = TEMPLATE_CLASS.format(i=i, extra="" if narrow else ", mamba_indices=None")
        kw = i % kw_every == 0
        keyword_calls += kw
        call = TEMPLATE_CALL.format(i=i, kw=", mamba_indices=state" if kw else "")
        parts += [cls, call]
        size += len(cls) + len(call)
        i += 1
    parts[0] = HEADER.format(n=i, m=i)
    return "".join(parts), narrowed, keyword_calls
