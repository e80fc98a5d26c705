"""Node id 0, which Kafka accepts and many clients' examples assume: a single broker started with
`--node-id 0`, and a three-node cluster of nodes 0, 1 and 2 that loses the leader of a partition
node 0 leads (and node 0 with it, whatever its place in the controller quorum) under acknowledged
load. raft-rs reserves id 0; Sluice maps node ids to raft ids in one place
(`sluice_replication::quorum::raft_id`)."""

from __future__ import annotations

from confluent_kafka import TopicPartition
from confluent_kafka.admin import NewTopic

from cluster import Cluster, running, wait_for
from harness import Broker, admin, assert_all_delivered, consumer, produce_all, producer, read_to_end
from kafka.protocol.admin.cluster import DescribeClusterRequest
from wire import Pipeline, build
from test_cluster import java
from test_single_node_quorum import quorum_status

import json
import time

import pytest


def read_all(bootstrap: str, topic: str, partition: int, end: int) -> list:
    c = consumer(bootstrap)
    try:
        c.assign([TopicPartition(topic, partition, 0)])
        return read_to_end(c, {(topic, partition): end})
    finally:
        c.close()


def test_a_single_broker_with_node_id_0_serves_and_restarts():
    broker = Broker(name="node0", extra_args=["--node-id", "0"])
    try:
        broker.start()
        md = admin(broker.bootstrap).list_topics(timeout=10)
        assert list(md.brokers) == [0], md.brokers
        assert md.controller_id == 0
        status = quorum_status(broker.bootstrap)
        assert status["LeaderId"] == "0", status
        assert [v["id"] for v in json.loads(status["CurrentVoters"])] == [0], status
        client = admin(broker.bootstrap)
        client.create_topics([NewTopic("zero", num_partitions=2, replication_factor=1)])["zero"].result(30)
        reports = produce_all(producer(broker.bootstrap),
                              "zero", [{"key": f"k{i}", "value": f"v{i}", "partition": i % 2} for i in range(200)])
        assert_all_delivered(reports)
        # A kill -9 and a start on the same data: node 0 is its own quorum again.
        broker.kill()
        broker.start()
        md = admin(broker.bootstrap).list_topics(topic="zero", timeout=10)
        assert all(p.leader == 0 for p in md.topics["zero"].partitions.values())
        for partition in (0, 1):
            got = read_all(broker.bootstrap, "zero", partition, 100)
            assert [m.value().decode() for m in got] == [f"v{i}" for i in range(partition, 200, 2)]
        broker.stop_cleanly()
        assert "panicked" not in broker.log_text()
    except BaseException:
        print(broker.log_tail())
        raise
    broker.remove()


@pytest.fixture(scope="module")
def cluster(request):
    c = Cluster(3, name="zero", first_id=0, extra_args=["--leader-imbalance-check-interval-seconds", "1"])
    yield from running(request, c, "nodes 0, 1 and 2 registered",
                       lambda: set(admin(c.bootstrap).list_topics(timeout=5).brokers) == {0, 1, 2})


def test_a_cluster_of_nodes_0_1_2_survives_losing_node_0(cluster):
    bootstrap = cluster.bootstrap
    client = admin(bootstrap)
    # Node 0 leads the partition (the first replica is the preferred leader).
    client.create_topics([NewTopic("zero-rf3", num_partitions=1, replica_assignment=[[0, 1, 2]],
                                   config={"min.insync.replicas": "2"})])["zero-rf3"].result(30)
    wait_for("node 0 to lead zero-rf3",
             lambda: admin(bootstrap).list_topics(topic="zero-rf3", timeout=5).topics["zero-rf3"].partitions[0].leader == 0)
    p = producer(bootstrap, **{"enable.idempotence": True})
    first = produce_all(p, "zero-rf3", [{"value": f"a{i}"} for i in range(300)])
    assert_all_delivered(first)
    assert [r.offset for r in first] == list(range(300))
    killed_ms = time.time() * 1000
    cluster.node(0).kill()
    wait_for("a new leader of zero-rf3",
             lambda: admin(cluster.node(1).bootstrap).list_topics(topic="zero-rf3", timeout=5)
             .topics["zero-rf3"].partitions[0].leader in (1, 2), timeout=30)
    second = produce_all(p, "zero-rf3", [{"value": f"b{i}"} for i in range(300)])
    assert_all_delivered(second)
    assert [r.offset for r in second] == list(range(300, 600))
    # The dead voter is visible in kafka-metadata-quorum: the quorum leader last heard from
    # node 0 before the kill (or never, if leadership moved with it), and from the others now.
    def heard() -> dict:
        out = java("org.apache.kafka.tools.MetadataQuorumCommand", "--bootstrap-server",
                   cluster.node(1).bootstrap, "describe", "--replication")
        assert out.returncode == 0, out.stderr[-2000:]
        # NodeId DirectoryId LogEndOffset Lag LastFetchTimestamp LastCaughtUpTimestamp Status
        return {int(r[0]): (int(r[4]), int(r[5])) for r in
                (line.split() for line in out.stdout.splitlines() if line[:1].isdigit())}
    wait_for("the live voters heard after the kill",
             lambda: all(heard()[n][0] > killed_ms for n in (1, 2)), timeout=30)
    rows = heard()
    assert sorted(rows) == [0, 1, 2], rows
    now_ms = time.time() * 1000
    for n in (1, 2):
        last_fetch, caught_up = rows[n]
        assert killed_ms < last_fetch <= now_ms + 1000, rows
        assert killed_ms < caught_up <= now_ms + 1000, rows
    assert rows[0][0] == -1 or rows[0][0] < killed_ms + 1000, rows
    # DescribeCluster 2 lists the fenced node 0 only when asked, marked fenced (KIP-1073).
    def described(fenced: bool) -> dict:
        pipe = Pipeline(cluster.node(1).bootstrap)
        pipe.send(build(DescribeClusterRequest, 2, include_cluster_authorized_operations=False, endpoint_type=1,
                        include_fenced_brokers=fenced))
        (r,) = pipe.responses()
        pipe.close()
        return {b["broker_id"]: b["is_fenced"] for b in r["brokers"]}
    wait_for("node 0 fenced", lambda: described(True) == {0: True, 1: False, 2: False}, timeout=30)
    assert described(False) == {1: False, 2: False}
    # Node 0 comes back, catches up and leads its partition again (preferred-leader election).
    cluster.node(0).start(wait=False)
    cluster.node(0).wait_ready(wait_for_partitions=False)
    wait_for("node 0 back in the ISR and leading",
             lambda: (lambda part: part.leader == 0 and sorted(part.isrs) == [0, 1, 2])(
                 admin(bootstrap).list_topics(topic="zero-rf3", timeout=5).topics["zero-rf3"].partitions[0]),
             timeout=60)
    got = read_all(cluster.node(0).bootstrap, "zero-rf3", 0, 600)
    assert [m.value().decode() for m in got] == [f"a{i}" for i in range(300)] + [f"b{i}" for i in range(300)]
    p.flush(10)
