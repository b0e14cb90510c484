"""The README's tour runs as written (a stale README is a bug)."""

from __future__ import annotations

import re
from pathlib import Path

import torch

README = Path(__file__).resolve().parent.parent / "README.md"


def python_blocks() -> list[str]:
    return re.findall(r"```python\n(.*?)```", README.read_text(encoding="utf-8"), flags=re.S)


def test_tour_runs_and_round_trips(capsys):
    blocks = python_blocks()
    assert blocks, "README has no python block"
    scope: dict[str, object] = {}
    exec(compile(blocks[0], str(README), "exec"), scope)
    printed = capsys.readouterr().out
    assert "['dsa', 'hisparse', 'mamba', 'mha', 'mla', 'swa']" in printed
    pool, slots, new_slots = scope["pool"], scope["slots"], scope["new_slots"]
    # what was written at the old slots (random, not zero) is now at the new ones
    old = pool.get_key_buffer(0)[slots]
    assert old.abs().sum() > 0
    assert torch.equal(pool.get_key_buffer(0)[new_slots], old)


def test_readme_starts_with_the_two_commands():
    text = README.read_text(encoding="utf-8")
    commands = re.search(r"```sh\n(.*?)```", text, flags=re.S).group(1).splitlines()
    assert [c.split()[:2] for c in commands] == [["make", "check"], ["make", "test"]]
