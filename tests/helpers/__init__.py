"""Helper modules the tests import by name: values and small functions, no fixtures.

- ``clients``: the official RocketMQ clients, started and always shut down.
- ``children``: the command that runs a test module as a child process (crash tests).
- ``example_plugins``: small plugins written the way a third party would (plugin-loading tests).
- ``mmap_workload``: a store_mmap workload the append and scan kernels are compared on.
- ``store_mmap_reference``: the store_mmap data dir an earlier build wrote (tests/data), and how.
- ``kernel_fuzz``: the child program fuzzing each compiled kernel entry point against its twin.
- ``legacy_state``: state files as plugmq wrote them before the journal (import tests).
- ``replication``: the end of a broker's replicated log.
- ``stores``: a stored message read back (asserted present).
- ``services``: a broker's optional services (transactions, delay), asserted present.
"""
