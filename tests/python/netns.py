"""Network namespaces for the partition tests (root only): one namespace per node and one for
the test's clients, joined by a bridge in a namespace of its own, with addresses 10.77.0.N that
exist only inside these namespaces. A partition is an nftables table in a node's namespace that
drops its traffic to and from chosen peers; the clients keep reaching every node, so a test sees
what a cut-off leader answers. The test process's main thread moves into the clients'
namespace (setns) for the test's duration, so librdkafka, the `sluice` CLI and the harness's
readiness checks all run there; nodes start under `ip netns exec`."""

from __future__ import annotations

import ctypes
import os
import re
import shutil
import subprocess

CLONE_NEWNET = 0x40000000
SUBNET = "10.77.0"
CLIENT = 100


def run(*args: str) -> None:
    done = subprocess.run(list(args), capture_output=True, text=True)
    assert done.returncode == 0, f"{' '.join(args)}: {done.stderr.strip()}"


def setns(path: str) -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    fd = os.open(path, os.O_RDONLY)
    try:
        if libc.setns(fd, CLONE_NEWNET) != 0:
            raise OSError(ctypes.get_errno(), f"setns {path}")
    finally:
        os.close(fd)


class Network:
    def __init__(self, nodes: int):
        """Namespaces named after this process (`slp<pid>-...`), so that runs side by side never
        share one."""
        assert os.geteuid() == 0, "network namespaces need root"
        for tool in ("ip", "nft"):
            assert shutil.which(tool), f"{tool} is missing (tests/run installs it)"
        self.prefix = f"slp{os.getpid()}"
        self.nodes = nodes
        self.original: int | None = None
        self.cut_nodes: set[int] = set()

    def ns(self, i: int) -> str:
        return f"{self.prefix}-c" if i == CLIENT else f"{self.prefix}-n{i}"

    def address(self, i: int) -> str:
        return f"{SUBNET}.{i}"

    def place(self, node) -> None:
        """For `Cluster(place=...)`: node N listens on 10.77.0.N inside its namespace."""
        node.host = self.address(node.node_id)
        node.prefix = ["ip", "netns", "exec", self.ns(node.node_id)]

    def create(self) -> None:
        self.destroy()  # what a run that was killed left behind
        bridge = f"{self.prefix}-br"
        run("ip", "netns", "add", bridge)
        run("ip", "-n", bridge, "link", "add", "br0", "type", "bridge")
        run("ip", "-n", bridge, "link", "set", "br0", "up")
        for i in [*range(1, self.nodes + 1), CLIENT]:
            ns = self.ns(i)
            run("ip", "netns", "add", ns)
            run("ip", "link", "add", "eth0", "netns", ns, "type", "veth", "peer", "name", f"p{i}", "netns", bridge)
            run("ip", "-n", ns, "addr", "add", f"{self.address(i)}/24", "dev", "eth0")
            run("ip", "-n", ns, "link", "set", "eth0", "up")
            run("ip", "-n", ns, "link", "set", "lo", "up")
            run("ip", "-n", bridge, "link", "set", f"p{i}", "master", "br0")
            run("ip", "-n", bridge, "link", "set", f"p{i}", "up")

    def enter_clients(self) -> None:
        """Moves this thread into the clients' namespace (until `leave_clients`)."""
        self.original = os.open("/proc/thread-self/ns/net", os.O_RDONLY)
        setns(f"/run/netns/{self.ns(CLIENT)}")

    def leave_clients(self) -> None:
        if self.original is not None:
            libc = ctypes.CDLL(None, use_errno=True)
            assert libc.setns(self.original, CLONE_NEWNET) == 0, "setns back"
            os.close(self.original)
            self.original = None

    def cut(self, node: int, peers: list[int]) -> None:
        """Drops every packet between `node` and each of `peers`, both ways."""
        addresses = ", ".join(self.address(p) for p in peers)
        rules = (f"table inet partition {{\n"
                 f"  chain input {{ type filter hook input priority 0; ip saddr {{ {addresses} }} drop; }}\n"
                 f"  chain output {{ type filter hook output priority 0; ip daddr {{ {addresses} }} drop; }}\n"
                 f"}}\n")
        done = subprocess.run(["ip", "netns", "exec", self.ns(node), "nft", "-f", "-"], input=rules,
                              capture_output=True, text=True)
        assert done.returncode == 0, done.stderr
        self.cut_nodes.add(node)

    def heal(self) -> None:
        for node in sorted(self.cut_nodes):
            run("ip", "netns", "exec", self.ns(node), "nft", "delete", "table", "inet", "partition")
        self.cut_nodes.clear()

    def destroy(self) -> None:
        """Deletes this network's namespaces, and those a test process that is gone left."""
        for name in namespaces():
            owner = re.match(r"slp(\d+)-", name)
            gone = owner is not None and not os.path.exists(f"/proc/{owner.group(1)}")
            if name.startswith(f"{self.prefix}-") or gone:
                subprocess.run(["ip", "netns", "del", name], capture_output=True)


def namespaces() -> list[str]:
    out = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    return [line.split()[0] for line in out.splitlines() if line.strip()]
