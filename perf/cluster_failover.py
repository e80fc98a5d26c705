"""Cluster failover: how long a three-node cluster of combined nodes (broker and controller, on
127.0.0.1) takes to get going again after losing a node, for Sluice and for Apache Kafka 4.x,
both at their default settings (Sluice's broker.session.timeout.ms and
broker.heartbeat.interval.ms defaults are Kafka's, 9000 and 2000 ms):

1. controller failover: SIGKILL to the active controller (the quorum leader); the time from the
   kill until the next metadata change is committed, i.e. until a CreateTopics sent through a
   surviving broker succeeds. CreateTopics for fresh topic names, one at a time, 50 ms after
   the previous one's answer, each from a fresh AdminClient bootstrapped from one surviving
   broker, with short timeouts (2 s); the figure is the first success's answer. Then the killed
   node is started again and the cluster waited for until it is whole (every node registered
   since its start, answering Metadata itself with all three brokers, every partition led).
2. fenced broker: SIGSTOP to a node that is not the active controller; the time from the
   SIGSTOP until Metadata, asked every 100 ms through a fresh AdminClient bootstrapped from
   another live broker (answered by it or the controller's node), shows every partition the
   stopped broker led under another leader: for replication factor 1
   none (leader -1); for replication factor 3 a new leader (an in-sync follower). Then
   SIGCONT, and the cluster waited for until it is whole.

Each system's cluster is started once (Sluice: tests/python/cluster.py's Cluster with the
session defaults restored; Kafka: three JVMs from target/java-deps, started as
tests/python/reference.py starts one) and does `--reps` repetitions of both, interleaved. A
measurement, not a test: nothing fails on a figure.

    perf/cluster-failover                       # 3 repetitions of each, both systems
    perf/cluster-failover --reps 1 --systems sluice
"""

from __future__ import annotations

import argparse
import base64
import hashlib
import json
import logging
import os
import platform
import shutil
import signal
import statistics
import subprocess
import sys
import time
import traceback
import uuid
from collections import Counter
from datetime import datetime, timezone
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
WORKROOT = REPO / "target" / "perf" / "cluster-failover"
sys.path.insert(0, str(REPO / "tests" / "python"))

from confluent_kafka import KafkaException  # noqa: E402
from confluent_kafka.admin import AdminClient, NewTopic  # noqa: E402

SYSTEMS = ("sluice", "kafka")
NODES = 3
BROKER_SESSION_TIMEOUT_MS = 9_000  # both systems' default; stated in the JSON, not passed
BROKER_HEARTBEAT_INTERVAL_MS = 2_000

# Controller failover: one CreateTopics at a time, the next PROBE_INTERVAL_S after the previous
# one's answer, each with these timeouts. One at a time: when a new one left every 50 ms whatever
# the answers (up to 40 in flight, a first version of this script), Kafka's brokers queued all
# of them while there was no controller, its new controller (active 3.5 s after the kill) then
# committed them in order at about 0.1 s each, and the first answer a client still waited for
# came 17-19 s after the kill: the probes measured their own backlog. A probe that times out is
# still queued, and is committed before the next one.
PROBE_INTERVAL_S = 0.05
PROBE_OPERATION_TIMEOUT_S = 1.5  # CreateTopics' timeout_ms, for the controller
PROBE_REQUEST_TIMEOUT_S = 2.0  # librdkafka's, for the whole request
FAILOVER_TIMEOUT_S = 60.0
# Fenced broker: Metadata every FENCE_POLL_S; the session is 9 s.
FENCE_POLL_S = 0.1
FENCE_TIMEOUT_S = 60.0
FENCE_PARTITIONS = 6  # per topic: two led by each node
# Starting and recovering (a cold JVM on two busy cores takes 10-30 s to serve; a restarted
# Sluice node is refused registration until its previous session is over, 9 s).
WHOLE_TIMEOUT_S = {"sluice": 60.0, "kafka": 180.0}
QUORUM_TIMEOUT_S = 60.0
STOP_TIMEOUT_S = 30.0  # a Kafka node's controlled shutdown can wait for a controller that is gone
KAFKA_HEAP = "512m"

# librdkafka's log lines (connection refused to the killed node, and so on) go to Python logging
# and nowhere else: the progress lines stay readable.
QUIET = logging.getLogger("librdkafka.cluster-failover")
QUIET.addHandler(logging.NullHandler())
QUIET.propagate = False
CLIENT = {"logger": QUIET, "log.connection.close": False}


def mono() -> float:
    return time.monotonic()


def r3(x):
    return None if x is None else round(x, 3)


def admin(bootstrap: str) -> AdminClient:
    return AdminClient({"bootstrap.servers": bootstrap, **CLIENT})


def metadata(system, bootstrap: str, timeout: float = 2.0):
    """Metadata through a fresh AdminClient bootstrapped from `bootstrap`, and the node that
    answered, or (None, None). librdkafka 2.16 sends it to any broker it has learnt of and has a
    connection to (the bootstrap one or another, about equally often: tried on Kafka), never to
    one that does not answer ApiVersions (a stopped one)."""
    try:
        md = admin(bootstrap).list_topics(timeout=timeout)
    except KafkaException:
        return None, None
    # librdkafka names the answering broker "127.0.0.1:<port>/bootstrap" or "127.0.0.1:<port>/<id>".
    address = md.orig_broker_name.split("/")[0]
    node = next((n for n in system.nodes if n.bootstrap == address), None)
    return node, md


def wait_for(what: str, check, timeout: float, poll: float = 0.2):
    deadline = mono() + timeout
    while True:
        value = check()
        if value:
            return value
        if mono() > deadline:
            raise RuntimeError(f"timed out after {timeout:.0f} s waiting for {what}")
        time.sleep(poll)


# ---- Sluice: tests/python/cluster.py's Cluster -------------------------------------------------


def sluice_cluster_class():
    from cluster import Cluster

    class DefaultSessionCluster(Cluster):
        """Cluster, less the short broker session (3 s) and heartbeat (500 ms) the cluster tests
        use: repeating a flag is an error, so the two are dropped and Sluice's defaults apply."""

        DROPPED = ("--broker-heartbeat-interval-ms", "--broker-session-timeout-ms")

        def _configure(self, n) -> None:
            super()._configure(n)  # also formats the node's data directory
            args, kept = list(n.extra_args), []
            while args:
                a = args.pop(0)
                if a in self.DROPPED:
                    args.pop(0)  # its value
                else:
                    kept.append(a)
            n.extra_args = kept

    return DefaultSessionCluster


class SluiceSystem:
    name = "sluice"

    def __init__(self, label: str):
        from harness import SLUICE_BIN

        self.bin = SLUICE_BIN
        self.cluster = sluice_cluster_class()(NODES, name=label)
        self.nodes = self.cluster.nodes

    def start(self) -> None:
        self.cluster.start()  # every node at once, then waits for each (30 s each at most)

    def command_line(self) -> list[str]:
        n = self.nodes[0]
        return [str(self.bin), "--cores", str(n.cores), "--num-partitions", str(n.num_partitions), *n.extra_args]

    def active_controller(self, among) -> int | None:
        """The quorum leader as the first of `among` that knows one sees it (DescribeQuorum, through
        `sluice cluster --bootstrap-controller`, as test_cluster.py's active_controller does)."""
        for n in among:
            try:
                out = subprocess.run([str(self.bin), "cluster", "--bootstrap-controller", f"127.0.0.1:{n.controller_port}"],
                                     capture_output=True, text=True, timeout=30)
            except subprocess.TimeoutExpired:
                continue
            for line in out.stdout.splitlines():
                if line.startswith("LeaderId: ") and int(line.split()[1]) >= 0:
                    return int(line.split()[1])
        return None

    def registered_since_start(self, n) -> bool:
        """The node has registered and been unfenced since its latest start (test_cluster.py's
        wait_healthy): Metadata alone cannot tell, as the others list a node restarted within its
        session that has not registered again."""
        return "broker state changed fenced=false" in n.current_log()

    def reap_killed(self, n) -> None:
        n.kill()  # already SIGKILLed: reaps it and waits until its port refuses connections

    def restart(self, n) -> None:
        n.start(wait=False)
        n.wait_ready(wait_for_partitions=False)  # 30 s at most

    def stop(self) -> dict:
        return stop_processes({n.node_id: n.proc for n in self.nodes})

    def log_tails(self) -> str:
        return self.cluster.log_tails()

    def remove(self) -> None:
        for n in self.nodes:
            n.remove()


# ---- Apache Kafka: three KRaft combined nodes, each started as reference.py starts one ----------


class KafkaNode:
    """One Kafka broker+controller JVM, stopped by PID. Its listeners and their names are
    reference.py's, with a static quorum of three voters (controller.quorum.voters) in place of
    controller.quorum.bootstrap.servers; everything else is Kafka's default (reference.py's
    single-node replication factors and rebalance delay are left out)."""

    def __init__(self, node_id: int, root: Path):
        from harness import free_port

        self.node_id = node_id
        self.root = root / f"kafka-n{node_id}"
        self.root.mkdir(parents=True)
        self.port = free_port()
        self.controller_port = free_port()
        self.proc: subprocess.Popen | None = None
        self.log_offset = 0  # where the log stood when the latest start began
        self.props_path = self.root / "server.properties"
        # Kafka logs through slf4j, and target/java-deps has slf4j-simple, which writes to stderr:
        # the log is the process's output (reference.py's log4j2 file stays empty, so no
        # log4j2.properties here).
        self.log_path = self.root / "kafka.log"

    @property
    def bootstrap(self) -> str:
        return f"127.0.0.1:{self.port}"

    @property
    def pid(self) -> int:
        return self.proc.pid

    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def java(self, *args) -> list[str]:
        from reference import DEPS

        # reference.py's JVM command line (heap, G1), and wall-clock times on slf4j-simple's lines.
        return ["java", f"-Xmx{KAFKA_HEAP}", "-XX:+UseG1GC", "-Djava.awt.headless=true",
                "-Dorg.slf4j.simpleLogger.showDateTime=true",
                "-Dorg.slf4j.simpleLogger.dateTimeFormat=yyyy-MM-dd'T'HH:mm:ss.SSSXXX",
                "-cp", f"{DEPS}/*", *args]

    def configure(self, voters: str, cluster_id: str) -> None:
        props = {
            "process.roles": "broker,controller",
            "node.id": str(self.node_id),
            "controller.quorum.voters": voters,
            "listeners": f"PLAINTEXT://127.0.0.1:{self.port},CONTROLLER://127.0.0.1:{self.controller_port}",
            "advertised.listeners": f"PLAINTEXT://127.0.0.1:{self.port}",
            "controller.listener.names": "CONTROLLER",
            "listener.security.protocol.map": "PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT",
            "inter.broker.listener.name": "PLAINTEXT",
            "log.dirs": str(self.root / "data"),
        }
        self.props_path.write_text("".join(f"{k}={v}\n" for k, v in props.items()))
        # kafka-storage format, with the static quorum of controller.quorum.voters (so no
        # --standalone): the same cluster id on every node.
        done = subprocess.run(self.java("kafka.tools.StorageTool", "format", "-t", cluster_id, "-c", str(self.props_path)),
                              capture_output=True, text=True, timeout=120)
        if done.returncode != 0:
            raise RuntimeError(f"kafka-storage format failed for node {self.node_id}:\n{done.stdout}{done.stderr}")

    def start(self) -> None:
        assert not self.running(), "already running"
        self.log_offset = self.log_path.stat().st_size if self.log_path.exists() else 0
        out = open(self.log_path, "ab")
        self.proc = subprocess.Popen(self.java("kafka.Kafka", str(self.props_path)), stdin=subprocess.DEVNULL,
                                     stdout=out, stderr=subprocess.STDOUT)
        out.close()

    def current_log(self) -> str:
        """The log since the latest start."""
        try:
            with open(self.log_path, "rb") as f:
                f.seek(self.log_offset)
                return f.read().decode(errors="replace")
        except FileNotFoundError:
            return ""

    def log_tail(self, lines: int = 40) -> str:
        try:
            tail = self.log_path.read_text(errors="replace").splitlines()[-lines:]
        except FileNotFoundError:
            tail = []
        return f"--- last {len(tail)} lines of {self.log_path} ---\n" + "\n".join(tail)


class KafkaSystem:
    name = "kafka"

    def __init__(self, root: Path):
        from reference import DEPS, ensure_jars

        ensure_jars()
        jar = next(DEPS.glob("kafka_2.13-*.jar"), None)
        self.version = jar.stem.split("-", 1)[1] if jar else "unknown"
        self.nodes = [KafkaNode(i, root) for i in range(1, NODES + 1)]
        voters = ",".join(f"{n.node_id}@127.0.0.1:{n.controller_port}" for n in self.nodes)
        cluster_id = "-"  # an id starting with '-' would be read as an option by kafka-storage
        while cluster_id.startswith("-"):
            cluster_id = base64.urlsafe_b64encode(uuid.uuid4().bytes).decode().rstrip("=")
        self.cluster_id = cluster_id
        for n in self.nodes:
            n.configure(voters, cluster_id)

    def start(self) -> None:
        for n in self.nodes:
            n.start()  # the quorum needs a majority: start all before waiting for any

    def command_line(self) -> list[str]:
        return self.nodes[0].java("kafka.Kafka", "server.properties")

    def active_controller(self, among) -> int | None:
        """The quorum leader from `kafka-metadata-quorum --bootstrap-controller ... describe
        --status` (Admin's describeCluster names a random broker as the controller in KRaft)."""
        from reference import DEPS

        for n in among:
            try:
                out = subprocess.run(
                    ["java", "-Xmx256m", "-cp", f"{DEPS}/*", "org.apache.kafka.tools.MetadataQuorumCommand",
                     "--bootstrap-controller", f"127.0.0.1:{n.controller_port}", "describe", "--status"],
                    capture_output=True, text=True, timeout=60)
            except subprocess.TimeoutExpired:
                continue
            for line in out.stdout.splitlines():
                key, _, value = line.partition(":")
                if key.strip() == "LeaderId" and int(value) >= 0:
                    return int(value)
        return None

    def registered_since_start(self, n) -> bool:
        """The node's broker has registered and been unfenced since its latest start
        (BrokerLifecycleManager's log line)."""
        return "Transitioning from RECOVERY to RUNNING" in n.current_log()

    def reap_killed(self, n) -> None:
        n.proc.wait(timeout=30)

    def restart(self, n) -> None:
        n.start()  # wait_whole waits for it to serve

    def stop(self) -> dict:
        return stop_processes({n.node_id: n.proc for n in self.nodes})

    def log_tails(self) -> str:
        return "\n".join(n.log_tail() for n in self.nodes)

    def remove(self) -> None:
        for n in self.nodes:
            shutil.rmtree(n.root, ignore_errors=True)


def stop_processes(procs: dict) -> dict:
    """SIGTERM to every still-running node at once (one at a time, the last would wait for a
    quorum that is gone), SIGCONT in case one is stopped, then SIGKILL by PID to any still there
    after STOP_TIMEOUT_S. Returns each node's exit status."""
    live = {i: p for i, p in procs.items() if p is not None and p.poll() is None}
    for p in live.values():
        p.send_signal(signal.SIGCONT)
        p.send_signal(signal.SIGTERM)
    deadline = mono() + STOP_TIMEOUT_S
    codes = {}
    for i, p in live.items():
        try:
            codes[i] = p.wait(timeout=max(0.1, deadline - mono()))
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait(timeout=30)
            codes[i] = f"killed after {STOP_TIMEOUT_S:.0f} s"
    return codes


# ---- what both measures share -------------------------------------------------------------------


def whole_view(md, expected_ids: set[int]) -> str | None:
    """None if this Metadata lists every broker and a leader for every partition of every topic;
    else what it lacks."""
    if set(md.brokers) != expected_ids:
        return f"lists brokers {sorted(md.brokers)}"
    for name, t in sorted(md.topics.items()):
        if t.error is not None:
            return f"topic {name}: {t.error.name()}"
        leaderless = sorted(p for p, m in t.partitions.items() if m.leader < 0)
        if leaderless:
            return f"{name} partitions {leaderless} have no leader"
    return None


def wait_whole(system) -> tuple[float, list]:
    """Waits until the cluster is whole: every node has registered since it started (its log says
    so: Metadata cannot tell, as the others keep listing a node restarted within its session that
    has not registered again), and each node's latest answer to Metadata, asked through fresh
    clients until every node has answered, lists every broker and a leader for every partition.
    Returns how long that took and what it waited on (each reason once, when first seen)."""
    started = mono()
    ids = {n.node_id for n in system.nodes}
    everyone = ",".join(n.bootstrap for n in system.nodes)
    latest: dict[int, str | None] = {}
    waited: list = []
    while True:
        reason = next((f"node {n.node_id} is not running" for n in system.nodes if not n.running()), None)
        reason = reason or next((f"node {n.node_id} has not registered since it started"
                                 for n in system.nodes if not system.registered_since_start(n)), None)
        if reason is None:
            node, md = metadata(system, everyone)
            if node is not None:
                latest[node.node_id] = whole_view(md, ids)
            missing = sorted(ids - set(latest))
            reason = next((f"node {i}'s Metadata {r}" for i, r in sorted(latest.items()) if r is not None), None)
            reason = reason or (f"no answer from node {missing} yet" if missing else None)
        if reason is None:
            return mono() - started, waited
        if not waited or waited[-1]["reason"] != reason:
            waited.append({"at_s": r3(mono() - started), "reason": reason})
        if mono() - started > WHOLE_TIMEOUT_S[system.name]:
            raise RuntimeError(f"the {system.name} cluster is not whole after {WHOLE_TIMEOUT_S[system.name]:.0f} s: "
                               f"{reason}; waited on {waited[-10:]}\n{system.log_tails()}")
        time.sleep(0.05)


def last_wait(waited: list) -> str:
    """For a progress line: the last thing wait_whole waited on."""
    return f" (last waited on: {waited[-1]['reason']}, from {waited[-1]['at_s']:.1f} s)" if waited else ""


def find_controller(system) -> int:
    live = [n for n in system.nodes if n.running()]
    return wait_for(f"{system.name}'s active controller", lambda: system.active_controller(live), QUORUM_TIMEOUT_S, poll=0.5)


def node_of(system, node_id: int):
    return next(n for n in system.nodes if n.node_id == node_id)


def error_name(e: KafkaException) -> str:
    err = e.args[0] if e.args else e
    return err.name() if hasattr(err, "name") else str(err)


def probe(bootstrap: str, topic: str, t0: float, avoid: int | None = None) -> dict:
    """One CreateTopics of a fresh one-partition topic, from a fresh AdminClient bootstrapped from
    `bootstrap` alone. librdkafka sends CreateTopics to the broker that Metadata names as the
    controller in its latest Metadata: Sluice's brokers name themselves, Kafka's a random broker
    they think alive, which until it is fenced includes the killed node. So Metadata first (the
    killed node cannot answer it), and when that names `avoid` (or none) nothing is sent."""
    sent = mono()
    client = admin(bootstrap)
    record = {"topic": topic, "sent_s": r3(sent - t0)}
    try:
        md = client.list_topics(timeout=PROBE_REQUEST_TIMEOUT_S)
    except KafkaException as e:
        return {**record, "answered_s": r3(mono() - t0), "outcome": f"Metadata failed: {error_name(e)}"}
    record["via"] = md.controller_id
    if md.controller_id < 0 or md.controller_id == avoid:
        return {**record, "answered_s": r3(mono() - t0), "outcome": "not sent: Metadata names the killed node"}
    future = client.create_topics([NewTopic(topic, num_partitions=1, replication_factor=1)],
                                  operation_timeout=PROBE_OPERATION_TIMEOUT_S,
                                  request_timeout=PROBE_REQUEST_TIMEOUT_S)[topic]
    try:
        future.result(timeout=PROBE_REQUEST_TIMEOUT_S + 5)  # librdkafka times it out before this
        outcome = "ok"
    except KafkaException as e:
        outcome = error_name(e)
    except Exception as e:  # concurrent.futures' TimeoutError: librdkafka never answered
        outcome = type(e).__name__
    return {**record, "answered_s": r3(mono() - t0), "answered": mono(), "outcome": outcome}


def probe_until_success(bootstrap: str, prefix: str, t0: float, avoid: int | None) -> dict:
    """Probes one at a time, PROBE_INTERVAL_S apart, until one succeeds; FAILOVER_TIMEOUT_S at most."""
    probes: list[dict] = []
    while True:
        if mono() - t0 > FAILOVER_TIMEOUT_S:
            raise RuntimeError(f"no CreateTopics succeeded within {FAILOVER_TIMEOUT_S:.0f} s of the kill; "
                               f"{len(probes)} tries: {dict(Counter(p['outcome'] for p in probes))}")
        p = probe(bootstrap, f"{prefix}-{len(probes)}", t0, avoid)
        probes.append(p)
        if p["outcome"] == "ok":
            seconds = p.pop("answered") - t0
            for q in probes:
                q.pop("answered", None)
            return {"seconds": seconds, "probes": probes,
                    "outcomes": dict(Counter(q["outcome"] for q in probes))}
        time.sleep(PROBE_INTERVAL_S)


# ---- the two measures ---------------------------------------------------------------------------


class Bench:
    def __init__(self, t0: float):
        self.t0 = t0

    def say(self, system: str, what: str) -> None:
        print(f"[{time.time() - self.t0:6.1f} s] {system}: {what}", flush=True)

    def controller_failover(self, system, rep: int) -> dict:
        controller_id = find_controller(system)
        victim = node_of(system, controller_id)
        survivors = [n for n in system.nodes if n is not victim]
        entry = survivors[0]
        # The same path, healthy: what one probe (a fresh client's Metadata, then CreateTopics) takes.
        healthy = probe(entry.bootstrap, f"failover-r{rep}-healthy", mono())
        if healthy["outcome"] != "ok":
            raise RuntimeError(f"CreateTopics through node {entry.node_id} fails before the kill: {healthy}")
        self.say(system.name, f"#{rep} controller failover: active controller is node {controller_id}; a CreateTopics "
                              f"through node {entry.node_id} takes {healthy['answered_s'] * 1000:.0f} ms; SIGKILL to pid {victim.pid}")
        killed_at = datetime.now(timezone.utc)  # to find the moment in the nodes' logs
        t_kill = mono()
        os.kill(victim.pid, signal.SIGKILL)
        probed = probe_until_success(entry.bootstrap, f"failover-r{rep}", t_kill, avoid=controller_id)
        self.say(system.name, f"#{rep} controller failover: CreateTopics succeeded {probed['seconds']:.3f} s after the kill "
                              f"({len(probed['probes'])} tries: {probed['outcomes']})")
        new_controller = system.active_controller(survivors)
        system.reap_killed(victim)
        restarted = mono()
        system.restart(victim)
        _, waited = wait_whole(system)
        recovered = mono() - restarted
        self.say(system.name, f"#{rep} controller failover: new controller node {new_controller}; node {controller_id} "
                              f"restarted, cluster whole {recovered:.1f} s later{last_wait(waited)}")
        return {
            "rep": rep,
            "killed_controller": controller_id,
            "killed_at_utc": killed_at.strftime("%Y-%m-%dT%H:%M:%S.%fZ"),
            "through_node": entry.node_id,
            "seconds": r3(probed["seconds"]),
            "first_success_sent_s": probed["probes"][-1]["sent_s"],
            "probe_outcomes": probed["outcomes"],
            "probes": probed["probes"],
            "healthy_probe_s": healthy["answered_s"],
            "new_controller": new_controller,
            "restart_to_whole_s": r3(recovered),
            "restart_waited_on": waited,
        }

    def fenced_broker(self, system, rep: int, rf3: bool) -> dict:
        controller_id = find_controller(system)
        others = [n for n in system.nodes if n.node_id != controller_id]
        # The victim alternates between the two nodes that are not the controller. Metadata is
        # asked through fresh clients bootstrapped from the third node; librdkafka sends it to that
        # node or to the controller's, whichever it has connected to (never to the stopped one,
        # which does not answer ApiVersions), and either answer counts.
        victim = others[(rep - 1) % 2]
        entry = others[rep % 2]
        topics = {"rf1": (f"fenced-rf1-r{rep}", 1)}
        if rf3:
            topics["rf3"] = (f"fenced-rf3-r{rep}", 3)
        client = admin(entry.bootstrap)
        futures = client.create_topics([NewTopic(name, num_partitions=FENCE_PARTITIONS, replication_factor=factor)
                                        for name, factor in topics.values()], operation_timeout=10, request_timeout=20)
        for f in futures.values():
            f.result(timeout=30)

        def listed():
            node, md = metadata(system, entry.bootstrap)
            if node is None:
                return None
            for name, _ in topics.values():
                t = md.topics.get(name)
                if t is None or t.error is not None or len(t.partitions) != FENCE_PARTITIONS:
                    return None
                if any(p.leader < 0 for p in t.partitions.values()):
                    return None
            return md

        md = wait_for(f"Metadata to list {sorted(n for n, _ in topics.values())} with leaders", listed, 30)
        led = {key: sorted(p for p, m in md.topics[name].partitions.items() if m.leader == victim.node_id)
               for key, (name, _) in topics.items()}
        if not all(led.values()):
            raise RuntimeError(f"node {victim.node_id} leads none of some topic's partitions: {led}")
        self.say(system.name, f"#{rep} fenced broker: controller node {controller_id}; SIGSTOP to node {victim.node_id} "
                              f"(pid {victim.pid}), which leads {led}; asking through node {entry.node_id}")
        seen: dict = {}
        polls = 0
        answers: Counter = Counter()  # which live node answered the polls
        stopped_at = datetime.now(timezone.utc)
        t_stop = mono()
        os.kill(victim.pid, signal.SIGSTOP)
        try:
            while True:
                now = mono()
                if now - t_stop > FENCE_TIMEOUT_S:
                    raise RuntimeError(f"after {FENCE_TIMEOUT_S:.0f} s Metadata still shows node {victim.node_id} "
                                       f"leading; seen so far: {seen}")
                node, md = metadata(system, entry.bootstrap)
                polls += 1
                at = mono() - t_stop
                if node is not None and node is not victim:
                    answers[node.node_id] += 1
                    if "unlisted" not in seen and victim.node_id not in md.brokers:
                        seen["unlisted"] = at
                    for key, (name, _) in topics.items():
                        t = md.topics.get(name)
                        if key not in seen and t is not None and all(
                                p in t.partitions and t.partitions[p].leader != victim.node_id for p in led[key]):
                            seen[key] = at
                            seen[f"{key}_answered_by"] = node.node_id
                            seen[f"{key}_leaders"] = {p: t.partitions[p].leader for p in led[key]}
                    if all(k in seen for k in topics):
                        break
                time.sleep(max(0.0, now + FENCE_POLL_S - mono()))
        finally:
            os.kill(victim.pid, signal.SIGCONT)
        self.say(system.name, "#{} fenced broker: {}; SIGCONT".format(
            rep, ", ".join(f"{k} {seen[k]:.3f} s" for k in ("rf1", "rf3", "unlisted") if k in seen)))
        recovered, waited = wait_whole(system)
        self.say(system.name, f"#{rep} fenced broker: cluster whole {recovered:.1f} s after SIGCONT{last_wait(waited)}")
        return {
            "rep": rep,
            "controller": controller_id,
            "stopped_node": victim.node_id,
            "stopped_at_utc": stopped_at.strftime("%Y-%m-%dT%H:%M:%S.%fZ"),
            "asked_through_node": entry.node_id,
            "led_before": led,
            "rf1_seconds": r3(seen.get("rf1")),
            "rf1_leaders_after": seen.get("rf1_leaders"),
            "rf3_seconds": r3(seen.get("rf3")),
            "rf3_leaders_after": seen.get("rf3_leaders"),
            "unlisted_seconds": r3(seen.get("unlisted")),
            "rf1_answered_by": seen.get("rf1_answered_by"),
            "rf3_answered_by": seen.get("rf3_answered_by"),
            "metadata_polls": polls,
            "metadata_answers_by_node": {str(k): v for k, v in sorted(answers.items())},
            "sigcont_to_whole_s": r3(recovered),
            "sigcont_waited_on": waited,
        }

    def run_system(self, system, reps: int, out: dict) -> None:
        """Starts the cluster and runs the repetitions, adding to `out` as they finish (so that
        an interrupted run keeps what it measured)."""
        started = mono()
        system.start()
        _, out["start_waited_on"] = wait_whole(system)
        self.say(system.name, f"cluster of {NODES} up in {mono() - started:.1f} s (pids "
                              f"{', '.join(str(n.pid) for n in system.nodes)})")
        out["start_to_whole_s"] = r3(mono() - started)
        for rep in range(1, reps + 1):
            for measure in ("failover", "fenced"):
                try:
                    if measure == "failover":
                        out[measure].append(self.controller_failover(system, rep))
                    else:
                        out[measure].append(self.fenced_broker(system, rep, rf3=True))
                except (RuntimeError, KafkaException, AssertionError, subprocess.SubprocessError) as e:
                    traceback.print_exc()
                    out["errors"].append({"rep": rep, "measure": measure, "error": f"{type(e).__name__}: {e}"[:4000]})
                    self.say(system.name, f"#{rep} {measure} failed; the remaining repetitions are skipped")
                    return


# ---- summary, table, JSON -----------------------------------------------------------------------

MEASURES = [
    # (which list of a system's results, the figure's key there, the table's row)
    ("failover", "seconds", "controller failover: SIGKILL -> CreateTopics succeeds"),
    ("fenced", "rf1_seconds", "fenced broker, RF=1: SIGSTOP -> its partitions leaderless"),
    ("fenced", "rf3_seconds", "fenced broker, RF=3: SIGSTOP -> new leaders"),
    ("fenced", "unlisted_seconds", "fenced broker: SIGSTOP -> gone from Metadata's brokers"),
    ("failover", "restart_to_whole_s", "after failover: restart -> cluster whole"),
    ("fenced", "sigcont_to_whole_s", "after fencing: SIGCONT -> cluster whole"),
]


def summary_key(measure: str, key: str) -> str:
    return "failover_seconds" if (measure, key) == ("failover", "seconds") else key


def summarize(runs: dict) -> dict:
    """Median, min and max of each measure over the repetitions that have it."""
    out = {}
    for measure, key, _ in MEASURES:
        xs = [r[key] for r in runs.get(measure, []) if r.get(key) is not None]
        out[summary_key(measure, key)] = (
            {"n": len(xs), "median": r3(statistics.median(xs)), "min": r3(min(xs)), "max": r3(max(xs))} if xs else None)
    return out


def table(doc: dict) -> str:
    rows = [["system", "measure (seconds)", "n", "median", "min", "max"]]
    for system, res in doc["systems"].items():
        for measure, key, what in MEASURES:
            s = res.get("summary", {}).get(summary_key(measure, key))
            if s is None:
                rows.append([system, what, "0", "-", "-", "-"])
                continue
            rows.append([system, what, str(s["n"]), f"{s['median']:.3f}", f"{s['min']:.3f}", f"{s['max']:.3f}"])
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in rows)


def git(*args: str) -> str:
    try:
        return subprocess.run(["git", *args], cwd=REPO, capture_output=True, text=True, timeout=30).stdout.strip()
    except Exception:
        return ""


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--reps", type=int, default=3, help="repetitions of each measure per system (default 3)")
    ap.add_argument("--systems", default="sluice,kafka", help="comma-separated, of: " + ", ".join(SYSTEMS))
    ap.add_argument("--results-dir", default=str(REPO / "perf" / "results"))
    ap.add_argument("--keep", action="store_true", help="keep the nodes' data directories and logs")
    args = ap.parse_args()
    systems = [s for s in args.systems.split(",") if s]
    unknown = [s for s in systems if s not in SYSTEMS]
    if unknown or not systems:
        ap.error(f"unknown systems {unknown}")
    if args.reps < 1:
        ap.error("--reps must be at least 1")

    t0 = time.time()
    date_utc = datetime.now(timezone.utc).strftime("%Y-%m-%dT%H%M%SZ")
    workroot = WORKROOT / date_utc
    # The Sluice nodes' data directories (harness.TEST_DIR, read when harness is first imported,
    # here) go there too, unless SLUICE_TEST_DIR says otherwise.
    os.environ.setdefault("SLUICE_TEST_DIR", str(workroot / "sluice"))
    import confluent_kafka
    from harness import SLUICE_BIN, TEST_DIR

    if "sluice" in systems and not SLUICE_BIN.exists():
        print(f"{SLUICE_BIN} does not exist; build it with `cargo build -p sluice-broker`", file=sys.stderr)
        return 1

    commit = git("rev-parse", "--short", "HEAD") or "unknown"
    # Uncommitted changes to the broker's sources mean the figures are not the commit's.
    dirty = bool(git("status", "--porcelain", "--", "broker", "engine", "replication", "Cargo.toml"))
    workroot.mkdir(parents=True, exist_ok=True)
    TEST_DIR.mkdir(parents=True, exist_ok=True)
    loadavg_start = Path("/proc/loadavg").read_text().split()[:3]
    print(f"cluster failover benchmark: {', '.join(systems)} x {args.reps}, commit {commit}{' (dirty)' if dirty else ''}, "
          f"load average {' '.join(loadavg_start)}; Kafka under {workroot}, Sluice under {TEST_DIR}", flush=True)

    bench = Bench(t0)
    results: dict[str, dict] = {}
    failed = interrupted = False
    for name in systems:
        system = None
        res: dict = {"failover": [], "fenced": [], "errors": []}
        try:
            system = SluiceSystem(f"failover-{date_utc}") if name == "sluice" else KafkaSystem(workroot)
            bench.run_system(system, args.reps, res)
        except KeyboardInterrupt:
            interrupted = True
            res["errors"].append({"error": "interrupted"})
        except Exception as e:
            traceback.print_exc()
            res["errors"].append({"error": f"{type(e).__name__}: {e}"[:4000]})
        finally:
            if system is not None:
                # Every process it started ends here, by PID, also on failure or Ctrl-C.
                codes = system.stop()
                res["exit_codes"] = {str(k): v for k, v in codes.items()}
                bench.say(name, f"stopped: exit codes {codes}")
        failed = failed or bool(res["errors"])
        if system is not None:
            res["command_line"] = system.command_line()
            if name == "kafka":
                res["version"] = system.version
            if res["errors"] or args.keep:
                bench.say(name, "files kept: " + ", ".join(str(getattr(n, "root", "")) for n in system.nodes))
            else:
                system.remove()
        res["summary"] = summarize(res)
        results[name] = res
        if interrupted:
            break
    if not failed and not args.keep:
        shutil.rmtree(workroot, ignore_errors=True)

    loadavg_end = Path("/proc/loadavg").read_text().split()[:3]
    cpu_model = next((l.split(":", 1)[1].strip() for l in Path("/proc/cpuinfo").read_text().splitlines()
                      if l.startswith("model name")), "")
    java = subprocess.run(["java", "-version"], capture_output=True, text=True).stderr.splitlines() if "kafka" in systems else []
    doc = {
        "benchmark": "cluster-failover",
        "date_utc": date_utc,
        "commit": commit,
        "dirty": dirty,
        "script_sha256": hashlib.sha256(Path(__file__).read_bytes()).hexdigest(),
        "machine": {
            "kernel": platform.release(),
            "cpus": os.cpu_count(),
            "cpu_model": cpu_model,
            "loadavg_start": " ".join(loadavg_start),
            "loadavg_end": " ".join(loadavg_end),
        },
        "sluice": {
            "binary": str(SLUICE_BIN.relative_to(REPO)) if SLUICE_BIN.is_relative_to(REPO) else SLUICE_BIN.name,
            "binary_mtime_utc": datetime.fromtimestamp(SLUICE_BIN.stat().st_mtime, timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
            if SLUICE_BIN.exists() else None,
        },
        "java": java[0] if java else None,
        "clients": {"confluent_kafka": confluent_kafka.version(), "librdkafka": confluent_kafka.libversion()[0]},
        "settings": {
            "nodes": NODES,
            "roles": "broker,controller on every node",
            "broker.session.timeout.ms": BROKER_SESSION_TIMEOUT_MS,
            "broker.heartbeat.interval.ms": BROKER_HEARTBEAT_INTERVAL_MS,
            "settings_note": "both systems' defaults, not passed on the command line",
            "kafka_heap": KAFKA_HEAP,
            "probe": {"interval_s": PROBE_INTERVAL_S, "operation_timeout_s": PROBE_OPERATION_TIMEOUT_S,
                      "request_timeout_s": PROBE_REQUEST_TIMEOUT_S, "in_flight": 1,
                      "what": "CreateTopics of a fresh 1-partition RF=1 topic from a fresh AdminClient bootstrapped "
                              "from one surviving broker, sent only when its Metadata names a live node as the "
                              "controller; the next one 50 ms after the previous one's answer"},
            "fenced": {"poll_s": FENCE_POLL_S, "partitions_per_topic": FENCE_PARTITIONS,
                       "what": "Metadata from a fresh AdminClient bootstrapped from the node that is neither "
                               "the controller nor stopped, answered by it or by the controller's node"},
        },
        "systems": results,
        "total_seconds": round(time.time() - t0, 1),
    }
    out = None
    if any(r["failover"] or r["fenced"] for r in results.values()):  # nothing written without a figure
        out_dir = Path(args.results_dir)
        out_dir.mkdir(parents=True, exist_ok=True)
        out = out_dir / f"cluster-failover-{date_utc}-{commit}.json"
        out.write_text(json.dumps(doc, indent=2) + "\n")

    print()
    print(table(doc))
    print()
    print(f"Seconds, median/min/max over the repetitions. Broker session {BROKER_SESSION_TIMEOUT_MS} ms, heartbeat "
          f"{BROKER_HEARTBEAT_INTERVAL_MS} ms (both systems' defaults). Failover: the first CreateTopics (one at a time, "
          f"{PROBE_INTERVAL_S * 1000:.0f} ms apart) answered with success; fenced: the first Metadata (every "
          f"{FENCE_POLL_S * 1000:.0f} ms) showing it.")
    for name, res in results.items():
        for e in res["errors"]:
            print(f"{name}: failed: {e['error'].splitlines()[0][:200]}")
    print(f"load average {' '.join(loadavg_start)} at the start, {' '.join(loadavg_end)} at the end; {doc['total_seconds']} s")
    if out is not None:
        try:
            shown = out.relative_to(Path.cwd())
        except ValueError:
            shown = out
        print(f"results: {shown}")
    if interrupted:
        return 130
    return 1 if failed else 0


if __name__ == "__main__":

    def interrupted(signum, frame):
        raise KeyboardInterrupt()

    # SIGTERM stops the benchmark as Ctrl-C does: every process it started is ended by PID.
    signal.signal(signal.SIGTERM, interrupted)
    sys.exit(main())
