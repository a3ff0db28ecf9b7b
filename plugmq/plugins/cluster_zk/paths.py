"""Where a cluster lives in ZooKeeper, under ``<chroot>/<cluster>``.

::

    brokers/<broker name>.<broker id>   ephemeral: the live broker's registration (JSON)
    topics/<topic>                      persistent: a topic declared for the whole cluster (JSON)
    epochs/<broker name>                persistent: the last master epoch granted (decimal)
    insync/<broker name>                persistent: the in-sync set (JSON: epoch, master, members),
                                        written only by its epoch's master, over the version it read
    election/<broker name>/             kazoo's election (lock) contenders for that broker name
    changes                             persistent: its data is rewritten with every registration or
                                        declaration update, so one data watch sees them all
"""

from __future__ import annotations

import attrs

__all__ = ["ZkPaths"]


@attrs.frozen
class ZkPaths:
    chroot: str
    cluster: str

    @property
    def base(self) -> str:
        return f"{self.chroot}/{self.cluster}"

    @property
    def brokers(self) -> str:
        return f"{self.base}/brokers"

    @property
    def topics(self) -> str:
        return f"{self.base}/topics"

    @property
    def epochs(self) -> str:
        return f"{self.base}/epochs"

    @property
    def insyncs(self) -> str:
        return f"{self.base}/insync"

    @property
    def elections(self) -> str:
        return f"{self.base}/election"

    @property
    def changes(self) -> str:
        return f"{self.base}/changes"

    def broker(self, key: str) -> str:
        return f"{self.brokers}/{key}"

    def topic(self, name: str) -> str:
        return f"{self.topics}/{name}"

    def epoch(self, broker_name: str) -> str:
        return f"{self.epochs}/{broker_name}"

    def insync(self, broker_name: str) -> str:
        return f"{self.insyncs}/{broker_name}"

    def election(self, broker_name: str) -> str:
        return f"{self.elections}/{broker_name}"

    def directories(self) -> tuple[str, ...]:
        return (self.brokers, self.topics, self.epochs, self.insyncs, self.elections)
