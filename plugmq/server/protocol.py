"""RocketMQ 5's generated protocol code (``apache.rocketmq.v2``) without the client library's runtime.

The official ``rocketmq-python-client`` ships the generated modules as ``rocketmq.grpc_protocol``,
but ``rocketmq/__init__.py`` imports the whole client first: its producers, consumers, metrics
and the OpenTelemetry OTLP exporters (0.4 s on a quiet machine, 2.6 s under load), none of
which a server uses. This module loads ``rocketmq.grpc_protocol`` from the installed files under
its own name without executing ``rocketmq/__init__.py``.

Why load the installed modules rather than generate our own from the ``.proto`` files with
grpcio-tools at build time: the installed modules are exactly the protocol revision the client
speaks and were generated for the protobuf runtime the client pins; and a process that also
imports the client (tests, ``plugmq bench grpc``, an application embedding the server) gets the
very same module objects, so ``definition.proto`` is registered in protobuf's descriptor pool
once. A second, separately generated copy of the same ``.proto`` files would be registered
under the same file names and fail with "duplicate file name" as soon as the two differ.

Loading works because every import inside the generated package is either relative or ``from
rocketmq.grpc_protocol import ...``, which Python resolves from ``sys.modules`` without importing
the parent package. A later ``import rocketmq`` still runs the client's own ``__init__`` and
reuses the modules loaded here.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

__all__ = [
    "ClientType",
    "Code",
    "DigestType",
    "Encoding",
    "FilterType",
    "MessageType",
    "MessagingServiceStub",
    "Permission",
    "Settings",
    "Status",
    "TelemetryCommand",
    "TransactionResolution",
    "TransactionSource",
    "definition_pb2",
    "load_protocol",
    "service_pb2",
    "service_pb2_grpc",
]

PACKAGE = "rocketmq.grpc_protocol"


def _package_init() -> Path:
    spec = importlib.util.find_spec("rocketmq")  # a top-level name: found, not imported
    for location in (spec.submodule_search_locations or []) if spec is not None else []:
        init = Path(location, "grpc_protocol", "__init__.py")
        if init.is_file():
            return init
    raise ModuleNotFoundError(f"{PACKAGE} is not installed; plugmq serve needs the 'serve' extra: "
                              "pip install 'plugmq[serve]' (it brings rocketmq-python-client)", name="rocketmq")


def load_protocol() -> ModuleType:
    """The ``rocketmq.grpc_protocol`` package, loaded without the client's ``__init__`` if not loaded yet."""
    loaded = sys.modules.get(PACKAGE)
    if loaded is not None:
        return loaded
    init = _package_init()
    spec = importlib.util.spec_from_file_location(PACKAGE, init, submodule_search_locations=[str(init.parent)])
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[PACKAGE] = module
    try:
        spec.loader.exec_module(module)
    except BaseException:
        for name in [n for n in sys.modules if n == PACKAGE or n.startswith(PACKAGE + ".")]:
            del sys.modules[name]
        raise
    return module


class _Enum:
    """A protobuf enum as plain attributes: ``Code.OK`` through protobuf's EnumTypeWrapper costs
    about 2 us per access (a descriptor lookup), which adds up on every request."""

    def __init__(self, wrapper: Any) -> None:
        self._wrapper = wrapper
        self._values = tuple(wrapper.values())
        for name, number in wrapper.items():
            setattr(self, name, number)

    def Name(self, number: int) -> str:  # protobuf's spelling
        return str(self._wrapper.Name(number))

    def Value(self, name: str) -> int:  # protobuf's spelling
        return int(self._wrapper.Value(name))

    def values(self) -> tuple[int, ...]:
        return self._values

    def __getattr__(self, name: str) -> int:  # every name is set in __init__; this only satisfies mypy
        raise AttributeError(name)


_protocol = load_protocol()
definition_pb2 = _protocol.definition_pb2
service_pb2 = _protocol.service_pb2
service_pb2_grpc = _protocol.service_pb2_grpc
MessagingServiceStub = service_pb2_grpc.MessagingServiceStub
ClientType = _Enum(definition_pb2.ClientType)
Code = _Enum(definition_pb2.Code)
DigestType = _Enum(definition_pb2.DigestType)
Encoding = _Enum(definition_pb2.Encoding)
FilterType = _Enum(definition_pb2.FilterType)
MessageType = _Enum(definition_pb2.MessageType)
Permission = _Enum(definition_pb2.Permission)
TransactionResolution = _Enum(definition_pb2.TransactionResolution)
TransactionSource = _Enum(definition_pb2.TransactionSource)
Settings = definition_pb2.Settings
Status = definition_pb2.Status
TelemetryCommand = service_pb2.TelemetryCommand
