"""The security settings and their parts, in process: ``[server.tls]`` and ``[server.acl]``
errors, the exposure warning, receipt sealing, bounded inflation, the pruning of silent clients."""

from __future__ import annotations

import gzip
import logging
import os
import zlib
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("grpc", reason="needs the serve extra (grpcio)")
pytest.importorskip("trustme", reason="needs the test extra (trustme)")

from plugmq.core.clock import ManualClock
from plugmq.core.errors import ConfigError, ReceiptHandleError, StoreError
from plugmq.server import parse_server_table
from plugmq.server.assignment import ConsumerMembers
from plugmq.server.convert import inflate
from plugmq.server.options import load_serve_config
from plugmq.server.protocol import Code
from plugmq.server.receipts import ReceiptSealer
from plugmq.server.status import RpcFailure
from plugmq.server.tls import beyond_loopback, warn_when_exposed
from tests.security_helpers import make_certs


@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    directory = tmp_path_factory.mktemp("certs")
    make_certs(directory)
    (directory / "junk.pem").write_text("not a certificate\n")
    return directory


def _tls(certs: Path, **table: str) -> ConfigError:
    with pytest.raises(ConfigError) as caught:
        parse_server_table({"tls": table}, source="b.toml", config_file=certs / "b.toml")
    return caught.value


def test_tls_files_are_read_relative_to_the_config_file(certs: Path) -> None:
    config = certs / "broker.toml"
    config.write_text('[broker]\ndata_dir = "d"\n[server.tls]\ncert = "server.pem"\nkey = "server.key"\n'
                      'client_ca = "ca.pem"\n')
    _, options = load_serve_config(config)
    assert options.tls is not None and options.tls.mutual and options.tls.metrics
    assert options.tls.cert_path == certs / "server.pem"


def test_tls_config_errors_name_the_file_and_the_fix(certs: Path) -> None:
    assert "cert missing" in str(_tls(certs, key="server.key"))
    assert "certificate file" in str(_tls(certs, cert="nope.pem", key="server.key"))
    assert "does not exist" in str(_tls(certs, cert="nope.pem", key="server.key"))
    assert "holds no PEM certificate" in str(_tls(certs, cert="junk.pem", key="server.key"))
    assert "is a directory" in str(_tls(certs, cert=".", key="server.key"))
    mismatch = str(_tls(certs, cert="server.pem", key="client.key"))
    assert "client.key does not belong to the certificate" in mismatch
    assert "not a PEM private key" in str(_tls(certs, cert="server.pem", key="junk.pem"))
    assert "unknown key" in str(_tls(certs, cert="server.pem", key="server.key", cipher="x"))
    assert "client CA" in str(_tls(certs, cert="server.pem", key="server.key", client_ca="nope.pem"))


def test_an_expired_certificate_is_refused_at_load(tmp_path: Path) -> None:
    import datetime

    import trustme

    ca = trustme.CA()
    old = ca.issue_cert("127.0.0.1", not_after=datetime.datetime(2020, 1, 1, tzinfo=datetime.UTC))
    old.cert_chain_pems[0].write_to_path(str(tmp_path / "old.pem"))
    old.private_key_pem.write_to_path(str(tmp_path / "old.key"))
    with pytest.raises(ConfigError, match="expired on 2020-01-01"):
        parse_server_table({"tls": {"cert": "old.pem", "key": "old.key"}}, config_file=tmp_path / "b.toml")


def test_acl_groups_skew_and_accounts_file_are_validated(tmp_path: Path) -> None:
    acl = parse_server_table({"acl": {"enabled": True, "clock_skew_s": 60, "accounts": {
        "app": {"secret": "s", "subscribe": ["T"], "groups": ["g1"]}}}}).acl
    assert acl.clock_skew_s == 60 and acl.accounts["app"].may_consume("g1")
    assert not acl.accounts["app"].may_consume("g2")
    with pytest.raises(ConfigError, match="groups must be a list of consumer group names"):
        parse_server_table({"acl": {"enabled": True, "accounts": {"app": {"secret": "s", "groups": "g1"}}}})
    with pytest.raises(ConfigError, match="Did you mean 'groups'"):
        parse_server_table({"acl": {"enabled": True, "accounts": {"app": {"secret": "s", "group": ["g1"]}}}})
    with pytest.raises(ConfigError, match="accounts file .* does not exist"):
        parse_server_table({"acl": {"enabled": True, "accounts_file": "missing.toml"}},
                           config_file=tmp_path / "b.toml")
    (tmp_path / "acc.toml").write_text('[accounts.app]\nsecret = "s"\ngroups = ["*"]\n')
    loaded = parse_server_table({"acl": {"enabled": True, "accounts_file": "acc.toml"}},
                                config_file=tmp_path / "b.toml").acl
    assert loaded.accounts["app"].may_consume("anything") and loaded.source == tmp_path / "acc.toml"


def test_a_port_beyond_loopback_without_tls_or_acl_is_a_loud_warning(caplog: pytest.LogCaptureFixture) -> None:
    assert not beyond_loopback("127.0.0.1") and not beyond_loopback("[::1]") and not beyond_loopback("localhost")
    assert beyond_loopback("0.0.0.0") and beyond_loopback("[::]") and beyond_loopback("10.1.2.3")
    assert beyond_loopback("broker.example")
    with caplog.at_level(logging.WARNING):
        warn_when_exposed("gRPC port", "127.0.0.1:8081", tls=False, authenticated=False)
        assert caplog.records == []
        warn_when_exposed("gRPC port", "0.0.0.0:8081", tls=True, authenticated=True)
        assert caplog.records == []
        warn_when_exposed("metrics port", "0.0.0.0:5557", tls=False, authenticated=False)
    assert "SECURITY: the metrics port listens on 0.0.0.0:5557, beyond loopback, without TLS and access control" \
        in caplog.text


def test_receipt_handles_are_bound_to_group_topic_and_key(tmp_path: Path) -> None:
    sealer = ReceiptSealer.for_data_dir(tmp_path)
    sealed = sealer.seal("g", "T", "0:5:17")
    assert sealer.open("g", "T", sealed) == "0:5:17"
    assert ReceiptSealer.for_data_dir(tmp_path).open("g", "T", sealed) == "0:5:17"  # the key is kept
    for group, topic, handle in (("other", "T", sealed), ("g", "U", sealed), ("g", "T", "0:5:17"),
                                 ("g", "T", sealed.replace("0:5:17", "0:5:18")), ("g", "T", sealed[:-1] + ("B" if sealed.endswith("A") else "A"))):
        with pytest.raises(ReceiptHandleError, match="was not issued by this broker"):
            sealer.open(group, topic, handle)
    with pytest.raises(ReceiptHandleError):
        ReceiptSealer(os.urandom(32)).open("g", "T", sealed)  # another broker's key
    (tmp_path / "server" / "receipt.key").write_bytes(b"short")
    with pytest.raises(StoreError, match="was damaged"):
        ReceiptSealer.for_data_dir(tmp_path)


def test_inflate_stops_at_the_limit() -> None:
    assert inflate(gzip.compress(b"a") + gzip.compress(b"b"), 10) == b"ab"
    assert inflate(zlib.compress(b"zlib too"), 10) == b"zlib too"
    with pytest.raises(RpcFailure) as caught:
        inflate(gzip.compress(bytes(64 << 20)), 1 << 20)
    assert caught.value.code == Code.MESSAGE_BODY_TOO_LARGE
    for bad in (b"not gzip", gzip.compress(b"cut short")[:-6]):
        with pytest.raises(RpcFailure) as caught:
            inflate(bad, 100)
        assert caught.value.code == Code.MESSAGE_CORRUPTED


def test_silent_clients_are_pruned_on_the_clock() -> None:
    clock = ManualClock()
    members = ConsumerMembers(clock, expiry_s=10)
    members.start_pruning()
    for i in range(1000):
        members.seen(f"g{i % 7}", f"c{i}")
        members.access_point(f"c{i}", "127.0.0.1:8081")
    clock.advance(8)
    members.seen("g0", "alive")
    assert members.size() == 2001
    clock.advance(7)  # prunes ran at 5, 10 and 15 s (every expiry / 2); at 15 the 1,000 were 15 s silent
    assert members.size() == 1 and members.members("g0") == ["alive"]
    members.stop_pruning()


def _listening(pid: int) -> set[str]:
    """``host:port`` (hex, as /proc/net/tcp* writes it) of every socket process ``pid`` listens on."""
    inodes = set()
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        try:
            target = os.readlink(fd)
        except OSError:
            continue
        if target.startswith("socket:["):
            inodes.add(target[8:-1])
    listening = set()
    for table in ("tcp", "tcp6"):
        for line in Path(f"/proc/{pid}/net/{table}").read_text().splitlines()[1:]:
            fields = line.split()
            if fields[3] == "0A" and fields[9] in inodes:  # LISTEN
                listening.add(fields[1])
    return listening


def _loopback(hex_address: str) -> bool:
    host = hex_address.split(":")[0]
    if len(host) == 8:
        return host.endswith("7F")  # 127.x.x.x, little-endian
    return host in ("00000000000000000000000001000000", "0000000000000000FFFF00000100007F")


def test_spark_in_local_mode_listens_on_loopback_only_with_its_ui_off(spark: Any) -> None:
    assert spark.conf.get("spark.ui.enabled") == "false"
    assert spark.sparkContext.uiWebUrl is None
    pid = int(spark.sparkContext._jvm.ProcessHandle.current().pid())
    listening = _listening(pid)
    assert listening, "the Spark JVM listens on nothing (its driver RPC should be there)"
    assert all(_loopback(address) for address in listening), f"Spark listens beyond loopback: {listening}"
