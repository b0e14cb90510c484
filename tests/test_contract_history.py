"""The contract as data stays in step with the Protocols, and old signatures are recognised."""

from __future__ import annotations

import dataclasses

import pytest

from kvcache_core import VERSIONS, KVWriteLoc, OffloadablePool, unwrap_write_loc
from kvcache_core.conformance.members.compare import compare_signatures
from kvcache_core.conformance.members.introspect import protocol_methods
from kvcache_core.conformance.members.signatures import normalize_annotation
from kvcache_core.contracts.signature import MethodSig, Param, ParamKind


def _shape(sig: MethodSig) -> tuple:
    return tuple(
        (p.name, p.kind, p.default, normalize_annotation(p.annotation)) for p in sig.params
    ), normalize_annotation(sig.returns)


def test_version_2_data_equals_the_protocols():
    live = protocol_methods(OffloadablePool)
    data = VERSIONS[2].methods
    assert set(live) == set(data)
    for name in live:
        assert _shape(live[name]) == _shape(data[name]), name


def test_version_1_lacks_mamba_indices_and_writeloc():
    v1 = VERSIONS[1].methods
    assert v1["get_cpu_copy"].get("mamba_indices") is None
    assert "KVWriteLoc" not in (v1["set_kv_buffer"].get("loc").annotation or "")
    assert set(VERSIONS[2].changes) == {"get_cpu_copy", "load_cpu_copy", "set_kv_buffer"}


def test_a_version_1_implementation_is_named_as_such():
    impl = MethodSig("get_cpu_copy", (Param("indices"),))
    from kvcache_core.conformance.members.versions import change_note

    note = change_note("get_cpu_copy", impl, 2)
    assert note.startswith("matches contract 1; contract 2 added `mamba_indices")
    findings = compare_signatures(VERSIONS[2].methods["get_cpu_copy"], impl, target="X")
    assert [(f.rule, f.parameter) for f in findings] == [("missing-parameter", "mamba_indices")]


@pytest.mark.parametrize(
    ("a", "b"),
    [
        ("Optional[torch.Tensor]", "Tensor | None"),
        ("typing.Union[None, torch.Tensor]", "torch.Tensor | None"),
        ("Tuple[torch.Tensor, torch.Tensor]", "tuple[Tensor, Tensor]"),
        ("'KVWriteLoc | torch.Tensor'", "Union[Tensor, KVWriteLoc]"),
    ],
)
def test_annotation_normalisation_equates_spellings(a, b):
    assert normalize_annotation(a) == normalize_annotation(b)


def test_writeloc_is_frozen_and_unwraps():
    import torch

    loc = KVWriteLoc(torch.tensor([1]), swa_loc=torch.tensor([2]))
    with pytest.raises(dataclasses.FrozenInstanceError):
        loc.loc = torch.tensor([3])  # type: ignore[misc]
    full, swa = unwrap_write_loc(loc)
    assert full.tolist() == [1] and swa.tolist() == [2]
    bare, none = unwrap_write_loc(torch.tensor([5]))
    assert bare.tolist() == [5] and none is None
    with pytest.raises(TypeError, match="KVWriteLoc"):
        unwrap_write_loc([1, 2])  # type: ignore[arg-type]
    with pytest.raises(TypeError, match=r"KVWriteLoc\.swa_loc must be a torch\.Tensor"):
        KVWriteLoc(torch.tensor([1]), swa_loc=[2])  # type: ignore[arg-type]


def test_fast_signature_reading_agrees_with_inspect():
    """The code-object reader used at start-up says exactly what inspect.signature says."""
    import inspect

    import kvcache_plugins.allocators as allocators
    from kvcache_core import discover
    from kvcache_core.conformance.members import signatures as sm

    def samples(a, /, b, c=3, *args, d, e=5, **kw) -> int: ...
    def plain(x: int = 1, *, y: "str | None" = None): ...  # noqa: UP037 (a string on purpose)

    functions = [samples, plain]
    for entry in discover().accepted.values():
        for cls in (entry.spec.pool_class, entry.spec.allocator_class):
            functions += [f for f in vars(cls).values() if inspect.isfunction(f)]
    functions += [f for f in vars(allocators.PagedSlotAllocator).values() if inspect.isfunction(f)]
    assert len(functions) > 50
    for func in functions:
        for bound in (False, True):
            fast = sm._describe_callable(func.__name__, func, bound)
            slow = sm._describe_with_inspect(func.__name__, func, bound)
            assert fast == slow, func.__qualname__


@pytest.mark.parametrize(
    "params",
    [
        # accepts every contract-1 call, but was not written against it
        (Param("indices"), Param("kwargs", ParamKind.VAR_KEYWORD)),
        (Param("indices"), Param("args", ParamKind.VAR_POSITIONAL)),
        # an extra parameter of its own, under another name than contract 2's
        (Param("indices"), Param("mamba_idx", default="None")),
        (Param("indices"), Param("stream", default="None")),
        # contract 1's parameter, renamed
        (Param("idx"),),
        # another annotation than contract 1's
        (Param("indices", annotation="list[int]"),),
        # another kind
        (Param("indices", ParamKind.POSITIONAL_ONLY),),
    ],
)
def test_only_an_exact_version_1_signature_is_called_version_1(params):
    from kvcache_core.conformance.members.versions import change_note

    impl = MethodSig("get_cpu_copy", params)
    assert change_note("get_cpu_copy", impl, 2) == ""


@pytest.mark.parametrize(
    "params, returns",
    [
        ((Param("indices"),), None),
        ((Param("indices", annotation="torch.Tensor"),), "KVSnapshot"),
        ((Param("indices", annotation="Tensor"),), "kvcache_core.KVSnapshot"),
    ],
)
def test_an_exact_version_1_signature_is_called_version_1(params, returns):
    from kvcache_core.conformance.members.versions import change_note

    impl = MethodSig("get_cpu_copy", params, returns)
    assert change_note("get_cpu_copy", impl, 2).startswith("matches contract 1; contract 2 added")
