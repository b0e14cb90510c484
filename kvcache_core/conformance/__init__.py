"""The conformance checker: one result model, several levels, several renderers.

This package's ``__init__`` stays light (no torch import beyond the contract) because discovery
imports the signature comparison at engine start-up.
"""
