"""What a check run yields and what decides which of it counts.

``model`` is the one result model (``CheckResult``, ``Finding``) and ``rules`` its stable rule
ids; ``merge`` folds what several levels saw into one finding; ``suppressions``, ``expected``
and ``selection`` are the user's say over which findings and checks count (``battery_ids``
names the behaviour checks without importing them); ``usage`` is the error every command turns
into exit code 2.
"""
