"""The conformance checker: levels over targets, one result model, one report pipeline.

Grouped by what each part does:

- ``targets/``: what the user named, resolved into the classes to check;
- ``members/``: reading a contract member and an implementation's, and comparing them (every
  level asks the same questions of a member, written once);
- one subpackage per level, ``source/``, ``signature/``, ``types/`` and ``behaviour/``, each
  listed once in [`LEVELS`][kvcache_core.conformance.runner.LEVELS] and run by ``runner``;
- ``results/``: the one result model, rule ids, merging, and the user's say over what counts
  (suppressions, expected failures, ``--select``);
- ``reporting/``: the report pipeline
  ([`report`][kvcache_core.conformance.reporting.report.report]) and one renderer per output
  format.

The names below are the checker as a library:
[`check`][kvcache_core.conformance.runner.check] is ``kvcache check`` without the command
line, and [`report`][kvcache_core.conformance.reporting.report.report] is what every caller
(the CLI, [`kvcache_core.testing`][kvcache_core.testing], the pytest plugin) runs on results,
so the same results give the same report whoever asks. This ``__init__``
imports no torch and no level (discovery imports the signature comparison at engine start-up;
a level is imported when it runs).
"""

from __future__ import annotations

from .reporting.report import EXIT_ERROR, EXIT_FINDINGS, EXIT_OK, FORMATS, Report, report
from .runner import LEVELS, Level, LevelOptions, check, run_levels

__all__ = [
    "EXIT_ERROR",
    "EXIT_FINDINGS",
    "EXIT_OK",
    "FORMATS",
    "LEVELS",
    "Level",
    "LevelOptions",
    "Report",
    "check",
    "report",
    "run_levels",
]
