"""Helper modules the tests import by name: values and small functions, no fixtures.

- ``example_plugins``: small plugins written the way a third party would (plugin-loading tests).
- ``legacy_state``: state files as plugmq wrote them before the journal (import tests).
- ``replication``: the end of a broker's replicated log.
"""
