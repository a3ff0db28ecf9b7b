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

from collections.abc import Mapping
from pathlib import Path
from typing import Annotated, Any

import attrs

from plugmq.config.broker import read_toml
from plugmq.core.errors import ConfigError
from plugmq.core.logs import get_logger
from plugmq.core.schema import Expect, Problems, above, dotted, internal, non_empty, setting, structure

__all__ = ["Account", "AccountsFile", "AclOptions", "load_accounts_file", "parse_acl_table", "reload_acl"]

DEFAULT_CLOCK_SKEW_S = 900.0
log = get_logger(__name__)
_NAME = Annotated[str, Expect("a name")]


def _names(what: str, doc: str) -> Any:
    return setting(frozenset(), doc=doc, expected=f'a list of {what} names ("*" for all)')


@attrs.frozen(kw_only=True)
class Account:
    """One access key: its secret, the topics it may publish to and subscribe to, the groups it may consume as."""

    access_key: str = internal("", doc="the access key (the table's name)")
    secret: str = attrs.field(repr=False, validator=non_empty("give the secret key clients sign with"),
                              metadata={"doc": "the secret key clients sign with"})
    publish: frozenset[_NAME] = _names("topic", "topics this key may send to")
    subscribe: frozenset[_NAME] = _names("topic", "topics this key may receive from")
    admin: bool = setting(False, doc="may use the admin endpoint (plugmq admin --server)")
    groups: frozenset[_NAME] = _names("consumer group", "consumer groups this key may consume as (none by default)")

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

    enabled: bool = setting(False, doc="check every request's signature against the accounts")
    accounts: Mapping[str, Account] = setting(factory=dict, doc="[server.acl.accounts.<access-key>] tables",
                                              expected="a table of access keys")
    clock_skew_s: float = setting(DEFAULT_CLOCK_SKEW_S, doc="a signature's x-mq-date-time may be this far from the "
                                  "server's clock", expected="a number of seconds", validator=above(0))
    source: Path | None = internal(None, doc="the file the accounts are reloaded from")
    accounts_in_file: bool = internal(False, doc="the accounts are in accounts_file")
    reload_check_s: float = setting(5.0, doc="how often the file holding the accounts is checked for changes",
                                    expected="a number of seconds", validator=above(0))
    accounts_file: str | None = setting(None, doc="the accounts in a file of their own ([accounts.<key>] tables), "
                                        "relative to the config file")


@attrs.frozen
class AccountsFile:
    """An accounts file: ``[accounts.<access-key>]`` tables."""

    accounts: Mapping[str, Account] = setting(factory=dict, doc="the accounts", expected="a table of access keys")


def _named(accounts: Mapping[str, Account], where: str) -> dict[str, Account]:
    """The accounts under their access keys (``where``: the table they were read from, for the log)."""
    for key, account in accounts.items():
        if account.subscribe and not account.groups:
            # Group permissions are new: an account written before them subscribes to topics but may
            # consume as no group, so every receive it makes is refused. Say so once, at load.
            log.warning("account may subscribe to topics but consume as no consumer group; its receives are "
                        "refused until you add groups = [\"<group>\", ...] (or [\"*\"])", account=f"{where}.{key}")
    return {key: attrs.evolve(account, access_key=key) for key, account in accounts.items()}


def load_accounts_file(file: Path) -> dict[str, Account]:
    """The ``[accounts.<key>]`` tables of an accounts file."""
    try:
        raw = read_toml(file, "accounts file")
    except OSError as exc:
        raise ConfigError(f"cannot read accounts file {file}: {exc.strerror or exc}") from None
    return _named(structure(raw, AccountsFile, str(file)).accounts, f"{file}: accounts")


def parse_acl_table(table: Any, *, source: str = "", config_file: Path | None = None) -> AclOptions:
    """Validate ``[server.acl]`` (``<source>: server.acl...`` in errors); ``accounts_file`` is
    relative to ``config_file``'s directory. A ConfigError lists every problem."""
    found = Problems(source)
    acl = found.structure(table, AclOptions, ("server", "acl"))
    found.raise_any()
    assert acl is not None
    return finish_acl(acl, source=source, config_file=config_file)


def finish_acl(acl: AclOptions, *, source: str = "", config_file: Path | None = None) -> AclOptions:
    """A structured ``[server.acl]`` completed: the accounts named by their keys, read from
    ``accounts_file`` (relative to ``config_file``'s directory) when it names one."""
    found = Problems(source)
    accounts, origin = _named(acl.accounts, dotted(("server", "acl", "accounts"), source)), config_file
    if acl.accounts_file is not None:
        origin = Path(acl.accounts_file).expanduser()
        if not origin.is_absolute() and config_file is not None:
            origin = config_file.resolve().parent / origin
        if accounts:
            found.add_at(("server", "acl"), "give the accounts in [server.acl.accounts] or in accounts_file, not both",
                         colon=True)
        else:
            try:
                accounts = load_accounts_file(origin)
            except ConfigError as exc:
                found.extend(exc)
    if acl.enabled and not accounts and not found.lines:
        found.add_at(("server", "acl", "enabled"), "is true but no account is configured; add "
                     "[server.acl.accounts.<access-key>] with a secret (or an accounts_file), or set enabled = false")
    found.raise_any()
    return attrs.evolve(acl, accounts=accounts, source=origin, accounts_in_file=acl.accounts_file is not None)


def reload_acl(acl: AclOptions) -> AclOptions:
    """The accounts as the file holding them says now (ConfigError when it is invalid)."""
    if acl.source is None:
        return acl
    if acl.accounts_in_file:
        return attrs.evolve(acl, accounts=load_accounts_file(acl.source))
    raw = read_toml(acl.source)
    server = raw.get("server", {})
    table = server.get("acl", {}) if isinstance(server, Mapping) else {}
    fresh = parse_acl_table(table, source=str(acl.source), config_file=acl.source)
    if fresh.enabled != acl.enabled:
        raise ConfigError(f"{acl.source}: server.acl.enabled changed to {fresh.enabled}; turning access control on "
                          "or off needs a restart (the accounts were not reloaded)")
    return fresh
