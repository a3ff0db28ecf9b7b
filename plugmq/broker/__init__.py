"""The broker runtime: a Broker facade over parts assembled from plugins.

``assembly`` builds the parts in dependency order and starts them; ``broker`` is the facade users
hold. The parts: ``sending`` (the put path), ``reads`` (pulls, reads by offset, id, key, time),
``writeback`` (what the delay and transaction services deliver), ``services`` (those services),
``redelivery`` (retries and dead letters), ``roles`` (roles, replication hooks, promotion and
demotion), ``events`` (event hooks, consumer wake-ups), ``lifecycle`` (open, closed, close order);
beside them topics, consumer groups, the state journals in the commit log, consumer offsets, pop
consumption, retention, replication, failover, routes, traffic counters, the delay ledger.
``ports`` says what the server and admin use of a broker. Opening one component outside a broker
is ``components``; the module-level conveniences behind ``plugmq.allocate`` /
``plugmq.compile_filter`` are ``api``. The runtime imports the SPI (``plugmq.core``),
configuration and the clients it builds; it never imports a plugin.
"""
