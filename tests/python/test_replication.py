"""Replication across three nodes on 127.0.0.1 (`--cores 1` each): partitions with three
replicas, followers copying their leaders through Kafka's Fetch, acks=all acknowledged only
once every in-sync replica has the records, and a leader killed with kill -9 replaced by an
in-sync follower that serves every acknowledged message, once, at its acknowledged offset; a
follower SIGSTOPped leaves the ISR while writes go on, and rejoins once it caught up.
With controllers apart from the brokers, two of three replicas down: acks=all refused with
NOT_ENOUGH_REPLICAS below `min.insync.replicas`, acks=1 is appended but stays above the high
watermark (KIP-966) while reads of what was committed go on, and after the followers return they
rejoin the ISR, the high watermark passes the acks=1 record and acks=all works again; and a leader that alone took
records, died and came back truncates them away by the diverging epoch (KIP-320). A consumer
group keeps its commits and goes on consuming when its coordinator is killed."""

from __future__ import annotations

import collections
import os
import signal
import time
from pathlib import Path

import pytest
from confluent_kafka import KafkaError, KafkaException, Producer, TopicPartition
from confluent_kafka.admin import NewTopic

from kafka.protocol.metadata.find_coordinator import FindCoordinatorRequest
from kafka.protocol.producer.produce import ProduceRequest

from cluster import Cluster, running, wait_for
from harness import CLIENT_DEFAULTS, admin, consumer, read_to_end
from wire import Pipeline, batch, build

PARTITIONS = 3
LAG_MS = 3000
# The cluster fixture's `leader.imbalance.check.interval.seconds` (Kafka's default is 300).
REBALANCE_S = 3


def every_broker_registered(c: Cluster):
    return all(len(admin(n.bootstrap).list_topics(timeout=10).brokers) == len(c.brokers) for n in c.brokers)


@pytest.fixture(scope="module")
def cluster_nodes(request):
    c = Cluster(3, name="replication", extra_args=[
        "--replica-lag-time-max-ms", LAG_MS,
        "--leader-imbalance-check-interval-seconds", REBALANCE_S])
    yield from running(request, c, "every broker registered and unfenced", lambda: every_broker_registered(c))


@pytest.fixture
def cluster(cluster_nodes):
    """The three-node cluster, whole again after each test: a node a failed test left killed is
    started again and waited for until it is registered, so the next test does not fail on it."""
    yield cluster_nodes
    down = [n for n in cluster_nodes.nodes if n.proc is None or n.proc.poll() is not None]
    if down:
        restart(down)
        for n in down:
            wait_for(f"node {n.node_id} registered again",
                     lambda n=n: "broker state changed fenced=false" in n.current_log(), 60)


def partitions_of(bootstrap: str, topic: str):
    md = admin(bootstrap).list_topics(topic=topic, timeout=10)
    t = md.topics[topic]
    if t.error is not None:
        return None
    return t.partitions


def create_replicated(bootstrap: str, name: str, partitions: int, min_isr: int = 2) -> None:
    client = admin(bootstrap)
    futures = client.create_topics(
        [NewTopic(name, num_partitions=partitions, replication_factor=3,
                  config={"min.insync.replicas": str(min_isr)})],
        operation_timeout=10, request_timeout=20)
    futures[name].result(timeout=30)


def produce_keyed(bootstrap: str, topic: str, start: int, count: int, **extra) -> dict[int, tuple[int, int]]:
    """`count` keyed messages from an idempotent acks=all producer; value -> (partition, offset)
    of every acknowledged one. Fails on any delivery error."""
    p = Producer({"bootstrap.servers": bootstrap, "acks": "all", "enable.idempotence": True,
                  "linger.ms": 5, "message.timeout.ms": 60_000, **CLIENT_DEFAULTS, **extra})
    acked: dict[int, tuple[int, int]] = {}
    failures = []

    def report(err, msg):
        if err is not None:
            failures.append(err)
        else:
            acked[int(msg.value())] = (msg.partition(), msg.offset())

    for i in range(start, start + count):
        while True:
            try:
                p.produce(topic, key=f"k{i % 97}", value=str(i), on_delivery=report)
                break
            except BufferError:
                p.poll(0.05)
        p.poll(0)
    assert p.flush(90) == 0
    assert not failures, failures[:5]
    return acked


def read_all(bootstrap: str, topic: str, partitions: int):
    c = consumer(bootstrap)
    try:
        ends = {}
        for p in range(partitions):
            # Right after a failover the client's metadata may still name the old leader.
            deadline = time.monotonic() + 30
            while True:
                try:
                    lo, hi = c.get_watermark_offsets(TopicPartition(topic, p), timeout=10, cached=False)
                    break
                except KafkaException:
                    if time.monotonic() > deadline:
                        raise
                    time.sleep(0.5)
            ends[(topic, p)] = hi
        c.assign([TopicPartition(topic, p, 0) for p in range(partitions)])
        return ends, read_to_end(c, ends, timeout=120)
    finally:
        c.close()


def check_exactly(acked: dict[int, tuple[int, int]], messages) -> None:
    seen = collections.Counter(int(m.value()) for m in messages)
    dup = [v for v, n in seen.items() if n > 1]
    assert not dup, f"{len(dup)} values read twice, first {dup[:5]}"
    lost = [v for v in acked if v not in seen]
    assert not lost, f"{len(lost)} acknowledged messages lost, first {sorted(lost)[:5]}"
    at = {int(m.value()): (m.partition(), m.offset()) for m in messages}
    moved = [v for v, where in acked.items() if at[v] != where]
    assert not moved, f"{len(moved)} messages read elsewhere than acknowledged, first {moved[:5]}"


def test_three_replicas_are_in_sync_and_acks_all_waits_for_them(cluster):
    create_replicated(cluster.bootstrap, "copies", PARTITIONS)
    parts = wait_for("the topic everywhere", lambda: partitions_of(cluster.bootstrap, "copies"))
    for p in parts.values():
        assert sorted(p.replicas) == [1, 2, 3] and sorted(p.isrs) == [1, 2, 3], p
    acked = produce_keyed(cluster.bootstrap, "copies", 0, 20_000)
    assert len(acked) == 20_000
    ends, messages = read_all(cluster.bootstrap, "copies", PARTITIONS)
    assert sum(ends.values()) == 20_000
    check_exactly(acked, messages)
    # Every follower holds the partition's records, as its leader stored them.
    for n in cluster.nodes:
        for p in range(PARTITIONS):
            d = n.data_dir / f"copies-{p}"
            size = sum(f.stat().st_size for f in d.glob("*.log"))
            assert size > 0, f"node {n.node_id} has nothing of copies-{p}"
    logs = {}
    for n in cluster.nodes:
        for p in range(PARTITIONS):
            segs = sorted((n.data_dir / f"copies-{p}").glob("*.log"))
            logs.setdefault(p, []).append([s.name for s in segs])
    for p, names in logs.items():
        assert names[0] == names[1] == names[2], f"copies-{p} rolled differently: {names}"


def test_a_killed_leader_is_replaced_by_an_in_sync_follower_without_losing_anything(cluster):
    create_replicated(cluster.bootstrap, "failover", 1)
    wait_for("the topic", lambda: partitions_of(cluster.bootstrap, "failover"))
    acked = produce_keyed(cluster.bootstrap, "failover", 0, 10_000)
    leader = partitions_of(cluster.bootstrap, "failover")[0].leader
    victim = cluster.node(leader)
    victim.kill()
    others = ",".join(n.bootstrap for n in cluster.nodes if n is not victim)
    new_leader = wait_for("a new leader from the ISR",
                          lambda: (p := partitions_of(others, "failover")) and p[0].leader not in (-1, leader) and p[0].leader)
    assert new_leader != leader
    # Writes go on at the new leader, with two replicas in sync.
    acked.update(produce_keyed(others, "failover", 10_000, 5_000))
    ends, messages = read_all(others, "failover", 1)
    assert ends[("failover", 0)] == 15_000
    check_exactly(acked, messages)
    # The killed node comes back, catches up and rejoins the ISR; it was the preferred
    # replica, so the automatic rebalance gives it the leadership back.
    restart([victim])
    wait_for("the old leader back in the ISR",
             lambda: (p := partitions_of(cluster.bootstrap, "failover")) and sorted(p[0].isrs) == [1, 2, 3], 60)
    assert partitions_of(cluster.bootstrap, "failover")[0].replicas[0] == leader
    wait_for("the preferred replica leading again",
             lambda: partitions_of(cluster.bootstrap, "failover")[0].leader == leader, 4 * REBALANCE_S + 10)
    ends, messages = read_all(cluster.bootstrap, "failover", 1)
    assert ends[("failover", 0)] == 15_000
    check_exactly(acked, messages)


def test_a_stopped_follower_leaves_the_isr_and_rejoins_once_it_caught_up(cluster):
    create_replicated(cluster.bootstrap, "paused", 1, min_isr=2)
    wait_for("the topic", lambda: partitions_of(cluster.bootstrap, "paused"))
    acked = produce_keyed(cluster.bootstrap, "paused", 0, 2_000)
    p = partitions_of(cluster.bootstrap, "paused")[0]
    follower = cluster.node(next(r for r in p.replicas if r != p.leader))
    others = ",".join(n.bootstrap for n in cluster.nodes if n is not follower)
    os.kill(follower.pid, signal.SIGSTOP)
    try:
        # Past replica.lag.time.max.ms (or its broker session) it leaves the ISR; the leader
        # goes on taking acks=all writes with the two replicas left.
        wait_for("the stopped follower out of the ISR",
                 lambda: sorted(partitions_of(others, "paused")[0].isrs) == sorted(
                     r for r in p.replicas if r != follower.node_id), 30)
        acked.update(produce_keyed(others, "paused", 2_000, 3_000))
    finally:
        os.kill(follower.pid, signal.SIGCONT)
    wait_for("the follower back in the ISR",
             lambda: sorted(partitions_of(cluster.bootstrap, "paused")[0].isrs) == [1, 2, 3], 60)
    ends, messages = read_all(cluster.bootstrap, "paused", 1)
    assert ends[("paused", 0)] == 5_000
    check_exactly(acked, messages)


def restart(nodes) -> None:
    """Starts killed nodes again, all before waiting for any: while one is down its
    single-replica partitions (the offsets topic's) have no leader, which a start that waits
    for every partition would wait on."""
    for n in nodes:
        n.start(wait=False)
    for n in nodes:
        n.wait_ready(wait_for_partitions=False)


def find_coordinator(bootstrap: str, group: str) -> int:
    """The node FindCoordinator v4 names for `group`, or -1 with an error (none yet)."""
    pipe = Pipeline(bootstrap)
    try:
        pipe.send(build(FindCoordinatorRequest, 4, key_type=0, coordinator_keys=[group]))
        (r,) = pipe.responses()
    finally:
        pipe.close()
    (c,) = r["coordinators"]
    return c["node_id"] if c["error_code"] == 0 else -1


def raw_produce(bootstrap: str, topic: str, acks: int, values: list[bytes]) -> dict:
    """One Produce v9 with one batch for partition 0 on a fresh connection: the partition's
    answer (error code, base offset)."""
    pipe = Pipeline(bootstrap)
    try:
        pipe.send(build(ProduceRequest, 9, acks=acks, timeout_ms=10_000, topic_data=[{
            "name": topic, "partition_data": [{"index": 0, "records": batch(values)}]}]))
        (r,) = pipe.responses()
    finally:
        pipe.close()
    return r["responses"][0]["partition_responses"][0]


@pytest.fixture(scope="module")
def split_cluster(request):
    """Three controllers and three brokers as separate processes, so that brokers can go down
    while the controller quorum keeps its majority."""
    c = Cluster(3, brokers=3, name="min-isr", extra_args=["--replica-lag-time-max-ms", LAG_MS,
                                                          "--auto-leader-rebalance-enable", "false"])
    yield from running(request, c, "every broker registered and unfenced", lambda: every_broker_registered(c))


@pytest.fixture
def split(split_cluster):
    """The split cluster, whole again after each test: a test that failed with brokers down
    leaves them restarted, so the next test starts from three brokers, not from its failure."""
    yield split_cluster
    down = [n for n in split_cluster.brokers if n.proc is None or n.proc.poll() is not None]
    if down:
        restart(down)


def test_with_two_of_three_replicas_down_acks_all_is_refused_and_nothing_unacknowledged_is_kept(split):
    create_replicated(split.bootstrap, "guarded", 1, min_isr=2)
    wait_for("the topic", lambda: partitions_of(split.bootstrap, "guarded"))
    acked = produce_keyed(split.bootstrap, "guarded", 0, 1_000)
    leader = partitions_of(split.bootstrap, "guarded")[0].leader
    lead = split.node(leader)
    followers = [n for n in split.brokers if n.node_id != leader]
    for n in followers:
        n.kill()
    # Both fenced after their sessions expire: the ISR is the leader alone.
    wait_for("the ISR to shrink to the leader",
             lambda: (p := partitions_of(lead.bootstrap, "guarded")) and p[0].isrs == [leader], 30)
    refused = raw_produce(lead.bootstrap, "guarded", -1, [b"refused"])
    assert refused["error_code"] == 19, refused  # NOT_ENOUGH_REPLICAS
    # acks=1 is appended by the leader alone, but under min.insync.replicas the high watermark
    # stays where it was (KIP-966, as Kafka 4's Partition.maybeIncrementLeaderHW): readers see
    # the acknowledged acks=all records and not the acks=1 one.
    one = raw_produce(lead.bootstrap, "guarded", 1, [b"acks-one"])
    assert one["error_code"] == 0 and one["base_offset"] == 1_000, one
    ends, messages = read_all(lead.bootstrap, "guarded", 1)
    assert ends[("guarded", 0)] == 1_000
    check_exactly(acked, messages)
    # The followers come back, catch up and rejoin; the high watermark moves past the acks=1
    # record and acks=all works again.
    restart(followers)
    wait_for("both followers back in the ISR",
             lambda: (p := partitions_of(lead.bootstrap, "guarded")) and sorted(p[0].isrs) == sorted(
                 n.node_id for n in split.brokers), 60)
    again = raw_produce(lead.bootstrap, "guarded", -1, [b"after"])
    assert again["error_code"] == 0 and again["base_offset"] == 1_001, again
    ends, messages = read_all(lead.bootstrap, "guarded", 1)
    values = [m.value() for m in messages]
    assert b"refused" not in values, "a refused write was kept"
    assert values[-2:] == [b"acks-one", b"after"]


def test_a_returning_leader_truncates_what_it_alone_had_and_takes_the_new_leaders_records(split):
    """The old leader took records with acks=1 that no follower fetched, then died; a follower
    led and took other records at those offsets. Back, the old leader learns from the diverging
    epoch of its fetch where the logs part, truncates there and copies the new leader's records:
    led by it afterwards, the partition holds the new records and none of the lost ones."""
    create_replicated(split.bootstrap, "diverge", 1, min_isr=1)
    wait_for("the topic", lambda: partitions_of(split.bootstrap, "diverge"))
    produce_keyed(split.bootstrap, "diverge", 0, 100)
    old = split.node(partitions_of(split.bootstrap, "diverge")[0].leader)
    followers = [n for n in split.brokers if n is not old]
    wait_for("the ISR of three", lambda: sorted(partitions_of(old.bootstrap, "diverge")[0].isrs) == sorted(
        n.node_id for n in split.brokers))
    for n in followers:
        os.kill(n.pid, signal.SIGSTOP)
    try:
        # The followers' fetches waiting at the leader are answered (empty) within
        # replica.fetch.wait.max.ms; none is in flight when the leader takes these.
        time.sleep(1.0)
        for i in range(5):
            r = raw_produce(old.bootstrap, "diverge", 1, [f"lost-{i}".encode()])
            assert r["error_code"] == 0 and r["base_offset"] == 100 + i, r
        old.kill()
    finally:
        for n in followers:
            os.kill(n.pid, signal.SIGCONT)
    others = ",".join(n.bootstrap for n in followers)
    new_leader = wait_for("a follower to lead",
                          lambda: (p := partitions_of(others, "diverge")) and p[0].leader not in (-1, old.node_id)
                          and p[0].leader)
    new = split.node(new_leader)
    r = raw_produce(new.bootstrap, "diverge", -1, [b"new-leader"])
    assert r["error_code"] == 0 and r["base_offset"] == 100, r
    restart([old])
    wait_for("the old leader back in the ISR",
             lambda: (p := partitions_of(new.bootstrap, "diverge")) and old.node_id in p[0].isrs, 60)
    assert "follower log diverged" in old.current_log(), "the returning leader never truncated"
    # Only the old leader left in the ISR: it leads, and serves what the new leader had.
    for n in followers:
        n.kill()
    wait_for("the old leader to lead again",
             lambda: (p := partitions_of(old.bootstrap, "diverge")) and p[0].leader == old.node_id, 30)
    ends, messages = read_all(old.bootstrap, "diverge", 1)
    values = [m.value() for m in messages]
    assert ends[("diverge", 0)] == 101, ends
    assert values[100] == b"new-leader" and not any(v.startswith(b"lost-") for v in values), values[95:]
    restart(followers)
    wait_for("the ISR of three again", lambda: (p := partitions_of(old.bootstrap, "diverge")) and sorted(
        p[0].isrs) == sorted(n.node_id for n in split.brokers), 60)


def test_preferred_leader_election_on_request_gives_the_leadership_back(split):
    """With the automatic rebalance off, a preferred replica that was killed and came back
    follows until ElectLeaders (what `kafka-leader-election --election-type PREFERRED` sends)
    asks for it; then it leads again with every acknowledged record. Partitions already led by
    their preferred replica need no election, as Kafka answers."""
    from confluent_kafka import ElectionType

    create_replicated(split.bootstrap, "preferred", 1)
    parts = wait_for("the topic", lambda: partitions_of(split.bootstrap, "preferred"))
    preferred = parts[0].replicas[0]
    assert parts[0].leader == preferred
    client = admin(split.bootstrap)
    tp = TopicPartition("preferred", 0)

    def elect() -> KafkaError | None:
        answer = client.elect_leaders(ElectionType.PREFERRED, [tp]).result(timeout=30)
        return answer[tp]

    assert elect().code() == KafkaError.ELECTION_NOT_NEEDED
    acked = produce_keyed(split.bootstrap, "preferred", 0, 1_000)
    victim = split.node(preferred)
    victim.kill()
    others = ",".join(n.bootstrap for n in split.brokers if n is not victim)
    wait_for("another leader", lambda: (p := partitions_of(others, "preferred")) and p[0].leader not in (-1, preferred))
    acked.update(produce_keyed(others, "preferred", 1_000, 1_000))
    restart([victim])
    wait_for("the preferred replica back in the ISR",
             lambda: (p := partitions_of(split.bootstrap, "preferred")) and len(p[0].isrs) == 3, 60)
    time.sleep(1)
    assert partitions_of(split.bootstrap, "preferred")[0].leader != preferred, "moved back without being asked"
    client = admin(split.bootstrap)
    assert elect() is None
    assert partitions_of(split.bootstrap, "preferred")[0].leader == preferred
    assert elect().code() == KafkaError.ELECTION_NOT_NEEDED
    ends, messages = read_all(split.bootstrap, "preferred", 1)
    assert ends[("preferred", 0)] == 2_000
    check_exactly(acked, messages)


def test_a_group_keeps_consuming_with_its_commits_when_its_coordinator_is_killed(cluster):
    """A subscribed consumer commits as it goes; the broker leading its group's
    `__consumer_offsets` partition (its coordinator) is killed with kill -9. Another replica of
    that partition becomes the coordinator with every acknowledged commit, and the consumer
    carries on from them to the end."""
    from confluent_kafka import Consumer
    from confluent_kafka import ConsumerGroupTopicPartitions

    topic, group, total = "grouped", "survivors", 6_000
    create_replicated(cluster.bootstrap, topic, 2)
    wait_for("the topic", lambda: partitions_of(cluster.bootstrap, topic))
    acked = produce_keyed(cluster.bootstrap, topic, 0, total)
    ends = {p: 1 + max(o for q, o in acked.values() if q == p) for p in range(2)}
    everyone = ",".join(n.bootstrap for n in cluster.nodes)
    c = Consumer({"bootstrap.servers": everyone, "group.id": group, "enable.auto.commit": False,
                  "auto.offset.reset": "earliest", "session.timeout.ms": 10_000,
                  "fetch.wait.max.ms": 100, **CLIENT_DEFAULTS})
    seen: collections.Counter = collections.Counter()
    committed: dict[int, int] = {}

    def consume_until(done, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        since_commit = 0
        while not done():
            assert time.monotonic() < deadline, f"consumed {len(seen)} of {total}"
            m = c.poll(0.5)
            if m is None or m.error():
                continue
            seen[int(m.value())] += 1
            since_commit += 1
            if since_commit >= 200:
                try:
                    for tp in c.commit(asynchronous=False):
                        if tp.offset >= 0:  # a partition with nothing consumed yet has none
                            committed[tp.partition] = tp.offset
                except KafkaException:
                    pass  # retriable while the coordinator moves; the next commit covers it
                since_commit = 0

    c.subscribe([topic])
    try:
        consume_until(lambda: len(seen) >= total // 2, 90)
        before = dict(committed)
        assert sum(before.values()) >= total // 2 - 200, before
        coordinator = find_coordinator(cluster.nodes[0].bootstrap, group)
        victim = cluster.node(coordinator)
        victim.kill()
        survivor = next(n for n in cluster.nodes if n is not victim)

        # Asked with a raw FindCoordinator: librdkafka's DescribeGroups can abort the process
        # when a request to a dead coordinator times out (librdkafka issue 4605).
        def moved():
            try:
                now = find_coordinator(survivor.bootstrap, group)
            except (OSError, AssertionError):
                return None
            return now not in (-1, coordinator) and now

        wait_for("another coordinator for the group", moved, 60)
        others = ",".join(n.bootstrap for n in cluster.nodes if n is not victim)
        # An admin client must outlive its futures: one dropped at once never answers.
        client = admin(others)
        offsets = client.list_consumer_group_offsets(
            [ConsumerGroupTopicPartitions(group)], request_timeout=15)[group].result(timeout=30)
        after = {tp.partition: tp.offset for tp in offsets.topic_partitions}
        assert all(after.get(p, -1) >= o for p, o in before.items()), (before, after)
        consume_until(lambda: len(seen) >= total, 120)
        # The end, committed as offsets: a member the new coordinator does not know joins again
        # and restarts from the group's commits, so its positions can trail records it has
        # read. A commit during that rebalance fails; the next poll completes the rebalance.
        deadline = time.monotonic() + 60
        while True:
            try:
                c.commit(offsets=[TopicPartition(topic, p, o) for p, o in ends.items()],
                         asynchronous=False)
                break
            except KafkaException as e:
                assert e.args[0].retriable() or e.args[0].code() in (
                    KafkaError.REBALANCE_IN_PROGRESS, KafkaError.ILLEGAL_GENERATION,
                    KafkaError.UNKNOWN_MEMBER_ID), e
                assert time.monotonic() < deadline, e
                c.poll(0.5)
    finally:
        c.close()
    assert sorted(seen) == list(range(total))
    stored, _ = read_all(others, topic, 2)
    assert {p: stored[(topic, p)] for p in range(2)} == ends
    offsets = client.list_consumer_group_offsets(
        [ConsumerGroupTopicPartitions(group)], request_timeout=15)[group].result(timeout=30)
    assert {tp.partition: tp.offset for tp in offsets.topic_partitions} == ends
    restart([victim])
    wait_for("the killed broker registered again",
             lambda: "broker state changed fenced=false" in victim.current_log(), 60)


def test_an_idempotent_producer_keeps_exactly_once_while_its_leader_is_killed_three_times(cluster):
    """100,000 keyed, zstd-compressed messages from an idempotent acks=all producer while the
    leader of their partitions is killed with kill -9 three times at random moments and comes
    back each time:
    every acknowledged message is read back exactly once, at its acknowledged offset, in
    produce order per partition, and the killed brokers rejoin the ISR."""
    import random
    import threading

    create_replicated(cluster.bootstrap, "under-fire", 2, min_isr=2)
    wait_for("the topic", lambda: partitions_of(cluster.bootstrap, "under-fire"))
    rng = random.Random(14)
    total = 100_000
    p = Producer({"bootstrap.servers": cluster.bootstrap, "acks": "all", "enable.idempotence": True,
                  "compression.type": "zstd", "linger.ms": 5, "message.timeout.ms": 120_000, **CLIENT_DEFAULTS})
    acked: dict[int, tuple[int, int]] = {}
    failures = []
    sent = [0]

    def report(err, msg):
        if err is not None:
            failures.append(err)
        else:
            acked[int(msg.value())] = (msg.partition(), msg.offset())

    def produce():
        for i in range(total):
            while True:
                try:
                    p.produce("under-fire", key=f"k{i % 101}", value=str(i), on_delivery=report)
                    break
                except BufferError:
                    p.poll(0.05)
            sent[0] = i + 1
            if i % 100 == 0:
                p.poll(0)
                time.sleep(0.01)
        p.flush(180)

    t = threading.Thread(target=produce)
    t.start()
    try:
        kill_leaders(cluster, "under-fire", rng, 3)
    finally:
        t.join(240)
    assert not t.is_alive(), "the producer did not finish"
    assert not failures, f"{len(failures)} deliveries failed, first {failures[:5]}"
    check_in_order_exactly_once(cluster, "under-fire", 2, acked, total)


def kill_leaders(cluster, topic: str, rng, times: int) -> None:
    """Kills a leader of `topic` with kill -9 `times` times at random moments, each brought
    back, registered again and back in every ISR before the next kill."""
    for _ in range(times):
        time.sleep(rng.uniform(0.5, 2.0))
        leaders = {pp.leader for pp in partitions_of(cluster.bootstrap, topic).values()}
        victim = cluster.node(rng.choice(sorted(x for x in leaders if x > 0)))
        victim.kill()
        time.sleep(rng.uniform(0.5, 1.5))
        restart([victim])
        # Registered again (its old incarnation's session over, its leaderships moved),
        # caught up and back in the ISR before the next kill.
        wait_for("the killed broker registered again",
                 lambda: "broker state changed fenced=false" in victim.current_log(), 60)
        wait_for("the killed broker back in every ISR",
                 lambda: all(victim.node_id in pp.isrs for pp in partitions_of(cluster.bootstrap, topic).values()), 60)


def check_in_order_exactly_once(cluster, topic: str, partitions: int, acked, total: int) -> None:
    assert len(acked) == total, f"{total - len(acked)} messages unacknowledged"
    ends, messages = read_all(cluster.bootstrap, topic, partitions)
    check_exactly(acked, messages)
    assert sum(ends.values()) == total, f"{sum(ends.values())} records in the log for {total} sent"
    last = {}
    for m in messages:
        v = int(m.value())
        assert last.get(m.partition(), -1) < v, f"partition {m.partition()} out of produce order at {v}"
        last[m.partition()] = v


def test_the_java_clients_idempotent_producer_keeps_exactly_once_while_its_leader_is_killed(cluster):
    """The same with Apache Kafka's Java client (its idempotent producer, lz4-compressed
    batches), run from tests/java/src/sluice/KeyedProducer.java with Java's source launcher."""
    import random
    import subprocess

    from reference import DEPS, ensure_jars

    ensure_jars()
    create_replicated(cluster.bootstrap, "under-java-fire", 2, min_isr=2)
    wait_for("the topic", lambda: partitions_of(cluster.bootstrap, "under-java-fire"))
    total = 100_000
    source = Path(__file__).resolve().parents[1] / "java" / "src" / "sluice" / "KeyedProducer.java"
    out_path = cluster.nodes[0].root / "java-producer.out"
    with open(out_path, "w") as out, open(cluster.nodes[0].root / "java-producer.err", "w") as err:
        proc = subprocess.Popen(["java", "-Dorg.slf4j.simpleLogger.defaultLogLevel=warn", "-cp", f"{DEPS}/*",
                                 str(source), cluster.bootstrap, "under-java-fire", "0", str(total), "lz4"],
                                stdout=out, stderr=err, stdin=subprocess.DEVNULL)
        try:
            # The JVM compiles the source and connects first: start killing once it acks.
            wait_for("the Java producer's first acknowledgements",
                     lambda: out_path.stat().st_size > 0 or proc.poll() is not None, 60)
            kill_leaders(cluster, "under-java-fire", random.Random(15), 3)
            proc.wait(240)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    lines = out_path.read_text().splitlines()
    failures = [line for line in lines if line.startswith("fail ")]
    assert not failures, f"{len(failures)} deliveries failed, first {failures[:5]}"
    assert proc.returncode == 0 and lines and lines[-1] == "done", (proc.returncode, lines[-3:])
    acked = {}
    for line in lines:
        if line.startswith("ack "):
            _, value, partition, offset = line.split()
            acked[int(value)] = (int(partition), int(offset))
    check_in_order_exactly_once(cluster, "under-java-fire", 2, acked, total)
