"""The shared conformance suite: the contract of every plugin family, as pytest base classes.

A plugin author runs ``plugmq conformance --plugin NAME`` (or
``pytest --pyargs plugmq.conformance --plugmq-plugin NAME``). Each family module holds a base
class that needs one fixture; capabilities a plugin does not declare become skips with the reason.
"""
