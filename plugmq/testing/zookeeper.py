"""A standalone Apache ZooKeeper on a loopback port, its data in a directory of the caller's.

Debian's ``zookeeper`` package (3.8) runs as ``java -cp /usr/share/java/zookeeper.jar:<conf dir>
org.apache.zookeeper.server.ZooKeeperServerMain zoo.cfg``; the jar's manifest names the other
jars it needs. Tests use it through a fixture that skips with :func:`zookeeper_missing`'s reason.

With :class:`ZooKeeperTls` it serves TLS only (``secureClientPort``, no plain port) through its
Netty connection factory: the jar's manifest omits two Netty jars that factory needs
(``netty-codec``, ``netty-resolver``, both in Debian's ``libnetty-java``, which the zookeeper
package depends on), so they are added to the class path; the key store is a PEM file holding
the PKCS#8 key and the certificate chain (``ssl.keyStore.type=PEM``, ZooKeeper >= 3.5.5).
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import ssl
import subprocess
import time
from pathlib import Path
from typing import IO, Self

import attrs

__all__ = ["DEFAULT_JAR", "ZooKeeperServer", "ZooKeeperTls", "free_port", "zookeeper_missing"]

DEFAULT_JAR = Path(os.environ.get("PLUGMQ_ZOOKEEPER_JAR", "/usr/share/java/zookeeper.jar"))
_MAIN = "org.apache.zookeeper.server.ZooKeeperServerMain"
_NETTY_JARS = ("netty-codec.jar", "netty-resolver.jar")  # the Netty factory needs them; the manifest omits them


@attrs.frozen
class ZooKeeperTls:
    """TLS-only serving: the server's PEM certificate chain and key, and the CA whose client
    certificates it requires (``client_auth``: "need", "want" or "none")."""

    cert: Path
    key: Path
    ca: Path
    client_auth: str = "need"

    def key_store(self, directory: Path) -> Path:
        """The key and chain in one PEM file, the key as PKCS#8 (ZooKeeper's PEM reader needs it)."""
        from cryptography.hazmat.primitives import serialization

        key = serialization.load_pem_private_key(self.key.read_bytes(), password=None)
        path = directory / "keystore.pem"
        path.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                           serialization.NoEncryption()) + self.cert.read_bytes())
        path.chmod(0o600)
        return path

    def client_context(self) -> ssl.SSLContext:
        """A context that reaches this server (for the readiness probe): the CA, and the server's
        own pair as the client certificate."""
        context = ssl.create_default_context(cafile=str(self.ca))
        context.check_hostname = False
        context.load_cert_chain(str(self.cert), str(self.key))
        return context


def zookeeper_missing(jar: Path = DEFAULT_JAR, *, tls: bool = False) -> str | None:
    """Why a ZooKeeper server (serving TLS, with ``tls``) cannot be started here (None when it can)."""
    if shutil.which("java") is None:
        return "Java is not installed (apt-get install openjdk-17-jre-headless)"
    if not jar.is_file():
        return f"ZooKeeper is not installed: {jar} is missing (apt-get install zookeeper)"
    missing = [name for name in _NETTY_JARS if tls and not (jar.parent / name).is_file()]
    if missing:
        return f"ZooKeeper cannot serve TLS here: {', '.join(missing)} missing beside {jar} (apt-get install libnetty-java)"
    return None


def free_port() -> int:
    """A loopback TCP port free now (another process may take it before the caller binds it)."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


def _answers(port: int, tls: ZooKeeperTls | None = None) -> bool:
    """ZooKeeper's ``srvr`` four-letter command answers once the server serves."""
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=1) as plain:
            connection = plain if tls is None else tls.client_context().wrap_socket(plain)
            connection.sendall(b"srvr")
            return b"Zookeeper version" in connection.recv(4096)
    except OSError:
        return False


class ZooKeeperServer:
    """One standalone server: ``start()`` returns its ``hosts`` string, ``stop()`` ends it.

    ``tick_ms`` is ZooKeeper's tickTime: sessions expire within about one tick of their timeout.
    Session timeouts from 1 s to 60 s are granted. ``stop()`` then ``start()`` restarts it on the
    same port with the same data (sessions that outlive the downtime survive it).
    """

    def __init__(self, directory: Path, *, tick_ms: int = 200, jar: Path = DEFAULT_JAR,
                 tls: ZooKeeperTls | None = None) -> None:
        self.directory = Path(directory)
        self.tls = tls
        self.tick_ms = tick_ms
        self.jar = jar
        self.port: int | None = None
        self.process: subprocess.Popen[bytes] | None = None
        self._log: IO[bytes] | None = None

    @property
    def hosts(self) -> str:
        if self.port is None:
            raise RuntimeError("ZooKeeper is not started")
        return f"127.0.0.1:{self.port}"

    def _write_config(self, port: int) -> Path:
        data = self.directory / "data"
        data.mkdir(parents=True, exist_ok=True)
        config = self.directory / "zoo.cfg"
        if self.tls is None:
            listen = f"clientPort={port}\nclientPortAddress=127.0.0.1\n"
        else:
            tls = self.tls
            listen = (f"secureClientPort={port}\nsecureClientPortAddress=127.0.0.1\n"
                      "serverCnxnFactory=org.apache.zookeeper.server.NettyServerCnxnFactory\n"
                      f"ssl.keyStore.location={tls.key_store(self.directory)}\nssl.keyStore.type=PEM\n"
                      f"ssl.trustStore.location={tls.ca}\nssl.trustStore.type=PEM\n"
                      f"ssl.clientAuth={tls.client_auth}\n")
        config.write_text(
            f"tickTime={self.tick_ms}\ndataDir={data}\n{listen}"
            "admin.enableServer=false\nminSessionTimeout=1000\nmaxSessionTimeout=60000\n"
            "4lw.commands.whitelist=srvr,ruok\n", encoding="utf-8")
        return config

    def _class_path(self, config: Path) -> str:
        jars = [str(self.jar)]
        if self.tls is not None:
            jars += [str(self.jar.parent / name) for name in _NETTY_JARS]
        return ":".join([*jars, str(config.parent)])

    def start(self, timeout_s: float = 60.0) -> str:
        missing = zookeeper_missing(self.jar, tls=self.tls is not None)
        if missing:
            raise RuntimeError(missing)
        self.directory.mkdir(parents=True, exist_ok=True)
        for _attempt in range(3):  # another process may take the free port before Java binds it
            port = self.port or free_port()
            config = self._write_config(port)
            self._log = open(self.directory / "zookeeper.log", "ab")  # noqa: SIM115 - closed in stop()
            self.process = subprocess.Popen(
                ["java", "-Xmx256m", "-cp", self._class_path(config), _MAIN, str(config)],
                stdout=self._log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
            deadline = time.monotonic() + timeout_s
            while time.monotonic() < deadline and self.process.poll() is None:
                if _answers(port, self.tls):
                    self.port = port
                    return self.hosts
                time.sleep(0.1)
            self.stop()
            if self.port is not None:
                break  # a restart on a fixed port: trying another port would lose the clients
        raise RuntimeError(f"ZooKeeper did not start; see {self.directory / 'zookeeper.log'}")

    def stop(self, signum: int = signal.SIGTERM) -> None:
        """Stop the server (``signum``, then SIGKILL after 10 s). Idempotent. SIGKILL is a crash:
        ``start()`` then recovers it from its data directory, on the same port."""
        process, self.process = self.process, None
        if process is not None and process.poll() is None:
            process.send_signal(signum)
            try:
                process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
        if self._log is not None:
            self._log.close()
            self._log = None

    def __enter__(self) -> Self:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
