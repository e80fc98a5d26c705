"""The transaction coordinator stopped (SIGTERM) or killed (SIGKILL) in each state a transaction
can be in when it goes: Ongoing, PrepareCommit and PrepareAbort. Three controllers and three
brokers; `__transaction_state` has three replicas, so the coordinator moves to another broker,
which loads the transaction from the log, and the transaction ends as Kafka's would:

- Ongoing: the producer's commit, retried at the new coordinator, commits the transaction;
- PrepareCommit / PrepareAbort: the data partition's only replica is stopped (SIGSTOP) before
  EndTxn, so the old coordinator cannot write its markers; once it is gone, the new coordinator
  writes them when that broker is back, and read_committed sees the committed records exactly
  once (or nothing of the aborted ones), while read_uncommitted sees them all.

Afterwards the transactional id works again: a new producer with it initializes and commits.
"""

from __future__ import annotations

import os
import signal
import time
import uuid

import pytest
from confluent_kafka import TopicPartition
from confluent_kafka.admin import NewTopic

from cluster import Cluster, running, wait_for
from harness import START_TIMEOUT_S, admin
from test_transactions import read_values, reader, txn_producer

TXN_STATE = "__transaction_state"
TXN_STATE_PARTITIONS = 50
RECORDS = 20


@pytest.fixture(scope="module")
def cluster(request):
    # A follower that stops fetching leaves the ISR after 2 s, so that `__transaction_state`
    # appends go on without a stopped broker.
    c = Cluster(3, brokers=3, name="txnfault", extra_args=["--replica-lag-time-max-ms", "2000"])
    yield from running(request, c, "every broker to be registered",
                       lambda: len(admin(c.bootstrap).list_topics(timeout=5).brokers) == 3, START_TIMEOUT_S)


def java_hash(s: str) -> int:
    h = 0
    for ch in s:
        h = (31 * h + ord(ch)) & 0xFFFFFFFF
    return h - (1 << 32) if h >= 1 << 31 else h


def coordinator_of(bootstrap: str, transactional_id: str) -> int:
    """The broker leading the id's `__transaction_state` partition (Kafka's placement)."""
    h = java_hash(transactional_id)
    partition = (0 if h == -(1 << 31) else abs(h)) % TXN_STATE_PARTITIONS
    md = admin(bootstrap).list_topics(topic=TXN_STATE, timeout=10)
    return md.topics[TXN_STATE].partitions[partition].leader


def topic_on(bootstrap: str, broker: int) -> str:
    """A one-partition topic whose only replica is on `broker`."""
    name = f"txnfault-{uuid.uuid4().hex[:8]}"
    client = admin(bootstrap)
    client.create_topics([NewTopic(name, num_partitions=1, replica_assignment=[[broker]])], request_timeout=15)[name].result(timeout=20)
    wait_for(f"{name} to have a leader",
             lambda: client.list_topics(topic=name, timeout=5).topics[name].partitions[0].leader == broker)
    return name


def live_bootstrap(cluster: Cluster, *down) -> str:
    return ",".join(n.bootstrap for n in cluster.brokers if n.node_id not in down)


def produce_some(p, topic: str, tag: str) -> list[bytes]:
    values = [f"{tag}-{i}".encode() for i in range(RECORDS)]
    for v in values:
        p.produce(topic, value=v, partition=0)
    assert p.flush(30) == 0
    return values


def stop_node(node, sig: int) -> None:
    if sig == signal.SIGKILL:
        node.kill()
    else:
        node.stop(sig)


def check_outcome(bootstrap: str, topic: str, committed: list[bytes], written: list[bytes]) -> None:
    c = reader(bootstrap, "read_committed", [(topic, 0)])
    try:
        got = read_values(c, len(committed), timeout=60, settle=1.5)
    finally:
        c.close()
    assert sorted(got) == sorted(committed), f"read_committed saw {len(got)} records, {len(committed)} expected"
    c = reader(bootstrap, "read_uncommitted", [(topic, 0)])
    try:
        got = read_values(c, len(written), timeout=30)
    finally:
        c.close()
    assert sorted(got) == sorted(written)


def reuse_id(bootstrap: str, transactional_id: str, topic: str) -> list[bytes]:
    """A new producer with the id: it fences the old one, and its own transaction commits."""
    p = txn_producer(bootstrap, transactional_id)
    p.init_transactions(60)
    p.begin_transaction()
    values = produce_some(p, topic, "reuse")
    p.commit_transaction(60)
    return values


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGKILL], ids=["sigterm", "sigkill"])
def test_coordinator_gone_with_an_ongoing_transaction(cluster, sig):
    bootstrap = cluster.bootstrap
    transactional_id = f"ongoing-{uuid.uuid4().hex[:8]}"
    p = txn_producer(bootstrap, transactional_id, **{"transaction.timeout.ms": 60000})
    p.init_transactions(60)
    a = coordinator_of(bootstrap, transactional_id)
    b = next(n.node_id for n in cluster.brokers if n.node_id != a)
    topic = topic_on(bootstrap, b)
    p.begin_transaction()
    values = produce_some(p, topic, "ongoing")

    node_a = cluster.node(a)
    stop_node(node_a, sig)
    wait_for("the coordinator to move",
             lambda: coordinator_of(live_bootstrap(cluster, a), transactional_id) not in (a, -1), timeout=30)
    # The new coordinator loaded the transaction as Ongoing, with its partition: the commit,
    # retried there, commits it.
    p.commit_transaction(60)
    node_a.start()
    check_outcome(bootstrap, topic, values, values)
    values += reuse_id(bootstrap, transactional_id, topic)
    check_outcome(bootstrap, topic, values, values)


@pytest.mark.parametrize("commit", [True, False], ids=["prepare-commit", "prepare-abort"])
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGKILL], ids=["sigterm", "sigkill"])
def test_coordinator_gone_with_markers_pending(cluster, sig, commit):
    bootstrap = cluster.bootstrap
    transactional_id = f"prepare-{uuid.uuid4().hex[:8]}"
    p = txn_producer(bootstrap, transactional_id)
    p.init_transactions(60)
    a = coordinator_of(bootstrap, transactional_id)
    b = next(n.node_id for n in cluster.brokers if n.node_id != a)
    topic = topic_on(bootstrap, b)
    p.begin_transaction()
    values = produce_some(p, topic, "pending")

    node_a, node_b = cluster.node(a), cluster.node(b)
    os.kill(node_b.pid, signal.SIGSTOP)
    try:
        # EndTxn is answered once PrepareCommit/PrepareAbort is in `__transaction_state` (after
        # the stopped broker left its ISR); the marker for the topic cannot be written.
        if commit:
            p.commit_transaction(60)
        else:
            p.abort_transaction(60)
        stop_node(node_a, sig)
        wait_for("the coordinator to move",
                 lambda: coordinator_of(live_bootstrap(cluster, a, b), transactional_id) not in (a, b, -1), timeout=30)
        # The new coordinator has the transaction in Prepare*: it must finish it, not restart it.
        time.sleep(1)
    finally:
        os.kill(node_b.pid, signal.SIGCONT)
    node_a.start()
    check_outcome(bootstrap, topic, values if commit else [], values)
    again = reuse_id(bootstrap, transactional_id, topic)
    check_outcome(bootstrap, topic, (values if commit else []) + again, values + again)
