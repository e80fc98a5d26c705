"""Fetching from the closest replica (KIP-392): three nodes in three racks with
`replica.selector.class=RackAwareReplicaSelector`. A librdkafka consumer with `client.rack` r2
reads a partition led by node 1 (rack r1) from node 2, the in-sync follower in its rack: the
leader names node 2 as its preferred read replica, node 2 serves the records up to the high
watermark it knows, and the bytes come from node 2, not the leader. When node 2 is killed, the
consumer goes back to the leader and reads everything produced meanwhile: every acknowledged
message once, in order, none past what was acknowledged."""

from __future__ import annotations

import pytest
from confluent_kafka import Consumer, TopicPartition
from confluent_kafka.admin import NewTopic

from cluster import Cluster, running, wait_for
from harness import (CLIENT_DEFAULTS, START_TIMEOUT_S, Stats, admin, assert_all_delivered, produce_all,
                     producer)

RACKS = {1: "r1", 2: "r2", 3: "r3"}
TOPIC = "nearby"
FIRST = 3_000
SECOND = 1_000
VALUE = b"x" * 1_000


@pytest.fixture(scope="module")
def cluster(request):
    c = Cluster(3, name="racks", extra_args=[
        "--replica-selector-class", "org.apache.kafka.common.replica.RackAwareReplicaSelector"])
    for n in c.nodes:
        n.extra_args += ["--broker-rack", RACKS[n.node_id]]
    yield from running(request, c, "every broker registered",
                       lambda: len(admin(c.bootstrap).list_topics(timeout=5).brokers) == 3, START_TIMEOUT_S)


def read(c: Consumer, count: int, first_offset: int, timeout: float = 60.0) -> list:
    """The next `count` messages; fails on an error, a gap, a repeat or a timeout."""
    import time

    out = []
    deadline = time.monotonic() + timeout
    while len(out) < count:
        assert time.monotonic() < deadline, f"read {len(out)} of {count}"
        for m in c.consume(num_messages=1_000, timeout=0.5):
            assert m.error() is None, m.error()
            assert m.offset() == first_offset + len(out), (m.offset(), first_offset + len(out))
            out.append(m)
    return out


def rx_by_node(stats: dict) -> dict[int, int]:
    return {b["nodeid"]: b["rxbytes"] for b in stats["brokers"].values() if b["nodeid"] >= 0}


def test_a_consumer_reads_from_the_replica_in_its_rack_and_back_from_the_leader(cluster):
    client = admin(cluster.bootstrap)
    client.create_topics([NewTopic(TOPIC, num_partitions=1, replica_assignment=[[1, 2, 3]])])[TOPIC].result(30)
    wait_for("node 1 to lead with all three in sync", lambda: (lambda p: p.leader == 1 and sorted(p.isrs) == [1, 2, 3])(
        admin(cluster.bootstrap).list_topics(topic=TOPIC, timeout=5).topics[TOPIC].partitions[0]), timeout=30)
    p = producer(cluster.bootstrap, **{"enable.idempotence": True})
    first = produce_all(p, TOPIC, [{"key": str(i), "value": VALUE} for i in range(FIRST)])
    assert_all_delivered(first)
    assert [r.offset for r in first] == list(range(FIRST))

    stats = Stats()
    c = Consumer({"bootstrap.servers": cluster.bootstrap, "group.id": "nearby-readers", "client.rack": "r2",
                  "enable.auto.commit": False, "auto.offset.reset": "earliest", "fetch.wait.max.ms": 100,
                  **stats.config(), **CLIENT_DEFAULTS})
    try:
        c.assign([TopicPartition(TOPIC, 0, 0)])
        got = read(c, FIRST, 0)
        assert [m.key().decode() for m in got] == [str(i) for i in range(FIRST)]
        assert all(m.value() == VALUE for m in got)
        # librdkafka fetches from node 2 and says so; the records' bytes came from there.
        latest = stats.wait_for(c, lambda s: s["topics"].get(TOPIC, {}).get("partitions", {}).get("0", {})
                                .get("broker") == 2, timeout=10)
        rx = rx_by_node(latest)
        assert rx.get(2, 0) > FIRST * len(VALUE), rx
        assert rx.get(1, 0) < FIRST * len(VALUE) // 4, rx

        # The follower goes; the consumer goes back to the leader and misses nothing.
        cluster.node(2).kill()
        second = produce_all(p, TOPIC, [{"key": str(FIRST + i), "value": VALUE} for i in range(SECOND)])
        assert_all_delivered(second)
        assert [r.offset for r in second] == list(range(FIRST, FIRST + SECOND))
        more = read(c, SECOND, FIRST, timeout=90)
        assert [m.key().decode() for m in more] == [str(FIRST + i) for i in range(SECOND)]
        # Nothing past what was acknowledged.
        assert not c.consume(num_messages=10, timeout=2)
    finally:
        c.close()
    p.flush(10)
    cluster.node(2).start(wait=False)
    cluster.node(2).wait_ready(wait_for_partitions=False)
