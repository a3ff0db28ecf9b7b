"""cluster_zk: the cluster's name service and master elections on Apache ZooKeeper (kazoo).

Each broker holds one ZooKeeper session. Its registration (name, id, room, role, advertised
endpoint, topics with queue counts and permissions) is an ephemeral znode, so a broker that dies
leaves every route once its session times out; a broker whose session expired registers again as
soon as a new session is up. Masters are elected per broker name with kazoo's election recipe,
each win granting a higher epoch (a fencing token). Layout under ``<chroot>/<cluster>``: see
:mod:`plugmq.plugins.cluster_zk.paths`.

::

    [cluster]
    name = "prod"

    [plugins.cluster_zk]
    hosts = "zk1:2181,zk2:2181,zk3:2181"
    chroot = "/plugmq"
    session_timeout_s = 10
"""

from __future__ import annotations

from plugmq.core import ClusterContext, ClusterService, Family, PluginDeclaration, hookimpl
from plugmq.core.errors import PluginError
from plugmq.plugins.cluster_zk.options import ZkOptions

__all__ = ["ZkOptions", "plugmq_declare", "plugmq_make_cluster_service"]


@hookimpl
def plugmq_declare() -> PluginDeclaration:
    return PluginDeclaration(
        name="cluster_zk",
        families={Family.CLUSTER},
        description="cluster name service and master elections on Apache ZooKeeper (kazoo)",
        options=ZkOptions,
    )


@hookimpl
def plugmq_make_cluster_service(context: ClusterContext) -> ClusterService:
    try:
        # kazoo comes with the 'cluster' extra; a single broker never needs it.
        from plugmq.plugins.cluster_zk.service import ZkClusterService
    except ModuleNotFoundError as exc:
        raise PluginError(f"plugin 'cluster_zk' needs {exc.name!r}: pip install 'plugmq[cluster]'") from exc
    options = context.options_for("cluster_zk") or ZkOptions()
    return ZkClusterService(options, context.cluster_name, context.broker_name, context.clock)
