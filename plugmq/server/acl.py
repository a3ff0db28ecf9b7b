"""The ``[server.acl]`` table: accounts, their topic and group permissions, the signature window.

::

    [server.acl]                    # off unless enabled
    enabled = true
    clock_skew_s = 900              # a signature's x-mq-date-time may be this far from the server's clock
    accounts_file = "accounts.toml" # optional: the accounts in a file of their own ([accounts.<key>] tables)
    reload_check_s = 5              # how often the file holding the accounts is checked for changes

    [server.acl.accounts.app1]      # the access key
    secret = "s3cret"
    publish = ["orders"]            # topics this key may send to ("*" = all)
    subscribe = ["orders"]          # topics this key may receive from
    groups = ["orders-app1"]        # consumer groups this key may consume as ("*" = all; none by default)
    admin = false                   # may use the admin endpoint (plugmq admin --server)

As RocketMQ 5.3's ACL 2.0, consuming needs two permissions: SUB on the topic and SUB on the group,
so an account allowed to read a topic still cannot take the messages of another team's group.
The accounts are reloaded without a restart when the file holding them changes (checked every
``reload_check_s`` on the broker's clock) and on SIGHUP (:class:`plugmq.server.auth.AccountBook`).
"""

from __future__ import annotations

import difflib
import tomllib
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import attrs

from plugmq.core.errors import ConfigError
from plugmq.core.logs import get_logger

__all__ = ["Account", "AclOptions", "expect", "load_accounts_file", "parse_acl_table", "reload_acl", "unknown_key"]

DEFAULT_CLOCK_SKEW_S = 900.0
log = get_logger(__name__)

_ACCOUNT_KEYS = ("secret", "publish", "subscribe", "groups", "admin")
_ACL_KEYS = ("enabled", "accounts", "accounts_file", "clock_skew_s", "reload_check_s")


@attrs.frozen
class Account:
    """One access key: its secret, the topics it may publish to and subscribe to, the groups it may consume as."""

    access_key: str
    secret: str = attrs.field(repr=False)
    publish: frozenset[str] = frozenset()
    subscribe: frozenset[str] = frozenset()
    admin: bool = False
    groups: frozenset[str] = frozenset()

    def may(self, action: str, topic: str) -> bool:
        allowed = self.publish if action == "publish" else self.subscribe
        return "*" in allowed or topic in allowed

    def may_consume(self, group: str) -> bool:
        return "*" in self.groups or group in self.groups


@attrs.frozen
class AclOptions:
    """Access control: the accounts, the signature date window, where the accounts are reloaded from.

    ``source``: the TOML file holding the accounts (the config file, or ``accounts_file``), read
    again on reload; None for accounts given as a mapping (tests, embedding)."""

    enabled: bool = False
    accounts: Mapping[str, Account] = attrs.field(factory=dict)
    clock_skew_s: float = DEFAULT_CLOCK_SKEW_S
    source: Path | None = None
    accounts_in_file: bool = False
    reload_check_s: float = 5.0


def unknown_key(path: str, key: str, known: Iterable[str]) -> ConfigError:
    """The error for an unknown ``key`` under ``path``, with the closest known one."""
    known = list(known)
    close = difflib.get_close_matches(key, known, n=1)
    hint = f" Did you mean {close[0]!r}?" if close else ""
    return ConfigError(f"{path}.{key}: unknown key.{hint} Known keys: {', '.join(sorted(known))}")


def expect(path: str, value: Any, kind: type | tuple[type, ...], what: str) -> Any:
    """``value`` if it is a ``kind`` (a bool is no number), else a ConfigError naming ``path`` and ``what``."""
    if not isinstance(value, kind) or (kind is int and isinstance(value, bool)) or (
            isinstance(kind, tuple) and bool not in kind and isinstance(value, bool)):
        raise ConfigError(f"{path} must be {what}, got {value!r}")
    return value


def _names(path: str, value: Any, what: str) -> frozenset[str]:
    expect(path, value, list, f'a list of {what} names ("*" for all)')
    for i, item in enumerate(value):
        expect(f"{path}[{i}]", item, str, f"a {what} name")
    return frozenset(value)


def _accounts(path: str, value: Any) -> dict[str, Account]:
    expect(path, value, Mapping, "a table of access keys")
    accounts: dict[str, Account] = {}
    for access_key, entry in value.items():
        where = f"{path}.{access_key}"
        expect(where, entry, Mapping, "a table with secret, publish, subscribe and groups")
        for field in entry:
            if field not in _ACCOUNT_KEYS:
                raise unknown_key(where, field, _ACCOUNT_KEYS)
        secret = expect(f"{where}.secret", entry.get("secret"), str, "the account's secret key (a string)")
        if not secret:
            raise ConfigError(f"{where}.secret is empty; give the secret key clients sign with")
        accounts[access_key] = Account(access_key, secret, _names(f"{where}.publish", entry.get("publish", []), "topic"),
                                       _names(f"{where}.subscribe", entry.get("subscribe", []), "topic"),
                                       expect(f"{where}.admin", entry.get("admin", False), bool, "true or false"),
                                       _names(f"{where}.groups", entry.get("groups", []), "consumer group"))
        if accounts[access_key].subscribe and not accounts[access_key].groups:
            # Group permissions are new: an account written before them subscribes to topics but may
            # consume as no group, so every receive it makes is refused. Say so once, at load.
            log.warning("account may subscribe to topics but consume as no consumer group; its receives are "
                        "refused until you add groups = [\"<group>\", ...] (or [\"*\"])", account=where)
    return accounts


def _read_toml(file: Path, what: str) -> dict[str, Any]:
    try:
        return tomllib.loads(file.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ConfigError(f"{what} {file} does not exist") from None
    except OSError as exc:
        raise ConfigError(f"cannot read {what} {file}: {exc.strerror or exc}") from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{file}: not valid TOML: {exc}") from None


def load_accounts_file(file: Path) -> dict[str, Account]:
    """The ``[accounts.<key>]`` tables of an accounts file."""
    raw = _read_toml(file, "accounts file")
    for key in raw:
        if key != "accounts":
            raise unknown_key(str(file), key, ("accounts",))
    return _accounts(f"{file}: accounts", raw.get("accounts", {}))


def parse_acl_table(path: str, table: Any, *, config_file: Path | None = None) -> AclOptions:
    """Validate ``[server.acl]``; ``accounts_file`` is relative to ``config_file``'s directory."""
    expect(path, table, Mapping, "a table")
    for key in table:
        if key not in _ACL_KEYS:
            raise unknown_key(path, key, _ACL_KEYS)
    enabled = expect(f"{path}.enabled", table.get("enabled", False), bool, "true or false")
    skew = expect(f"{path}.clock_skew_s", table.get("clock_skew_s", DEFAULT_CLOCK_SKEW_S), (int, float),
                   "a number of seconds")
    check = expect(f"{path}.reload_check_s", table.get("reload_check_s", 5.0), (int, float), "a number of seconds")
    if skew <= 0 or check <= 0:
        raise ConfigError(f"{path}: clock_skew_s and reload_check_s must be positive, got {skew!r} and {check!r}")
    accounts = _accounts(f"{path}.accounts", table.get("accounts", {}))
    source = config_file
    in_file = "accounts_file" in table
    if in_file:
        name = expect(f"{path}.accounts_file", table["accounts_file"], str, "a file path")
        source = Path(name).expanduser()
        if not source.is_absolute() and config_file is not None:
            source = config_file.resolve().parent / source
        if accounts:
            raise ConfigError(f"{path}: give the accounts in [server.acl.accounts] or in accounts_file, not both")
        accounts = load_accounts_file(source)
    if enabled and not accounts:
        raise ConfigError(f"{path}.enabled is true but no account is configured; add [{path}.accounts.<access-key>] "
                          "with a secret (or an accounts_file), or set enabled = false")
    return AclOptions(enabled, accounts, float(skew), source, in_file, float(check))


def reload_acl(acl: AclOptions) -> AclOptions:
    """The accounts as the file holding them says now (ConfigError when it is invalid)."""
    if acl.source is None:
        return acl
    if acl.accounts_in_file:
        return attrs.evolve(acl, accounts=load_accounts_file(acl.source))
    raw = _read_toml(acl.source, "config file")
    server = raw.get("server", {})
    table = server.get("acl", {}) if isinstance(server, Mapping) else {}
    fresh = parse_acl_table(f"{acl.source}: server.acl", table, config_file=acl.source)
    if fresh.enabled != acl.enabled:
        raise ConfigError(f"{acl.source}: server.acl.enabled changed to {fresh.enabled}; turning access control on "
                          "or off needs a restart (the accounts were not reloaded)")
    return fresh
