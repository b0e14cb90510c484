"""Member comparison: what every level asks of a class, written once.

A contract method or attribute is read (from the live Protocol with ``introspect``, or from its
source with ``contract_source``), an implementation's member is read the same two ways
(``sources`` for files never imported, ``signatures`` for the neutral ``MethodSig``), and
``compare``, ``annotations``, ``bodies`` and ``versions`` say how they differ; ``methods``
runs those checks for one member, ``infer`` guesses which Protocols a class claims. The levels
differ only in how they obtain a member, never in what they conclude from it.
"""
