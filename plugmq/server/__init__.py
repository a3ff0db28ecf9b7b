"""``plugmq serve``: a plugmq broker behind Apache RocketMQ 5's gRPC MessagingService.

Existing RocketMQ 5 clients (first of all the official ``rocketmq-python-client``) produce and
consume against a broker composed from any plugins. Needs the ``serve`` extra (grpcio and the
client package, whose generated ``rocketmq.grpc_protocol`` messages and servicer base classes
this package implements).
"""

from __future__ import annotations

from plugmq.server import protocol as _protocol  # noqa: F401 - first: the generated code, without the client
from plugmq.server.app import PlugmqServer, ServerThread, run
from plugmq.server.options import (
           ServerOptions,
           load_serve_config,
           parse_server_table,
)

__all__ = ["PlugmqServer", "ServerOptions", "ServerThread", "load_serve_config",
           "parse_server_table", "run"]
