"""A Sluice cluster on 127.0.0.1, for the cluster tests: combined nodes (broker and controller),
or controllers and brokers as separate processes.

Each node is a `harness.Broker` with a CONTROLLER listener and the cluster's
`--controller-quorum-voters`, its data directory formatted first with `sluice storage format`,
as README's three command lines do it. Nodes wait for each other (the quorum needs a majority),
so `Cluster.start` starts every process before it waits for any.
"""

from __future__ import annotations

import os
import socket
import subprocess
import time

from harness import SLUICE_BIN, START_TIMEOUT_S, Broker, BrokerError, free_port

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
    """One node: `roles` is its `--process-roles` (a combined node by default)."""

    def __init__(self, node_id: int, name: str, extra_args=(), roles: str = "broker,controller"):
        super().__init__(cores=CORES_PER_NODE, num_partitions=1, name=f"{name}-n{node_id}", extra_args=extra_args)
        self.node_id = node_id
        self.roles = roles
        self.controller_port = free_port()
        # A second listener for the other brokers (`inter.broker.listener.name=INTERNAL`), if set.
        self.internal_port: int | None = None

    @property
    def is_broker(self) -> bool:
        return "broker" in self.roles.split(",")

    @property
    def is_controller(self) -> bool:
        return "controller" in self.roles.split(",")

    def listeners(self) -> str:
        out = []
        if self.is_broker:
            out.append(f"{self.listener_name}://{self.bootstrap}")
            if self.internal_port is not None:
                out.append(f"INTERNAL://{self.host}:{self.internal_port}")
        if self.is_controller:
            out.append(f"CONTROLLER://{self.host}:{self.controller_port}")
        return ",".join(out)

    def wait_ready(self, wait_for_partitions: bool = True) -> None:
        if self.is_broker:
            super().wait_ready(wait_for_partitions)
            return
        # A controller serves no Kafka clients: it is ready once its CONTROLLER port answers.
        deadline = time.monotonic() + START_TIMEOUT_S
        while True:
            code = self.proc.poll()
            if code is not None:
                raise BrokerError(f"sluice exited with {code} while starting\n{self.log_tail()}")
            try:
                socket.create_connection((self.host, self.controller_port), timeout=0.5).close()
                return
            except OSError:
                if time.monotonic() > deadline:
                    raise BrokerError(f"the controller did not listen within {START_TIMEOUT_S} s\n{self.log_tail()}")
                time.sleep(0.05)

    def kill(self) -> None:
        # A controller-only node has no Kafka port: wait for its CONTROLLER port instead.
        self.kill_and_wait_refused(self.port if self.is_broker else self.controller_port)


class Cluster:
    """`nodes` combined nodes; or, with `brokers`, `nodes` controllers (ids `first_id`..) and
    `brokers` broker-only nodes (ids after them)."""

    def __init__(self, nodes: int = 3, name: str = "cluster", extra_args=(), cluster_id: str | None = None,
                 brokers: int = 0, place=None, first_id: int = 1):
        """`place(node)`, if given, sets each node's `host` and `prefix` (a network namespace)
        before the voters are named."""
        self.cluster_id = cluster_id or random_cluster_id()
        self.name = name
        self.extra_args = [str(a) for a in extra_args]
        controller_roles = "controller" if brokers else "broker,controller"
        self.nodes = [Node(i, name, roles=controller_roles) for i in range(first_id, first_id + nodes)]
        self.place = place
        for n in self.nodes:
            if place:
                place(n)
        self.voters = ",".join(f"{n.node_id}@{n.host}:{n.controller_port}" for n in self.nodes if n.is_controller)
        for i in range(brokers):
            self.nodes.append(Node(first_id + nodes + i, name, roles="broker"))
            if place:
                place(self.nodes[-1])
        for n in self.nodes:
            self._configure(n)

    def _configure(self, n: Node) -> None:
        n.extra_args = ["--node-id", str(n.node_id), "--process-roles", n.roles,
                        "--controller-quorum-voters", self.voters,
                        "--broker-heartbeat-interval-ms", "500", "--broker-session-timeout-ms", "3000",
                        *self.extra_args]
        done = format_storage(n.data_dir, self.cluster_id, n.node_id)
        assert done.returncode == 0, done.stderr

    def add_broker(self) -> Node:
        """A new broker-only node, formatted for this cluster, not yet started."""
        n = Node(max(m.node_id for m in self.nodes) + 1, self.name, roles="broker")
        if self.place:
            self.place(n)
        self._configure(n)
        self.nodes.append(n)
        return n

    @property
    def brokers(self) -> list[Node]:
        return [n for n in self.nodes if n.is_broker]

    @property
    def controllers(self) -> list[Node]:
        return [n for n in self.nodes if n.is_controller]

    @property
    def bootstrap(self) -> str:
        return ",".join(n.bootstrap for n in self.brokers)

    def node(self, node_id: int) -> Node:
        return next(n for n in self.nodes if n.node_id == node_id)

    def start(self) -> None:
        for n in self.nodes:
            n.start(wait=False)
        for n in self.nodes:
            n.wait_ready(wait_for_partitions=False)

    def stop(self) -> None:
        # Broker-only nodes first, while the controllers can still confirm their controlled
        # shutdowns (with the controllers gone each would wait out its session timeout).
        # Every node is stopped even when one fails to stop cleanly; the first failure is
        # raised after.
        failures = []
        for n in sorted(self.nodes, key=lambda n: n.is_controller):
            if n.running():
                try:
                    n.stop_cleanly()
                except BrokerError as e:
                    failures.append(e)
        if failures:
            raise failures[0]

    def log_tails(self) -> str:
        return "\n".join(n.log_tail(40) for n in self.nodes)


def wait_for(what: str, check, timeout: float = 30.0):
    """`check()`'s first true value, asked every 0.1 s; fails the test after `timeout` s."""
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if value:
            return value
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.1)


def running(request, c: Cluster, what: str, ready, timeout: float = 30.0):
    """A module fixture's body: starts `c`, waits until `ready()` holds (`what` names it), yields
    it, and stops it; the nodes' log tails are printed when a test failed, any panic fails the
    module, and the nodes' data is removed unless a test failed or KEEP_LOGS is set."""
    failed_before = request.session.testsfailed
    try:
        c.start()
        wait_for(what, ready, timeout)
    except BaseException:
        print(c.log_tails())
        c.stop()
        raise
    yield c
    failed = request.session.testsfailed > failed_before
    if failed:
        print(c.log_tails())
    c.stop()
    for n in c.nodes:
        panics = [line for line in n.log_text().splitlines() if "panicked" in line]
        assert not panics, f"node {n.node_id} panicked:\n" + "\n".join(panics)
        if not failed and not os.environ.get("KEEP_LOGS"):
            n.remove()
