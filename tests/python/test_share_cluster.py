"""Share groups across a failover (KIP-932): three combined nodes, a one-partition topic with
three replicas, and share consumers (librdkafka's) acknowledging every record. The partition's
leader is SIGKILLed, then the share coordinator's leader (the leader of the
`__share_group_state` partition the share partition's key hashes to, Kafka's placement), each
while a consumer holds records. The share partition's state moves with them:

- no record whose acknowledgement succeeded is delivered again;
- no record is lost: every record is accepted in the end;
- a record delivered again comes with a higher delivery count than before (counts are kept
  across the failover, never started over).
"""

from __future__ import annotations

import threading
import time
import uuid

import pytest
from confluent_kafka import AcknowledgeType, Producer, ShareConsumer, TopicCollection
from confluent_kafka.admin import AlterConfigOpType, ConfigEntry, ConfigResource, NewTopic

from cluster import Cluster, running, wait_for
from harness import START_TIMEOUT_S, admin

STATE_TOPIC = "__share_group_state"
STATE_PARTITIONS = 6
RECORDS = 600
LOCK_MS = 2000


@pytest.fixture(scope="module")
def cluster(request):
    c = Cluster(3, name="sharefault", extra_args=[
        "--replica-lag-time-max-ms", "2000",
        "--override", f"share.coordinator.state.topic.num.partitions={STATE_PARTITIONS}",
        "--override", f"group.share.record.lock.duration.ms={LOCK_MS}",
        "--override", "group.share.min.record.lock.duration.ms=1000",
        "--override", "group.share.session.timeout.ms=6000",
        "--override", "group.share.heartbeat.interval.ms=1000"])
    yield from running(request, c, "every broker to be registered",
                       lambda: len(admin(c.bootstrap).list_topics(timeout=5).brokers) == 3, START_TIMEOUT_S)


def java_hash(s: str) -> int:
    h = 0
    for ch in s.encode("utf-16-be").decode("utf-16-be"):
        h = (31 * h + ord(ch)) & 0xFFFFFFFF
    return h - (1 << 32) if h >= 1 << 31 else h


def leader(bootstrap: str, topic: str, partition: int) -> int:
    md = admin(bootstrap).list_topics(topic=topic, timeout=10)
    t = md.topics.get(topic)
    if t is None or t.error is not None or partition not in t.partitions:
        return -1
    return t.partitions[partition].leader


def coordinator_of(bootstrap: str, group: str, topic_id: str, partition: int) -> int:
    """The broker leading the share partition's `__share_group_state` partition."""
    h = java_hash(f"{group}:{topic_id}:{partition}")
    return leader(bootstrap, STATE_TOPIC, (0 if h == -(1 << 31) else abs(h)) % STATE_PARTITIONS)


def live(cluster: Cluster, *down: int) -> str:
    return ",".join(n.bootstrap for n in cluster.brokers if n.node_id not in down)


class Ledger:
    """What the consumers saw: every delivery (offset, delivery count, when), and the offsets
    whose acknowledgement succeeded, with when."""

    def __init__(self):
        self.lock = threading.Lock()
        self.deliveries: dict[int, list[tuple[int, float]]] = {}
        self.accepted: dict[int, float] = {}

    def delivered(self, offset: int, count: int) -> None:
        with self.lock:
            self.deliveries.setdefault(offset, []).append((count, time.monotonic()))

    def acked(self, offsets: list[int]) -> None:
        now = time.monotonic()
        with self.lock:
            for o in offsets:
                self.accepted.setdefault(o, now)


def member(bootstrap: str, group: str, topic: str, ledger: Ledger, stop: threading.Event,
           hold: threading.Event) -> None:
    """Polls and accepts every record (explicit acknowledgement, committed per poll); while
    `hold` is set it stops polling, so that what the client fetched ahead stays acquired."""
    c = ShareConsumer({"bootstrap.servers": bootstrap, "group.id": group,
                       "share.acknowledgement.mode": "explicit"})
    c.subscribe([topic])
    try:
        while not stop.is_set():
            if hold.is_set():
                time.sleep(0.1)
                continue
            ms = [m for m in list(c.poll(0.5) or []) if not m.error()]
            for m in ms:
                ledger.delivered(m.offset(), m.delivery_count())
                c.acknowledge(m, AcknowledgeType.ACCEPT)
            if not ms:
                continue
            try:
                result = c.commit_sync(15)
            except Exception:  # noqa: BLE001 - a failover: these may come again
                continue
            # One partition: its result is the acknowledgements' outcome.
            if all(v is None for v in result.values()):
                ledger.acked([m.offset() for m in ms])
    finally:
        c.close()


def test_share_state_moves_with_the_partition_leader_and_the_share_coordinator(cluster):
    bootstrap = cluster.bootstrap
    client = admin(bootstrap)
    topic, group = f"sharefault-{uuid.uuid4().hex[:8]}", f"sg-{uuid.uuid4().hex[:8]}"
    client.create_topics([NewTopic(topic, 1, 3)], request_timeout=15)[topic].result(20)
    resource = ConfigResource("GROUP", group, incremental_configs=[
        ConfigEntry("share.auto.offset.reset", "earliest", incremental_operation=AlterConfigOpType.SET)])
    client.incremental_alter_configs([resource])[resource].result(20)
    wait_for("the topic's leader", lambda: leader(bootstrap, topic, 0) > 0)
    topic_id = str(client.describe_topics(TopicCollection([topic]))[topic].result(20).topic_id)
    p = Producer({"bootstrap.servers": bootstrap, "acks": "all", "linger.ms": 5})
    for i in range(RECORDS):
        p.produce(topic, value=f"r-{i}".encode(), partition=0)
    assert p.flush(30) == 0

    ledger = Ledger()
    stop, hold = threading.Event(), threading.Event()
    threads = [threading.Thread(target=member, args=(bootstrap, group, topic, ledger, stop, hold))
               for _ in range(2)]
    for t in threads:
        t.start()
    try:
        wait_for("a third of the records accepted", lambda: len(ledger.accepted) >= RECORDS // 3, timeout=60)
        wait_for("the share coordinator", lambda: coordinator_of(bootstrap, group, topic_id, 0) > 0)
        # 1. The partition's leader, while the members hold what they have.
        hold.set()
        time.sleep(1)
        victim = leader(bootstrap, topic, 0)
        cluster.node(victim).kill()
        hold.clear()
        wait_for("a new leader", lambda: leader(live(cluster, victim), topic, 0) not in (-1, victim), timeout=30)
        cluster.node(victim).start()
        wait_for("two thirds of the records accepted", lambda: len(ledger.accepted) >= 2 * RECORDS // 3, timeout=90)
        # 2. The share coordinator's leader (the same node or another).
        hold.set()
        time.sleep(1)
        victim = coordinator_of(bootstrap, group, topic_id, 0)
        assert victim > 0
        cluster.node(victim).kill()
        hold.clear()
        wait_for("a new share coordinator",
                 lambda: coordinator_of(live(cluster, victim), group, topic_id, 0) not in (-1, victim), timeout=30)
        cluster.node(victim).start()
        wait_for("every record accepted", lambda: len(ledger.accepted) >= RECORDS, timeout=120)
        # Nothing more comes after a lock duration.
        time.sleep(LOCK_MS / 1000 + 1)
    finally:
        stop.set()
        for t in threads:
            t.join(60)

    assert sorted(ledger.accepted) == list(range(RECORDS)), "every record accepted, none lost"
    again = {o: [c for c, at in d if at > ledger.accepted[o]]
             for o, d in ledger.deliveries.items() if any(at > ledger.accepted[o] for _, at in d)}
    assert not again, f"delivered again after their acknowledgement succeeded: {dict(list(again.items())[:10])}"
    # Delivery counts are kept: a record delivered again never starts over at a count it had
    # (the order the members saw them in is not the broker's, so only repeats are checked).
    repeated = {o: [c for c, _ in d] for o, d in ledger.deliveries.items()
                if len({c for c, _ in d}) < len(d)}
    assert not repeated, f"delivery counts repeated: {dict(list(repeated.items())[:10])}"
    redelivered = sum(1 for d in ledger.deliveries.values() if len(d) > 1)
    print(f"{redelivered} records delivered more than once (held across a kill)")


def test_share_group_offsets_are_described_from_every_partitions_leader(cluster):
    """kafka-share-groups on a three-node cluster: after a reset to the earliest offsets (which
    every leader forgets, so each partition is described from its persisted state) the lag of
    every partition is its high watermark, asked of its leader wherever that is."""
    from reference import java

    bootstrap = cluster.bootstrap
    client = admin(bootstrap)
    topic, group = f"sharelag-{uuid.uuid4().hex[:8]}", f"sl-{uuid.uuid4().hex[:8]}"
    client.create_topics([NewTopic(topic, 3, 3)], request_timeout=15)[topic].result(20)
    resource = ConfigResource("GROUP", group, incremental_configs=[
        ConfigEntry("share.auto.offset.reset", "earliest", incremental_operation=AlterConfigOpType.SET)])
    client.incremental_alter_configs([resource])[resource].result(20)
    wait_for("every partition's leader", lambda: all(leader(bootstrap, topic, p) > 0 for p in range(3)))
    leaders = {leader(bootstrap, topic, p) for p in range(3)}
    # Leaders on two brokers at least: the group coordinator's broker leads at most some.
    assert len(leaders) >= 2, leaders
    p = Producer({"bootstrap.servers": bootstrap, "acks": "all"})
    for i in range(30):
        p.produce(topic, value=f"r-{i}".encode(), partition=i % 3)
    assert p.flush(30) == 0

    def share_groups(*args):
        done = java("org.apache.kafka.tools.consumer.group.ShareGroupCommand", "--bootstrap-server", bootstrap,
                    "--group", group, *args, timeout=120)
        assert done.returncode == 0, done.stdout + done.stderr[-2000:]
        return [line.split() for line in done.stdout.splitlines() if line.startswith(group)]

    def lags():
        return {int(row[2]): row[4] for row in share_groups("--describe") if row[1] == topic}

    # One member accepts all 30 (the ledger counts offsets of one partition: not used here).
    ledger, stop, hold = Ledger(), threading.Event(), threading.Event()
    t = threading.Thread(target=member, args=(bootstrap, group, topic, ledger, stop, hold))
    t.start()
    try:
        wait_for("lag 0 on every partition", lambda: lags() == {0: "0", 1: "0", 2: "0"}, timeout=90)
    finally:
        stop.set()
        t.join(60)
    reset = share_groups("--reset-offsets", "--to-earliest", "--topic", topic, "--execute")
    assert sorted((int(r[2]), r[3]) for r in reset) == [(0, "0"), (1, "0"), (2, "0")], reset
    assert lags() == {0: "10", 1: "10", 2: "10"}, f"leaders {leaders}"
