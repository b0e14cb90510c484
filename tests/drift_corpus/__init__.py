"""Drifted pool and allocator classes, one or more per checker rule, each with a fixed twin.

Every line the checker must report carries a comment ``# expect: RULE Class.method`` (several
separated by ``;``). ``expect`` lines must be reported by the source *and* the signature level,
``expect[source]`` only by the source level (attributes, unresolved bases, files that cannot be
imported here), ``expect[drift]`` by ``kvcache drift`` over ``drift_tree/``. ``Class`` is the
class the finding is about; the line is where the finding points (for an inherited method, the
base class's line). Classes not named in any expectation must pass.

Everything here except ``source_only/`` imports on a CPU machine (the signature level needs
that); ``source_only/`` imports GPU-only packages that are not installed.
"""
