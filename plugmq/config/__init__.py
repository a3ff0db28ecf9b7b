"""Configuration: the broker's TOML tables validated into frozen values.

``broker`` (``[broker]``, ``[cluster]``, ``[plugins.*]``, ``[groups]`` into a BrokerConfig),
``policy`` (consumer groups' redelivery policy), ``datadir`` (checks of ``broker.data_dir``),
``check`` (every problem of a file, for ``plugmq check-config``), ``reference`` (every key's type,
default and meaning, generated from the schemas). Each table is an attrs schema checked by the
engine of :mod:`plugmq.core.schema`. Imports ``plugmq.core`` only: the runtime, the server and the
tools read configuration from here.
"""
