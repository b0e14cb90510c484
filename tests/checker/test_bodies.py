"""Body analyses: what a method does with ``mamba_indices``, ``**kwargs`` and ``loc``."""

from __future__ import annotations

import ast
import textwrap

import pytest

from kvcache_core.conformance.bodies import (
    dropped_parameters,
    only_raises_not_implemented,
    raw_loc_uses,
)


def fn(source: str) -> ast.FunctionDef:
    node = ast.parse(textwrap.dedent(source)).body[0]
    assert isinstance(node, ast.FunctionDef)
    return node


def dropped(source: str) -> list[str]:
    return [
        d.star + d.param
        for d in dropped_parameters(fn(source), "get_cpu_copy", {"indices", "mamba_indices"})
    ]


@pytest.mark.parametrize(
    "body, expected",
    [
        ("return self.pool.get_cpu_copy(indices)", ["mamba_indices"]),
        ("return self.pool.get_cpu_copy(indices, mamba_indices)", []),
        ("return self.pool.get_cpu_copy(indices, mamba_indices=mamba_indices)", []),
        ("m = mamba_indices\n    return self.pool.get_cpu_copy(indices, m)", []),
        ("return super().get_cpu_copy(indices)", ["mamba_indices"]),
        ("return self._pool().get_cpu_copy(indices)", ["mamba_indices"]),
        # a helper of one's own that receives it: forwarded
        ("s = self._state(mamba_indices)\n    return self.pool.get_cpu_copy(indices)", []),
        # mere inspection is not forwarding
        (
            "assert isinstance(mamba_indices, object)\n    return self.pool.get_cpu_copy(indices)",
            ["mamba_indices"],
        ),
        (
            "logger.info('%s', mamba_indices)\n    return self.pool.get_cpu_copy(indices)",
            ["mamba_indices"],
        ),
        # deliberate, visible drops
        ("del mamba_indices\n    return self.pool.get_cpu_copy(indices)", []),
        ("_ = mamba_indices\n    return self.pool.get_cpu_copy(indices)", []),
        # not a pass-through at all: nothing to forward to
        ("return make_snapshot(indices)", []),
        # calling itself on self is recursion, not delegation
        ("return self.get_cpu_copy(indices)", []),
    ],
)
def test_dropped_named_parameters(body, expected):
    src = f"def get_cpu_copy(self, indices, mamba_indices=None):\n    {body}\n"
    assert dropped(src) == expected


def test_kwargs_and_args_must_be_passed_on():
    assert dropped(
        "def get_cpu_copy(self, indices, *args, **kwargs):\n"
        "    return self.pool.get_cpu_copy(indices)\n"
    ) == ["*args", "**kwargs"]
    assert (
        dropped(
            "def get_cpu_copy(self, indices, *args, **kwargs):\n"
            "    return self.pool.get_cpu_copy(indices, *args, **kwargs)\n"
        )
        == []
    )
    assert (
        dropped(
            "def get_cpu_copy(self, indices, **kwargs):\n"
            "    m = kwargs.get('mamba_indices')\n"
            "    return self.pool.get_cpu_copy(indices, mamba_indices=m)\n"
        )
        == []
    )


def test_locals_forwarding_is_trusted():
    assert (
        dropped(
            "def get_cpu_copy(self, indices, mamba_indices=None):\n"
            "    return self.pool.get_cpu_copy(**locals())\n"
        )
        == []
    )


@pytest.mark.parametrize(
    "body, raises",
    [
        ("raise NotImplementedError", True),
        ("raise NotImplementedError('no offload')", True),
        ("'''Docstring.'''\n    raise builtins.NotImplementedError()", True),
        ("raise ValueError('no')", False),
        ("if x:\n        raise NotImplementedError\n    return 1", False),
        ("...", False),
    ],
)
def test_only_raises_not_implemented(body, raises):
    assert only_raises_not_implemented(fn(f"def f(self):\n    {body}\n")) is raises


@pytest.mark.parametrize(
    "body, lines",
    [
        ("self.buf[loc] = k", [2]),
        ("self.buf[:, loc] = k", [2]),
        ("x = self.buf[layer][loc]", [2]),
        ("self.buf.index_copy_(0, loc, k)", [2]),
        ("torch.index_select(self.buf, 0, loc.long())", [2]),
        ("self.buf.index_put_((loc,), k)", [2]),
        ("self.buf.scatter_(0, index=loc, src=k)", [2]),
        ("slots, _ = unwrap_write_loc(loc)\n    self.buf[slots] = k", []),
        ("loc, _ = unwrap_write_loc(loc)\n    self.buf[loc] = k", []),
        ("if isinstance(loc, KVWriteLoc):\n        loc = loc.full\n    self.buf[loc] = k", []),
        ("self.buf[loc.full] = k", []),
        # used before the unwrap: still reported
        ("self.buf[loc] = k\n    slots, _ = unwrap_write_loc(loc)", [2]),
        # handing it on to a sub-pool is not indexing
        ("self.inner.set_kv_buffer(layer, loc, k, v)", []),
    ],
)
def test_raw_loc_uses(body, lines):
    source = f"def set_kv_buffer(self, layer, loc, k, v):\n    {body}\n"
    assert [u.line for u in raw_loc_uses(fn(source), "loc")] == lines
