"""What ``plugmq serve`` imports until it has answered its first request: nothing serving does not need.

Start-up CPU is mostly imports, and on a busy machine every tenth of a second of CPU before the
first answer is several tenths of wall time. The real command runs as a child through a Heartbeat
and a SIGTERM shutdown, and writes the modules it holds when it exits (``sys.modules``, from an
``atexit`` hook registered before the command starts); the modules of other verbs and of optional
features that are off must not be there. No timing: a module is imported or it is not.
"""

from __future__ import annotations

import signal
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("grpc", reason="needs the serve extra (grpcio)")

import grpc

from plugmq.server.protocol import Code, service_pb2, service_pb2_grpc
from plugmq.testing import await_listening

# What the ``plugmq`` console script runs, after an exit hook that lists the loaded modules.
_MAIN = """import atexit, sys

def dump_modules(path=sys.argv.pop(1)):
    with open(path, "w", encoding="utf-8") as out:
        out.write("\\n".join(sorted(name for name, module in sys.modules.items() if module is not None)))

atexit.register(dump_modules)
from plugmq.cli import main
main()
"""
WAIT_S = 60.0

# Top-level packages serving never needs (rich: structlog would import it for pretty tracebacks,
# which the command line does not use; prometheus_client: only with [server] metrics_listen).
_NEVER_PACKAGES = {"rich", "pygments", "pandas", "pyarrow", "pyspark", "matplotlib", "prometheus_client",
                   "kazoo", "redis", "opentelemetry", "hypothesis", "pytest"}
# Modules of other verbs, the client library's runtime, the admin verbs (loaded on the first admin call).
_NEVER_MODULES = ("rocketmq.v5", "plugmq.admin", "plugmq.spark", "plugmq.bench", "plugmq.conformance",
                  "plugmq.cli.admin", "plugmq.cli.bench", "plugmq.cli.demo", "plugmq.server.metrics",
                  "plugmq.testing", "plugmq.chaos", "plugmq.cli.chaos", "tomli_w")


def _imported_during_serve(tmp_path: Path, store: str) -> set[str]:
    config = tmp_path / "broker.toml"
    config.write_text(f'[broker]\ndata_dir = "data"\nplugins = ["{store}", "filter_tag"]\n', encoding="utf-8")
    log = tmp_path / "serve.log"
    dump = tmp_path / "modules.txt"
    with open(log, "wb") as stderr:
        process = subprocess.Popen(
            [sys.executable, "-c", _MAIN, str(dump), "--log-level", "info", "serve", "--config", str(config),
             "--listen", "127.0.0.1:0"],
            stdout=subprocess.PIPE, stderr=stderr, stdin=subprocess.DEVNULL, cwd=tmp_path)
        try:
            address = await_listening(process, WAIT_S)
            assert address is not None, f"plugmq serve did not come up: {log.read_text(errors='replace')[-2000:]}"
            with grpc.insecure_channel(address) as channel:
                response = service_pb2_grpc.MessagingServiceStub(channel).Heartbeat(
                    service_pb2.HeartbeatRequest(), timeout=WAIT_S, metadata=(("x-mq-client-id", "imports-probe"),))
            assert response.status.code == Code.OK
        finally:
            process.send_signal(signal.SIGTERM)
            try:
                exit_code = process.wait(timeout=WAIT_S)
            except subprocess.TimeoutExpired:
                process.kill()  # never leave a server behind
                process.wait()
                raise
    assert exit_code == 0, log.read_text(errors="replace")[-2000:]
    return set(dump.read_text(encoding="utf-8").split())


def _unneeded(modules: set[str], also: set[str]) -> list[str]:
    packages = _NEVER_PACKAGES | also
    return sorted(m for m in modules if m.split(".")[0] in packages
                  or any(m == n or m.startswith(n + ".") for n in _NEVER_MODULES))


@pytest.mark.parametrize(("store", "numpy_needed"), [("store_lmdb", False), ("store_mmap", True)])
def test_serve_imports_only_what_serving_needs(tmp_path: Path, store: str, numpy_needed: bool) -> None:
    modules = _imported_during_serve(tmp_path, store)
    assert {"plugmq.server.app", f"plugmq.plugins.{store}.store", "plugmq.plugins.filter_tag.tagfilter"} <= modules
    # store_mmap opens and recovers its files with numpy; no other part of the serve path needs it
    assert _unneeded(modules, set() if numpy_needed else {"numpy"}) == []
