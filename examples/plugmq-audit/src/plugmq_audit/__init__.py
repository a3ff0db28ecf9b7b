"""An observer plugin: counts stored and delivered messages per topic and logs them.

The counts live in ``COUNTS`` (per broker name) so a test or an admin hook can read them.
"""

from __future__ import annotations

import threading
from collections import Counter

import attrs

from plugmq.core import Family, PluginContext, PluginDeclaration, StoredMessage, get_logger, hookimpl

log = get_logger(__name__)

_lock = threading.Lock()
#: broker name -> Counter of ("stored" | "delivered", topic)
COUNTS: dict[str, Counter[tuple[str, str]]] = {}
_options: dict[str, AuditOptions] = {}


@attrs.frozen
class AuditOptions:
    """``log_every``: log one line per N events (0 = count only, never log)."""

    log_every: int = attrs.field(default=1, validator=attrs.validators.ge(0))


def _count(broker_name: str, event: str, message: StoredMessage) -> None:
    with _lock:
        counter = COUNTS.setdefault(broker_name, Counter())
        counter[(event, message.topic)] += 1
        total = counter[(event, message.topic)]
    every = _options.get(broker_name, AuditOptions()).log_every
    if every and total % every == 0:
        log.info("audit", kind=event, broker=broker_name, topic=message.topic,
                 queue=message.queue_id, offset=message.queue_offset, total=total)


@hookimpl
def plugmq_declare() -> PluginDeclaration:
    return PluginDeclaration(
        name="audit", families={Family.EVENTS}, options=AuditOptions,
        description="counts and logs stored and delivered messages",
    )


@hookimpl
def plugmq_configure(context: PluginContext) -> None:
    _options[context.broker_name] = context.options_for("audit") or AuditOptions()


@hookimpl
def plugmq_broker_started(broker_name: str) -> None:
    with _lock:
        COUNTS[broker_name] = Counter()
    log.info("audit started", broker=broker_name)


@hookimpl
def plugmq_message_stored(broker_name: str, message: StoredMessage) -> None:
    _count(broker_name, "stored", message)


@hookimpl
def plugmq_message_delivered(broker_name: str, consumer_group: str, message: StoredMessage) -> None:
    _count(broker_name, "delivered", message)
