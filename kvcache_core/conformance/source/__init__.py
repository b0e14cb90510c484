"""The source level: parses plugin files with ``ast`` and never imports them, so it is safe on
untrusted code and works where a plugin's dependencies are not installed. ``drift`` is the same
analysis for an engine's own tree, with no contract at all (``kvcache drift``).
"""

from .level import check_class, find_class, run

__all__ = ["check_class", "find_class", "run"]
