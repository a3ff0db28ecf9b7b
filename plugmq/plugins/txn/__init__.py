"""``txn``: RocketMQ's transactional messages — half messages, decisions, check-back.

Half messages live in the store under ``TRANS_HALF_TOPIC`` (real topic/queue in properties), so
consumers never see them; decisions, counted checks and finished effects live in the plugin's own
op log (``<data_dir>/txn/oplog``, fsynced before a decision takes effect) instead of RocketMQ's
op topic. A committed message reaches its real topic through ``context.deliver``; a message left
undecided after ``check_max`` checks goes to ``TRANS_DISCARD_TOPIC`` with a warning. See
``service`` for the flow and the crash rules. Delayed transactional messages are refused.
"""

from __future__ import annotations

from plugmq.core import (
    Family,
    PluginDeclaration,
    TransactionContext,
    TransactionService,
    hookimpl,
)
from plugmq.kit.options import options_or_default
from plugmq.plugins.txn.options import TxnOptions
from plugmq.plugins.txn.service import PLUGIN_NAME, TxnService, capabilities_for

__all__ = ["TxnOptions", "TxnService", "plugmq_declare", "plugmq_make_transaction_service"]


@hookimpl
def plugmq_declare() -> PluginDeclaration:
    return PluginDeclaration(
        name=PLUGIN_NAME,
        families={Family.TRANSACTION},
        description="transactional messages: half topic in the store, fsynced op log, timed check-back, discard topic",
        options=TxnOptions,
        capabilities=capabilities_for(TxnOptions()),
    )


@hookimpl
def plugmq_make_transaction_service(context: TransactionContext) -> TransactionService | None:
    return TxnService(context, options_or_default(context, PLUGIN_NAME, TxnOptions))
