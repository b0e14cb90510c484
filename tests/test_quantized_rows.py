"""QuantizedLayerRows: exact for representable values, within a step otherwise, snapshots bit
for bit."""

from __future__ import annotations

import pytest
import torch

from kvcache_core import QuantizedLayerRows, ShapeMismatchError, UnsupportedDtypeError

CPU = torch.device("cpu")
QUANT = [torch.int8] + [d for d in (getattr(torch, "float8_e4m3fn", None),) if d is not None]


@pytest.mark.parametrize("quant_dtype", QUANT)
@pytest.mark.parametrize("block", [None, 4])
def test_representable_values_round_trip_exactly(quant_dtype, block):
    rows = QuantizedLayerRows(
        2, 9, (2, 4), dtype=torch.float32, device=CPU, quant_dtype=quant_dtype, block=block
    )
    values = torch.randint(-16, 16, (5, 2, 4)) / 2
    slots = torch.tensor([7, 1, 4, 8, 2])
    rows.write(1, slots, *rows.quantize(values))
    assert torch.equal(rows.dequantize(1)[slots], values)
    assert torch.equal(rows.dequantize(0), torch.zeros(9, 2, 4))  # other layer untouched
    assert rows.scales.shape == (2, 9, 1 if block is None else 2)


def test_other_values_are_within_one_step_and_scales_are_powers_of_two():
    rows = QuantizedLayerRows(1, 4, (8,), dtype=torch.float32, device=CPU)
    values = torch.randn(3, 8, generator=torch.Generator().manual_seed(0)) * 5
    stored, scales = rows.quantize(values)
    assert stored.dtype == torch.int8
    assert torch.equal(torch.exp2(torch.log2(scales).round()), scales)
    rows.write(0, torch.tensor([1, 2, 3]), stored, scales)
    assert ((rows.dequantize(0)[1:] - values).abs() <= scales / 2 + 1e-6).all()


def test_write_scale_divides_only_when_the_write_casts_and_the_input_is_untouched():
    """Engines pass a checkpoint scale on every write: a write in the compute dtype is stored as
    given, one that casts (here float64 into float32) is divided first (docs/contract.md)."""
    rows = QuantizedLayerRows(1, 3, (4,), dtype=torch.float32, device=CPU)
    values = torch.tensor([[2.0, -4.0, 1.0, 0.0]])
    kept = values.clone()
    rows.write(0, torch.tensor([1]), *rows.quantize(values, scale=2.0))
    assert torch.equal(rows.dequantize(0)[1], kept[0])
    assert torch.equal(values, kept)
    wide = values.to(torch.float64)
    rows.write(0, torch.tensor([2]), *rows.quantize(wide, scale=2.0))
    assert torch.equal(rows.dequantize(0)[2], kept[0] / 2)
    assert torch.equal(wide, kept.to(torch.float64))


def test_gather_scatter_and_part_layouts_are_bit_exact():
    rows = QuantizedLayerRows(2, 6, (3,), dtype=torch.bfloat16, device=CPU)
    for layer in range(2):
        rows.write(layer, torch.tensor([1, 2, 3]), *rows.quantize(torch.randn(3, 3)))
    values, scales = rows.gather(torch.tensor([3, 1]))
    layouts = rows.part_layouts("k", 2)
    assert (tuple(values.shape), values.dtype) == layouts["k"]
    assert (tuple(scales.shape), scales.dtype) == layouts["k_scale"]
    before = [rows.dequantize(i)[torch.tensor([3, 1])] for i in range(2)]
    rows.scatter(torch.tensor([4, 5]), values, scales)
    assert all(torch.equal(rows.dequantize(i)[torch.tensor([4, 5])], before[i]) for i in range(2))
    assert rows.nbytes == 2 * 6 * 3 * 1 + 2 * 6 * 1 * 4


def test_bad_settings_are_refused():
    with pytest.raises(UnsupportedDtypeError):
        QuantizedLayerRows(1, 2, (4,), dtype=torch.float32, device=CPU, quant_dtype=torch.int32)
    with pytest.raises(ShapeMismatchError):
        QuantizedLayerRows(1, 2, (4,), dtype=torch.float32, device=CPU, block=3)


def _example_spec(monkeypatch, pool_class=None):
    """The example's spec, optionally with another pool class (imported from the checkout)."""
    import dataclasses
    from pathlib import Path

    root = Path(__file__).resolve().parent.parent / "examples" / "kvcache-example-pool"
    monkeypatch.syspath_prepend(str(root))
    import kvcache_example_pool as example

    (spec,) = example.kvcache_pool_specs()
    if pool_class is None:
        return spec, example

    def create(config):
        pool = pool_class(config)
        return pool, example.PagedSlotAllocator(config.size, config.page_size, pool)

    return dataclasses.replace(spec, pool_class=pool_class, factory=create), example


def test_the_int8_example_passes_the_whole_battery_in_process(monkeypatch):
    from kvcache_core.testing import check_conformance, conformance_cases

    spec, _ = _example_spec(monkeypatch)
    cases = conformance_cases(spec)
    assert len(cases) >= 10
    for case in cases:
        check_conformance(*case.values)


def test_kv_size_bytes_still_catches_a_quantised_pool_that_under_counts(monkeypatch):
    """A dequantised copy counts half a byte per value: not a free pass."""
    from kvcache_core.testing import check_conformance

    _, example = _example_spec(monkeypatch)

    class UnderCounting(example.Int8MHAPool):
        def get_kv_size_bytes(self) -> int:
            return 1

    spec, _ = _example_spec(monkeypatch, UnderCounting)
    with pytest.raises(AssertionError, match="under-counted"):
        check_conformance(spec, "kv-size-bytes")
