"""Growing and shrinking a cluster without downtime (KIP-455): a fourth broker joins three and
takes partitions under an idempotent acks=all producer, moved with `sluice reassign` and with
Apache Kafka's own `kafka-reassign-partitions` (throttled, then verified, which lifts the
throttle); a broker is drained with `sluice reassign drain`; leaders go back to their preferred
replicas with `kafka-leader-election`, and `kafka-log-dirs` shows the moved replicas. Nothing
acknowledged is lost or duplicated, the producer sees no error, a removed replica's data is
deleted, and `sluice cluster` reports no under-replicated or offline partition at the end.
Apart from that, the follower replication throttle bounds how fast a new replica copies, and
every node's Prometheus `/metrics` show leaders, replicas, ISR shrinks and expansions, produced
records and each group's consumer lag (at its coordinator)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import threading
import time
import urllib.request

import pytest
from confluent_kafka import Producer, TopicPartition
from confluent_kafka.admin import AlterConfigOpType, ConfigEntry, ConfigResource, NewTopic

from kafka.protocol.admin.cluster import DescribeLogDirsRequest

from cluster import Cluster, running, wait_for
from harness import CLIENT_DEFAULTS, SLUICE_BIN, admin, consumer, free_port
from reference import ensure_jars, kafka_tool
from test_replication import check_exactly, every_broker_registered, partitions_of, read_all, restart
from wire import Pipeline, build


@pytest.fixture(scope="module")
def cluster(request):
    ensure_jars()
    c = Cluster(3, name="reassign", extra_args=[
        "--replica-lag-time-max-ms", 3000, "--auto-leader-rebalance-enable", "false"])
    for n in c.nodes:
        with_metrics(n)
    yield from running(request, c, "every broker registered and unfenced", lambda: every_broker_registered(c))


def with_metrics(n) -> None:
    n.metrics_port = free_port()
    n.extra_args += ["--metrics-listener", f"127.0.0.1:{n.metrics_port}"]


def scrape(n) -> dict[str, float]:
    """A node's /metrics as {"name{labels}": value}."""
    with urllib.request.urlopen(f"http://127.0.0.1:{n.metrics_port}/metrics", timeout=30) as r:
        assert r.status == 200
        text = r.read().decode()
    assert text.endswith("# EOF\n"), text[-200:]
    out = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            name, value = line.rsplit(" ", 1)
            out[name] = float(value)
    return out


def total(nodes, name: str) -> float:
    return sum(scrape(n).get(name, 0.0) for n in nodes)


def sluice(*args, timeout: float = 180) -> str:
    """Runs a `sluice` client command; its stdout. Fails on a non-zero exit."""
    done = subprocess.run([str(SLUICE_BIN), *args], capture_output=True, text=True, timeout=timeout)
    assert done.returncode == 0, f"sluice {' '.join(args)}: exit {done.returncode}\n{done.stdout}\n{done.stderr}"
    return done.stdout


class Load:
    """An idempotent acks=all producer writing keyed, lz4-compressed messages from a thread
    until stopped: value -> (partition, offset) of every acknowledged one, and every error."""

    def __init__(self, bootstrap: str, topic: str):
        self.acked: dict[int, tuple[int, int]] = {}
        self.failures: list = []
        self.stopping = threading.Event()
        self.p = Producer({"bootstrap.servers": bootstrap, "acks": "all", "enable.idempotence": True,
                           "compression.type": "lz4", "linger.ms": 5, "message.timeout.ms": 120_000,
                           **CLIENT_DEFAULTS})
        self.topic = topic
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _report(self, err, msg):
        if err is not None:
            self.failures.append(err)
        else:
            self.acked[int(msg.value())] = (msg.partition(), msg.offset())

    def _run(self):
        i = 0
        while not self.stopping.is_set():
            try:
                self.p.produce(self.topic, key=f"k{i % 101}", value=str(i), on_delivery=self._report)
                i += 1
            except BufferError:
                self.p.poll(0.05)
            self.p.poll(0)
            if i % 200 == 0:
                time.sleep(0.02)  # about 10k messages a second at most: load, not a flood
        self.sent = i

    def stop(self) -> None:
        self.stopping.set()
        self.thread.join(30)
        assert self.p.flush(120) == 0


def replicas_of(bootstrap: str, topic: str) -> dict[int, tuple[list[int], list[int]]]:
    return {i: (list(p.replicas), sorted(p.isrs)) for i, p in partitions_of(bootstrap, topic).items()}


def log_dir_sizes(bootstrap: str, topic: str) -> dict[int, int]:
    """Partition -> bytes of this broker's replica, from DescribeLogDirs."""
    pipe = Pipeline(bootstrap)
    try:
        pipe.send(build(DescribeLogDirsRequest, 1, topics=[{"topic": topic, "partitions": [0, 1, 2, 3]}]))
        (r,) = pipe.responses()
    finally:
        pipe.close()
    return {p["partition_index"]: p["partition_size"]
            for result in r["results"] for t in result["topics"] if t["name"] == topic for p in t["partitions"]}


def test_a_fourth_broker_takes_partitions_under_load_and_a_broker_is_drained(cluster):
    topic = "moving"
    client = admin(cluster.bootstrap)
    client.create_topics([NewTopic(topic, num_partitions=3, replication_factor=3,
                                   config={"min.insync.replicas": "2"})],
                         operation_timeout=10)[topic].result(timeout=30)
    wait_for("every partition led", lambda: all(p.leader >= 0 for p in partitions_of(cluster.bootstrap, topic).values()))
    load = Load(cluster.bootstrap, topic)
    try:
        wait_for("some acknowledged messages", lambda: len(load.acked) > 2_000, 60)
        fourth = cluster.add_broker()
        assert fourth.node_id == 4
        with_metrics(fourth)
        fourth.start(wait=False)
        fourth.wait_ready(wait_for_partitions=False)
        wait_for("four brokers", lambda: len(admin(cluster.bootstrap).list_topics(timeout=10).brokers) == 4)

        # sluice: one partition moves onto the new broker, replacing broker 1.
        out = sluice("reassign", "move", topic, "--partition", "0", "--replicas", "4,2,3",
                     "--bootstrap-server", cluster.bootstrap)
        assert "complete" in out, out
        wait_for("moving-0 on 4,2,3, all in sync",
                 lambda: replicas_of(cluster.bootstrap, topic)[0] == ([4, 2, 3], [2, 3, 4]))
        wait_for("broker 1 deleted its replica of moving-0",
                 lambda: not (cluster.node(1).data_dir / f"{topic}-0").exists())

        # Kafka's tool, throttled: the throttle is set on the topic and brokers, and --verify
        # lifts it once the move is done.
        plan = cluster.node(1).root / "reassign.json"
        plan.write_text(json.dumps({"version": 1, "partitions": [
            {"topic": topic, "partition": 1, "replicas": [4, 3, 1]}]}))
        tool = "org.apache.kafka.tools.reassign.ReassignPartitionsCommand"
        out = kafka_tool(tool, "--bootstrap-server", cluster.bootstrap, "--reassignment-json-file", str(plan),
                         "--execute", "--throttle", "50000000")
        assert "Successfully started partition reassignment" in out, out
        configs = client.describe_configs([ConfigResource("topic", topic)])
        (topic_configs,) = [f.result(timeout=20) for f in configs.values()]
        assert topic_configs["follower.replication.throttled.replicas"].value, topic_configs
        deadline = time.monotonic() + 120
        while True:
            out = kafka_tool(tool, "--bootstrap-server", cluster.bootstrap, "--reassignment-json-file", str(plan),
                             "--verify")
            if "is completed" in out:
                break
            assert time.monotonic() < deadline, out
            time.sleep(1)
        wait_for("moving-1 on 4,3,1", lambda: replicas_of(cluster.bootstrap, topic)[1] == ([4, 3, 1], [1, 3, 4]))
        configs = client.describe_configs([ConfigResource("topic", topic)])
        (topic_configs,) = [f.result(timeout=20) for f in configs.values()]
        assert not topic_configs["follower.replication.throttled.replicas"].value, "the throttle stayed"

        # Drain broker 1: every replica it holds moves elsewhere.
        out = sluice("reassign", "drain", "--broker", "1", "--bootstrap-server", cluster.bootstrap)
        assert "complete" in out, out
        listed = sluice("reassign", "list", "--bootstrap-server", cluster.bootstrap)
        assert "No partition reassignments in progress." in listed, listed
        md = admin(cluster.bootstrap).list_topics(timeout=10)
        on_one = [(t.topic, i) for t in md.topics.values() for i, p in t.partitions.items() if 1 in p.replicas]
        assert not on_one, f"replicas left on the drained broker: {on_one}"
        wait_for("broker 1 deleted every replica of the topic",
                 lambda: not any((cluster.node(1).data_dir / f"{topic}-{i}").exists() for i in range(3)))

        # The leaders go back to the first replicas (broker 4 leads partition 0 and 1).
        out = kafka_tool("org.apache.kafka.tools.LeaderElectionCommand", "--bootstrap-server", cluster.bootstrap,
                         "--election-type", "PREFERRED", "--all-topic-partitions")
        wait_for("preferred leaders", lambda: all(
            p.leader == p.replicas[0] for p in partitions_of(cluster.bootstrap, topic).values()))
        dirs = kafka_tool("org.apache.kafka.tools.LogDirsCommand", "--bootstrap-server", cluster.bootstrap,
                          "--describe", "--broker-list", "4", "--topic-list", topic)
        report = json.loads(next(line for line in dirs.splitlines() if line.startswith("{")))
        (broker4,) = report["brokers"]
        held = sorted(p["partition"] for d in broker4["logDirs"] for p in d["partitions"])
        assert {f"{topic}-0", f"{topic}-1"} <= set(held), held
    finally:
        load.stop()
    assert not load.failures, load.failures[:5]
    assert len(load.acked) == load.sent, f"{load.sent - len(load.acked)} messages never acknowledged"
    wait_for("no under-replicated or offline partitions", lambda: (
        lambda out: "Under-replicated partitions: 0" in out and "Offline partitions: 0" in out)(
            sluice("cluster", "--bootstrap-server", cluster.bootstrap)), 60)
    ends, messages = read_all(cluster.bootstrap, topic, 3)
    assert sum(ends.values()) == len(load.acked)
    check_exactly(load.acked, messages)


def test_the_follower_throttle_bounds_how_fast_a_new_replica_copies(cluster):
    topic = "throttled"
    client = admin(cluster.bootstrap)
    client.create_topics([NewTopic(topic, num_partitions=1, replica_assignment=[[2]])], operation_timeout=10)[topic].result(timeout=30)
    wait_for("the partition led", lambda: partitions_of(cluster.bootstrap, topic)[0].leader == 2)
    p = Producer({"bootstrap.servers": cluster.bootstrap, "acks": "all", "linger.ms": 20, **CLIENT_DEFAULTS})
    value = bytes(range(256)) * 40  # 10 KiB, not compressible by the batch alone
    for _ in range(800):
        while True:
            try:
                p.produce(topic, value=value)
                break
            except BufferError:
                p.poll(0.05)
    assert p.flush(60) == 0
    total = log_dir_sizes(cluster.node(2).bootstrap, topic)[0]
    assert total > 8_000_000, total

    rate = 300_000
    throttle = [
        ConfigResource("broker", "3", incremental_configs=[ConfigEntry(
            "follower.replication.throttled.rate", str(rate), incremental_operation=AlterConfigOpType.SET)]),
        ConfigResource("topic", topic, incremental_configs=[ConfigEntry(
            "follower.replication.throttled.replicas", "0:3", incremental_operation=AlterConfigOpType.SET)]),
    ]
    for f in client.incremental_alter_configs(throttle).values():
        f.result(timeout=20)
    started = time.monotonic()
    sluice("reassign", "move", topic, "--partition", "0", "--replicas", "2,3", "--no-wait",
           "--bootstrap-server", cluster.bootstrap)
    wait_for("broker 3 holds the new replica", lambda: 0 in log_dir_sizes(cluster.node(3).bootstrap, topic))
    time.sleep(3)
    copied = log_dir_sizes(cluster.node(3).bootstrap, topic)[0]
    elapsed = time.monotonic() - started
    # At most the rate over the time passed, a second's burst, and the one fetch (up to
    # replica.fetch.max.bytes, 1 MiB) that may take the bucket below zero.
    bound = rate * (elapsed + 1) + (1 << 20) + 64 * 1024
    assert copied <= bound, f"copied {copied} bytes in {elapsed:.1f} s at {rate} B/s"
    assert copied < total
    assert "adding [3]" in sluice("reassign", "list", "--bootstrap-server", cluster.bootstrap)

    # The throttle lifted, the copy completes.
    lift = ConfigResource("broker", "3", incremental_configs=[ConfigEntry(
        "follower.replication.throttled.rate", None, incremental_operation=AlterConfigOpType.DELETE)])
    for f in client.incremental_alter_configs([lift]).values():
        f.result(timeout=20)
    wait_for("the move done once unthrottled", lambda: (
        lambda ongoing: "No partition reassignments in progress." in ongoing)(
            sluice("reassign", "list", "--bootstrap-server", cluster.bootstrap)), 90)
    assert replicas_of(cluster.bootstrap, topic)[0] == ([2, 3], [2, 3])
    assert log_dir_sizes(cluster.node(3).bootstrap, topic)[0] == total


def test_metrics_show_leaders_isr_changes_bytes_and_consumer_lag(cluster):
    topic = "observed"
    nodes = [n for n in cluster.nodes if n.running()]
    client = admin(cluster.bootstrap)
    client.create_topics([NewTopic(topic, num_partitions=1, replication_factor=3,
                                   config={"min.insync.replicas": "2"})], operation_timeout=10)[topic].result(timeout=30)
    wait_for("the partition led", lambda: partitions_of(cluster.bootstrap, topic)[0].leader >= 0)
    p = Producer({"bootstrap.servers": cluster.bootstrap, "acks": "all", **CLIENT_DEFAULTS})
    for i in range(1_000):
        p.produce(topic, value=b"%04d" % i)
    assert p.flush(60) == 0
    c = consumer(cluster.bootstrap, **{"group.id": "watchers", "enable.auto.commit": False})
    try:
        c.commit(offsets=[TopicPartition(topic, 0, 400)], asynchronous=False)
    finally:
        c.close()

    # Every partition of the cluster has one leader, counted by the broker that leads it.
    md = admin(cluster.bootstrap).list_topics(timeout=10)
    partitions = sum(len(t.partitions) for t in md.topics.values())
    replicas = sum(len(q.replicas) for t in md.topics.values() for q in t.partitions.values())
    wait_for("the gauges", lambda: total(nodes, "kafka_server_replicamanager_leadercount") == partitions
             and total(nodes, "kafka_server_replicamanager_partitioncount") == replicas, 30)
    assert total(nodes, "kafka_controller_kafkacontroller_activecontrollercount") == 1
    assert total(nodes, "kafka_controller_kafkacontroller_offlinepartitionscount") == 0
    # Consumer lag, reported once: by the group's coordinator.
    wanted = f'kafka_consumergroup_lag{{consumergroup="watchers",topic="{topic}",partition="0"}}'
    assert total(nodes, wanted) == 600
    assert total(nodes, 'kafka_consumergroup_lag_sum{consumergroup="watchers"}') == 600
    leader = cluster.node(partitions_of(cluster.bootstrap, topic)[0].leader)
    assert scrape(leader)["kafka_server_brokertopicmetrics_messagesin_total"] >= 1_000
    assert scrape(leader)["kafka_server_brokertopicmetrics_bytesin_total"] >= 4_000

    # A stopped follower: the leader counts a shrink and the partition under-replicated, then
    # an expansion once the follower is back.
    follower = cluster.node(next(r for r in partitions_of(cluster.bootstrap, topic)[0].replicas if r != leader.node_id))
    before = scrape(leader)
    os.kill(follower.pid, signal.SIGSTOP)
    try:
        wait_for("an ISR shrink", lambda: scrape(leader)["kafka_server_replicamanager_isrshrinks_total"]
                 > before["kafka_server_replicamanager_isrshrinks_total"], 30)
        wait_for("under-replicated", lambda: scrape(leader)["kafka_server_replicamanager_underreplicatedpartitions"] >= 1, 10)
    finally:
        os.kill(follower.pid, signal.SIGCONT)
    wait_for("an ISR expansion", lambda: scrape(leader)["kafka_server_replicamanager_isrexpands_total"]
             > before["kafka_server_replicamanager_isrexpands_total"], 60)
    wait_for("nothing under-replicated", lambda: total(nodes, "kafka_server_replicamanager_underreplicatedpartitions") == 0, 60)
    out = sluice("cluster", "--bootstrap-server", cluster.bootstrap)
    assert "watchers\tlag: 600\tpartitions: 1" in out, out


def test_a_replica_moved_off_a_broker_while_it_was_down_is_deleted_when_it_returns(cluster):
    topic = "left-behind"
    client = admin(cluster.bootstrap)
    client.create_topics([NewTopic(topic, num_partitions=1, replica_assignment=[[2, 3, 4]])],
                         operation_timeout=10)[topic].result(timeout=30)
    wait_for("the partition led", lambda: partitions_of(cluster.bootstrap, topic)[0].leader >= 0)
    p = Producer({"bootstrap.servers": cluster.bootstrap, "acks": "all", **CLIENT_DEFAULTS})
    for i in range(100):
        p.produce(topic, value=b"%d" % i)
    assert p.flush(30) == 0
    victim = cluster.node(4)
    replica_dir = victim.data_dir / f"{topic}-0"
    wait_for("broker 4's copy", lambda: replica_dir.exists())
    victim.kill()
    # Its replica leaves while it is down (a shrink completes at once).
    sluice("reassign", "move", topic, "--partition", "0", "--replicas", "2,3",
           "--bootstrap-server", cluster.node(2).bootstrap)
    assert partitions_of(cluster.node(2).bootstrap, topic)[0].replicas == [2, 3]
    assert replica_dir.exists()
    restart([victim])
    wait_for("the stray copy deleted", lambda: not replica_dir.exists(), 60)
    # The restarted node replays its own metadata first (opening the replica), then catches up
    # and deletes it; one that catches up from a snapshot never opens it and deletes the stray.
    assert "deleted a replica moved off this node" in victim.current_log()
    ends, messages = read_all(cluster.bootstrap, topic, 1)
    assert sorted(int(m.value()) for m in messages) == list(range(100))
