"""Body analyses: what a method does with ``mamba_indices``, ``**kwargs`` and ``loc``."""

from __future__ import annotations

import ast
import textwrap

import pytest

from kvcache_core.conformance.members.bodies import (
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


@pytest.mark.parametrize(
    "body, lines",
    [
        # only a test of `loc` itself unwraps it: testing another parameter does not
        ("if isinstance(layer, KVWriteLoc):\n        pass\n    self.buf[loc] = k", [4]),
        ("if hasattr(k, 'full'):\n        pass\n    self.buf[loc] = k", [4]),
        ("unwrap_write_loc(layer)\n    self.buf[loc] = k", [3]),
        # a test that rejects the record is no unwrap: a KVWriteLoc fails the assert
        ("assert isinstance(loc, torch.Tensor)\n    self.buf[loc] = k", [3]),
        # ... but a Tensor test whose other branch reads the record's fields is
        (
            "if isinstance(loc, torch.Tensor):\n        self.buf[loc] = k\n"
            "    else:\n        self.buf[loc.full] = k",
            [],
        ),
        ("if hasattr(loc, 'full'):\n        loc = loc.full\n    self.buf[loc] = k", []),
        # rebinding `loc` from `loc` itself keeps the record
        ("loc = loc.long()\n    self.buf[loc] = k", [3]),
        ("loc = loc.full\n    self.buf[loc] = k", []),
        ("loc = unwrap_write_loc(loc)[0]\n    self.buf[loc] = k", []),
        # an alias of `loc` is `loc`
        ("slots = loc\n    self.buf[slots] = k", [3]),
        ("slots = loc\n    self.buf.index_copy_(0, slots, k)", [3]),
        ("slots = loc\n    slots, _ = unwrap_write_loc(slots)\n    self.buf[slots] = k", []),
        ("slots = loc\n    loc, _ = unwrap_write_loc(loc)\n    self.buf[slots] = k", [4]),
        # kvcache's slot validators take slots: a record handed to them raises
        ("check_slots(loc, limit=self.rows)\n    self.buf[loc] = k", [2, 3]),
        ("slots = check_slots(loc, limit=self.rows)\n    self.buf[slots] = k", [2, 3]),
        (
            "loc, _ = unwrap_write_loc(loc)\n    slots = check_slots(loc)\n    self.buf[slots] = k",
            [],
        ),
        (
            "slots, _ = unwrap_write_loc(loc)\n"
            "    slots = check_slots(slots)\n    self.buf[slots] = k",
            [],
        ),
    ],
)
def test_raw_loc_uses_need_a_real_unwrap_of_loc(body, lines):
    source = f"def set_kv_buffer(self, layer, loc, k, v):\n    {body}\n"
    assert [u.line for u in raw_loc_uses(fn(source), "loc")] == lines


@pytest.mark.parametrize(
    "body",
    [
        "raise NotImplementedError\n    return self.buf[0]",
        "'''Docstring.'''\n    raise NotImplementedError('later')\n    x = 1\n    return x",
    ],
)
def test_not_implemented_followed_by_dead_code(body):
    assert only_raises_not_implemented(fn(f"def f(self):\n    {body}\n")) is True


@pytest.mark.parametrize(
    "body, expected",
    [
        # a validation helper checks the parameter; it does not pass it on
        (
            "self._validate(mamba_indices)\n    return self.pool.get_cpu_copy(indices)",
            ["mamba_indices"],
        ),
        (
            "check_slots(mamba_indices, limit=8)\n    return self.pool.get_cpu_copy(indices)",
            ["mamba_indices"],
        ),
        (
            "self._check_state(mamba_indices)\n    return self.pool.get_cpu_copy(indices)",
            ["mamba_indices"],
        ),
        # ... but what it returns is computed from it, and forwarding that is forwarding
        (
            "m = check_slots(mamba_indices, limit=8)\n"
            "    return self.pool.get_cpu_copy(indices, mamba_indices=m)",
            [],
        ),
        # a helper that does work with it (a composite's own state snapshot) passes it on
        (
            "kv = self.kv.get_cpu_copy(indices)\n"
            "    return Snap(kv, self._mamba_snapshot(mamba_indices))",
            [],
        ),
    ],
)
def test_validation_is_not_forwarding(body, expected):
    src = f"def get_cpu_copy(self, indices, mamba_indices=None):\n    {body}\n"
    assert dropped(src) == expected
