"""The contract read from its source (what the source level uses, so as never to import torch)
says exactly what the live Protocol classes say: members, signatures with their file and line,
attribute annotations and attribute lines, under every contract version."""

from __future__ import annotations

import pytest

from kvcache_core.conformance.members import contract_source, methods
from kvcache_core.conformance.members.introspect import protocol_attributes, protocol_methods
from kvcache_core.conformance.members.methods import PROTOCOL_ORDER, protocol_by_name
from kvcache_core.contracts.history import VERSIONS


@pytest.mark.parametrize("name", PROTOCOL_ORDER)
def test_members_and_signatures_match_the_live_protocol(name: str) -> None:
    proto = protocol_by_name(name)
    assert contract_source.source_protocol_methods(name) == protocol_methods(proto)
    assert list(contract_source.source_protocol_methods(name)) == list(protocol_methods(proto))
    assert contract_source.source_protocol_attributes(name) == protocol_attributes(proto)
    for version in VERSIONS:
        assert methods.contract_methods(name, version) == methods.contract_methods(proto, version)


@pytest.mark.parametrize("name", PROTOCOL_ORDER)
def test_attribute_lines_match_the_live_protocol(name: str) -> None:
    proto = protocol_by_name(name)
    for attribute in protocol_attributes(proto):
        assert contract_source.source_attribute_location(
            name, attribute
        ) == methods.attribute_location(proto, attribute)


def test_split_by_protocol_is_the_same_both_ways() -> None:
    for size in range(1, len(PROTOCOL_ORDER) + 1):
        chosen = list(reversed(PROTOCOL_ORDER[:size]))
        assert methods.split_by_protocol(chosen, from_source=True) == methods.split_by_protocol(
            chosen
        )


def test_an_unknown_protocol_name_is_refused_the_same_way() -> None:
    with pytest.raises(KeyError, match="unknown protocol 'Nope'"):
        methods.split_by_protocol(["Nope"], from_source=True)
    with pytest.raises(KeyError, match="unknown protocol 'Nope'"):
        methods.split_by_protocol(["Nope"])
