"""Configuration: the broker's TOML tables validated into frozen values.

``broker`` (``[broker]``, ``[cluster]``, ``[plugins.*]``, ``[groups]`` into a BrokerConfig),
``policy`` (consumer groups' redelivery policy), ``datadir`` (checks of ``broker.data_dir``).
Imports ``plugmq.core`` only: the runtime, the server and the tools read configuration from here.
"""
