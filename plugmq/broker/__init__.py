"""The broker runtime: a Broker assembled from plugins, and the parts it is made of.

Topics, consumer groups, the state journals in the commit log, consumer offsets, pop consumption,
retention, roles and replication, failover, routes, traffic counters, the delay ledger; opening one
component outside a broker (``components``) and the module-level conveniences behind
``plugmq.allocate`` / ``plugmq.compile_filter`` (``api``). The runtime imports the SPI
(``plugmq.core``), configuration and the clients it builds; it never imports a plugin.
"""
