"""Network partitions between real processes (root; tests/python/netns.py): three combined
nodes, each in a network namespace of its own, the clients in a fourth. The leader of a
partition with three replicas (`min.insync.replicas` 2) is cut off from the other two nodes
(and so from the controller quorum's majority) while clients still reach it: an acks=all
produce sent to it is never acknowledged; the majority side fences it and elects a new leader,
which takes acknowledged writes; once the network heals, the old leader truncates what it alone
took, follows, rejoins the ISR and, leading again, serves exactly the acknowledged messages."""

from __future__ import annotations

import pytest

from kafka.protocol.metadata.metadata import MetadataRequest

from cluster import Cluster, running, wait_for
from netns import Network
from test_replication import (check_exactly, create_replicated, every_broker_registered, partitions_of, produce_keyed,
                              raw_produce, read_all)
from wire import Pipeline, build

REBALANCE_S = 3


def state_at(node, topic: str) -> tuple[int, list[int]]:
    """(leader, sorted ISR) of partition 0 as `node` itself answers Metadata: an admin client
    would ask whichever broker it likes, a stale one included."""
    pipe = Pipeline(node.bootstrap)
    try:
        pipe.send(build(MetadataRequest, 9, topics=[{"name": topic}], allow_auto_topic_creation=False,
                        include_cluster_authorized_operations=False, include_topic_authorized_operations=False))
        (md,) = pipe.responses()
    finally:
        pipe.close()
    (t,) = md["topics"]
    (p,) = [p for p in t["partitions"] if p["partition_index"] == 0]
    return p["leader_id"], sorted(p["isr_nodes"])


@pytest.fixture(scope="module")
def net():
    n = Network(3)
    n.create()
    n.enter_clients()
    try:
        yield n
    finally:
        n.leave_clients()
        n.destroy()


@pytest.fixture(scope="module")
def cluster(request, net):
    c = Cluster(3, name="partition", place=net.place, extra_args=[
        "--replica-lag-time-max-ms", 3000, "--leader-imbalance-check-interval-seconds", REBALANCE_S])
    yield from running(request, c, "every broker registered and unfenced", lambda: every_broker_registered(c))


def test_a_leader_cut_off_from_the_majority_acknowledges_nothing_and_truncates_after_healing(cluster, net):
    create_replicated(cluster.bootstrap, "cut", 1, min_isr=2)
    wait_for("the topic", lambda: partitions_of(cluster.bootstrap, "cut"))
    acked = produce_keyed(cluster.bootstrap, "cut", 0, 2_000, **{"compression.type": "gzip"})
    before = partitions_of(cluster.bootstrap, "cut")[0]
    leader = before.leader
    assert before.replicas[0] == leader, "a new partition is led by its preferred replica"
    others = [n.node_id for n in cluster.nodes if n.node_id != leader]
    majority = ",".join(cluster.node(i).bootstrap for i in others)

    net.cut(leader, others)
    try:
        # The old leader cannot get its followers' fetches nor the controller's consent to a
        # smaller ISR: an acks=all write sent straight to it is refused or times out.
        answer = raw_produce(cluster.node(leader).bootstrap, "cut", -1, [b"never-acknowledged"])
        assert answer["error_code"] != 0, answer
        new_leader = wait_for("a new leader on the majority side", lambda: (
            (p := partitions_of(majority, "cut")) and p[0].leader in others and p[0].leader), 60)
        after = partitions_of(majority, "cut")[0]
        assert leader not in after.isrs, after.isrs
        # The majority goes on taking acknowledged writes.
        acked.update(produce_keyed(majority, "cut", 2_000, 2_000, **{"compression.type": "snappy"}))
    finally:
        net.heal()

    # Right after healing, the old leader's own metadata is still what it was before the cut
    # (itself leading, three in sync) until it catches up: each node is asked for its own view.
    wait_for("the old leader back in the ISR, as every node sees it",
             lambda: all(state_at(n, "cut")[1] == [1, 2, 3] for n in cluster.nodes), 90)
    assert new_leader != leader
    # It was the preferred replica: the automatic rebalance makes it lead again, and what it
    # serves is the new leader's log, not what it took while cut off.
    wait_for("the old leader leading again, as every node sees it",
             lambda: all(state_at(n, "cut") == (leader, [1, 2, 3]) for n in cluster.nodes), 4 * REBALANCE_S + 30)
    ends, messages = read_all(cluster.bootstrap, "cut", 1)
    assert ends[("cut", 0)] == 4_000
    check_exactly(acked, messages)
    assert not any(m.value() == b"never-acknowledged" for m in messages)
    assert "follower log diverged from its leader's; truncating" in cluster.node(leader).log_text()
