"""The ``[server]`` table, the serve config loader and the signature check."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("rocketmq.grpc_protocol", reason="needs the serve extra (rocketmq-python-client)")

from rocketmq.grpc_protocol import Code
from rocketmq.v5.client import Credentials
from rocketmq.v5.util.signature import Signature

from plugmq.config.broker import load_config
from plugmq.config.policy import GroupPolicy, RedeliveryPolicy
from plugmq.core.errors import ConfigError
from plugmq.server.auth import Authenticator
from plugmq.server.options import (
    ServerOptions,
    load_serve_config,
    parse_server_table,
)
from plugmq.server.status import RpcFailure


def test_defaults_are_off_and_rocketmq_like() -> None:
    options = parse_server_table({})
    assert options == ServerOptions()
    assert not options.acl.enabled
    policy = load_config({}).groups.policy("any")
    assert policy.redelivery.max_attempts == 17 and not policy.fifo
    assert policy.redelivery.backoff_s[:3] == (10.0, 30.0, 60.0)


def test_group_tables_of_older_configs_are_read_by_the_broker(tmp_path: Path) -> None:
    """[server.default_group] / [server.groups.<g>] moved to [groups]; the old spelling still works."""
    path = tmp_path / "broker.toml"
    path.write_text('[broker]\ndata_dir = "d"\n[server]\nlisten = "0.0.0.0:9"\npop_fsync = true\n'
                    '[server.default_group]\nmax_delivery_attempts = 5\n'
                    '[server.groups.orders]\nfifo = true\nbackoff_s = [1, 2.5]\n', encoding="utf-8")
    broker, server = load_serve_config(path)
    config = load_config(broker)
    assert server.listen == "0.0.0.0:9" and config.pop_fsync
    assert config.groups.policy("orders") == GroupPolicy(RedeliveryPolicy(5, (1.0, 2.5)), fifo=True)
    assert config.groups.policy("other") == GroupPolicy(RedeliveryPolicy(5))


@pytest.mark.parametrize(("table", "message"), [
    ({"listn": "x"}, "unknown key. Did you mean 'listen'?"),
    ({"long_polling_s": -1}, "must be a positive number"),
    ({"long_polling_s": True}, "must be a number of seconds"),
    ({"new_group_from": "middle"}, "'first' or 'last'"),
    ({"min_invisible_s": 100, "max_invisible_s": 10}, "above max_invisible_s"),
    ({"groups": {"bad name": {}}}, "groups.bad name"),
    ({"pop_fsync": "yes"}, "server.pop_fsync must be true or false"),
    ({"groups": {"g": {"max_delivery_attempts": 0}}}, "must be >= 1"),
    ({"groups": {"g": {"backoff_s": []}}}, "is empty"),
    ({"groups": {"g": {"retries": 3}}}, "unknown key"),
    ({"acl": {"enabled": True}}, "no account is configured"),
    ({"acl": {"accounts": {"ak": {"secret": ""}}}}, "secret is empty"),
    ({"acl": {"accounts": {"ak": {"secret": "s", "publish": "all"}}}}, "a list of topic names"),
    ({"acl": {"accounts": {"ak": {"secret": "s", "owner": True}}}}, "unknown key"),
])
def test_bad_tables_name_the_key_and_the_fix(table: dict[str, Any], message: str) -> None:
    with pytest.raises(ConfigError, match="server") as caught:
        parse_server_table(table, source="b.toml")
    assert message in str(caught.value) and str(caught.value).startswith("b.toml: server")


def test_every_problem_of_a_server_table_at_once() -> None:
    with pytest.raises(ConfigError) as caught:
        parse_server_table({"listn": "x", "long_polling_s": -1, "max_batch": "8", "pop_fsync": "yes",
                            "acl": {"clock_skew_s": 0, "accounts": {"ak": {"secret": "", "publish": "all"}}},
                            "tls": {"cert": 5}}, source="b.toml")
    lines = caught.value.problems
    assert len(lines) == 8 and all(line.startswith("b.toml: server.") for line in lines), lines
    for expected in ("server.listn: unknown key. Did you mean 'listen'?", "server.long_polling_s must be a positive",
                     "server.max_batch must be an integer, got '8'", "server.pop_fsync must be true or false",
                     "server.acl.clock_skew_s must be > 0", "server.acl.accounts.ak.secret is empty",
                     "server.acl.accounts.ak.publish must be a list of topic names", "server.tls.cert must be a file"):
        assert any(expected in line for line in lines), (expected, lines)


def test_load_serve_config_splits_the_file_and_anchors_data_dir(tmp_path: Path) -> None:
    path = tmp_path / "broker.toml"
    path.write_text('[broker]\ndata_dir = "d"\nplugins = ["store_mmap"]\n[server]\nlisten = "0.0.0.0:9"\n'
                    '[plugins.store_mmap]\nflush = "async"\n', encoding="utf-8")
    broker, server = load_serve_config(path)
    assert server.listen == "0.0.0.0:9"
    config = load_config(broker)
    assert config.data_dir == tmp_path / "d" and config.plugin_options["store_mmap"] == {"flush": "async"}


def test_load_serve_config_reports_missing_and_broken_files(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="does not exist"):
        load_serve_config(tmp_path / "nope.toml")
    broken = tmp_path / "broken.toml"
    broken.write_text("[server\n", encoding="utf-8")
    with pytest.raises(ConfigError, match="not valid TOML"):
        load_serve_config(broken)


class _Config:
    def __init__(self, ak: str, sk: str) -> None:
        self.credentials = Credentials(ak, sk)
        self.namespace = ""


def _headers(ak: str, sk: str) -> dict[str, str]:
    return dict(Signature.metadata(_Config(ak, sk), "client-1"))


ACL = parse_server_table({"acl": {"enabled": True, "accounts": {"app": {"secret": "s3", "publish": ["A"],
                                                                        "subscribe": ["*"]}}}})


def test_the_clients_signature_is_verified() -> None:
    auth = Authenticator(ACL.acl)
    account = auth.account(_headers("app", "s3"))
    assert account is not None and account.access_key == "app"
    auth.require(account, "publish", "A")
    auth.require(account, "subscribe", "anything")
    with pytest.raises(RpcFailure) as forbidden:
        auth.require(account, "publish", "B")
    assert forbidden.value.code == Code.FORBIDDEN


@pytest.mark.parametrize("tamper", ["secret", "date", "scheme", "signed-headers"])
def test_tampered_signatures_are_unauthorized(tamper: str) -> None:
    headers = _headers("app", "wrong" if tamper == "secret" else "s3")
    if tamper == "date":
        headers["x-mq-date-time"] = "20000101T000000Z"
    elif tamper == "scheme":
        headers["authorization"] = headers["authorization"].replace("MQv2-HMAC-SHA1", "Basic")
    elif tamper == "signed-headers":
        headers["authorization"] = headers["authorization"].replace("SignedHeaders=x-mq-date-time", "SignedHeaders=")
    with pytest.raises(RpcFailure) as caught:
        Authenticator(ACL.acl).account(headers)
    assert caught.value.code == Code.UNAUTHORIZED


def test_access_control_off_lets_everything_through() -> None:
    auth = Authenticator(ServerOptions().acl)
    assert auth.account({}) is None
    auth.require(None, "publish", "any")
