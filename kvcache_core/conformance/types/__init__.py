"""The types level: mypy checks each class against each contract Protocol, member by member,
over small torch stubs. Loaded by name by the runner, so a kvcache without mypy still runs the
other levels.
"""
