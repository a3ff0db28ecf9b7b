"""plugmq chaos: fault injection under load, then a checker over every acknowledged message.

:func:`run_chaos` starts a failover cluster from a broker config (ZooKeeper, ``plugmq serve``
children, a :class:`Forwarder` on every link), drives it with the official Python client,
injects faults in rounds and returns a :class:`ChaosResult` (the :func:`check` of its history).
``plugmq chaos`` is the command line of the same.
"""

from plugmq.chaos.checker import CheckResult, check
from plugmq.chaos.faults import FAULTS
from plugmq.chaos.forwarder import Forwarder, LinkState
from plugmq.chaos.history import History, load_history
from plugmq.chaos.runner import ChaosResult, run_chaos

__all__ = ["FAULTS", "ChaosResult", "CheckResult", "Forwarder", "History", "LinkState", "check", "load_history",
           "run_chaos"]
