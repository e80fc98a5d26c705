"""A Sluice cluster of combined nodes (broker and controller) on 127.0.0.1, for the cluster tests.

Each node is a `harness.Broker` with a CONTROLLER listener and the cluster's
`--controller-quorum-voters`, its data directory formatted first with `sluice storage format`,
as README's three command lines do it. Nodes wait for each other (the quorum needs a majority),
so `Cluster.start` starts every process before it waits for any.
"""

from __future__ import annotations

import subprocess

from harness import SLUICE_BIN, Broker, free_port

CORES_PER_NODE = 1


def random_cluster_id() -> str:
    out = subprocess.run([str(SLUICE_BIN), "storage", "random-uuid"], check=True, capture_output=True, text=True)
    return out.stdout.strip()


def format_storage(data_dir, cluster_id: str, node_id: int) -> subprocess.CompletedProcess:
    return subprocess.run(
        [str(SLUICE_BIN), "storage", "format", "--cluster-id", cluster_id,
         "--node-id", str(node_id), "--data-dir", str(data_dir)],
        capture_output=True, text=True,
    )


class Node(Broker):
    def __init__(self, node_id: int, name: str, extra_args=()):
        super().__init__(cores=CORES_PER_NODE, num_partitions=1, name=f"{name}-n{node_id}", extra_args=extra_args)
        self.node_id = node_id
        self.controller_port = free_port()

    def listeners(self) -> str:
        return f"PLAINTEXT://{self.bootstrap},CONTROLLER://127.0.0.1:{self.controller_port}"


class Cluster:
    def __init__(self, nodes: int = 3, name: str = "cluster", extra_args=(), cluster_id: str | None = None):
        self.cluster_id = cluster_id or random_cluster_id()
        self.nodes = [Node(i, name) for i in range(1, nodes + 1)]
        self.voters = ",".join(f"{n.node_id}@127.0.0.1:{n.controller_port}" for n in self.nodes)
        for n in self.nodes:
            n.extra_args = ["--node-id", str(n.node_id), "--controller-quorum-voters", self.voters,
                            "--broker-heartbeat-interval-ms", "500", "--broker-session-timeout-ms", "3000",
                            *map(str, extra_args)]
            done = format_storage(n.data_dir, self.cluster_id, n.node_id)
            assert done.returncode == 0, done.stderr

    @property
    def bootstrap(self) -> str:
        return ",".join(n.bootstrap for n in self.nodes)

    def node(self, node_id: int) -> Node:
        return next(n for n in self.nodes if n.node_id == node_id)

    def start(self) -> None:
        for n in self.nodes:
            n.start(wait=False)
        for n in self.nodes:
            n.wait_ready(wait_for_partitions=False)

    def stop(self) -> None:
        for n in self.nodes:
            if n.running():
                n.stop_cleanly()

    def log_tails(self) -> str:
        return "\n".join(n.log_tail(40) for n in self.nodes)
