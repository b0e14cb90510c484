"""The behaviour level: a battery of named checks that build tiny pools through a plugin's own
factory and hold them to what the contract promises about data, not signatures.

A pool can have every signature right and still return views instead of copies, reload into
the wrong slots or leak a write into another layer; only running it can tell. Checks are
registered in ``checks/`` (one module per concern), selected by the capabilities a ``PoolSpec``
declares, run in isolation with a timeout, and report through the checker's one result model.
"""

from __future__ import annotations

# Register the battery now: ``BATTERY`` is public, and a caller iterating it before the first
# ``select_checks`` call would otherwise see it empty.
from . import checks  # noqa: F401
from ._check import BATTERY, BehaviourCheck, BehaviourFailure, behaviour_check
from ._context import DEFAULT_TIMEOUT_S, CheckContext, Layer, config_source, default_config
from ._run import run_check, run_spec, select_checks
from ._state import attention_layer_ids, capture, first_difference, same_bits

__all__ = [
    "BATTERY",
    "DEFAULT_TIMEOUT_S",
    "BehaviourCheck",
    "BehaviourFailure",
    "CheckContext",
    "Layer",
    "attention_layer_ids",
    "behaviour_check",
    "capture",
    "config_source",
    "default_config",
    "first_difference",
    "run_check",
    "run_spec",
    "same_bits",
    "select_checks",
]
