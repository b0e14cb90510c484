"""One line per figure, the same shape in every section: what was measured, its baseline from
the same run, the ratio, the target and whether this run meets it.

Why a shared printer: the issue that asks for these figures reads them side by side, and the
README quotes them; a missed target must be visible in the line itself (``MISSES``), never
inferred by the reader from two numbers.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable

__all__ = ["figure", "informational", "interleaved", "median_of"]


def interleaved(fns: dict[str, Callable[[], object]], repeat: int) -> dict[str, list[float]]:
    """Wall times of each function over ``repeat`` rounds, running them in turn so drifting
    load hits all alike."""
    times: dict[str, list[float]] = {name: [] for name in fns}
    for _ in range(repeat):
        for name, fn in fns.items():
            start = time.perf_counter()
            fn()
            times[name].append(time.perf_counter() - start)
    return times


def median_of(times: dict[str, list[float]]) -> dict[str, float]:
    """The median of each list (the issue's figures are medians of interleaved runs)."""
    return {name: statistics.median(values) for name, values in times.items()}


def figure(
    label: str,
    ours: str,
    baseline: str,
    ratio: float,
    target: float,
    *,
    higher_is_better: bool = True,
    note: str = "",
) -> str:
    """Print and return one figure line: ``label  ours  vs baseline  ratio  target  verdict``."""
    met = ratio >= target if higher_is_better else ratio <= target
    sign = ">=" if higher_is_better else "<="
    line = (
        f"  {label:<30} {ours:>14}   vs {baseline:<28} ratio {ratio:5.2f}x   "
        f"target {sign} {target:.2f}x   {'meets' if met else 'MISSES'}"
    )
    if note:
        line += f"   ({note})"
    print(line)
    return line


def informational(label: str, ours: str, baseline: str, ratio: float, *, note: str = "") -> str:
    """Print and return a figure line that has no target (the issue sets none): the same
    columns as :func:`figure`, with ``no target`` where the verdict would be."""
    line = (
        f"  {label:<30} {ours:>14}   vs {baseline:<28} ratio {ratio:5.2f}x   "
        f"{'(no target: informational)':<28}"
    )
    if note:
        line += f"   ({note})"
    print(line)
    return line
