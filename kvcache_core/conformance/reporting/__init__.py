"""Reporting: from results to the report a person or a CI system reads.

``report`` is the one pipeline every caller runs (suppress, merge, render, exit code);
``render`` holds one renderer per output format.
"""
