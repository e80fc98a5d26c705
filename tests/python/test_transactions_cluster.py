"""Transactions on a three-node cluster: `__transaction_state` is replicated (three replicas,
min ISR two), and the partitions of a transaction are led by different brokers, so the
coordinator writes some markers itself and sends the others to their leaders with
WriteTxnMarkers. A read_committed consumer sees exactly the committed records."""

from __future__ import annotations

import uuid

import pytest
from confluent_kafka.admin import NewTopic

from cluster import Cluster, running
from harness import START_TIMEOUT_S, admin
from test_transactions import PARTITIONS, all_partitions, produce_txn, read_values, reader, txn_producer


@pytest.fixture(scope="module")
def cluster(request):
    c = Cluster(3, name="txn")
    yield from running(request, c, "every broker to be registered",
                       lambda: len(admin(c.bootstrap).list_topics(timeout=5).brokers) == 3, START_TIMEOUT_S)


def test_transactions_across_brokers(cluster):
    bootstrap = cluster.bootstrap
    topic = f"txn-{uuid.uuid4().hex[:8]}"
    client = admin(bootstrap)
    futures = client.create_topics([NewTopic(topic, num_partitions=PARTITIONS, replication_factor=3)],
                                   operation_timeout=10, request_timeout=15)
    futures[topic].result(timeout=20)
    md = client.list_topics(topic=topic, timeout=10)
    leaders = {p.leader for p in md.topics[topic].partitions.values()}
    assert len(leaders) > 1, f"the partitions should be led by different brokers: {leaders}"

    p = txn_producer(bootstrap, "txn-cluster")
    p.init_transactions(60)
    p.begin_transaction()
    committed = produce_txn(p, [topic], "committed")
    p.commit_transaction(60)
    p.begin_transaction()
    aborted = produce_txn(p, [topic], "aborted")
    p.flush(30)
    p.abort_transaction(60)
    p.begin_transaction()
    committed += produce_txn(p, [topic], "again")
    p.commit_transaction(60)

    c = reader(bootstrap, "read_committed", all_partitions([topic]))
    try:
        got = read_values(c, len(committed), timeout=30)
    finally:
        c.close()
    assert sorted(got) == sorted(committed)
    assert not set(got) & set(aborted)


def test_the_java_client_ends_transactions_back_to_back(cluster):
    """Ten transactions of Apache Kafka's Java client (transaction version 2), ended back to back
    without a flush, every third aborted: each next transaction starts while the previous end's
    markers are still being written, which must be retried (CONCURRENT_TRANSACTIONS), never
    fenced; a read_committed consumer then reads exactly the seven committed records."""
    import subprocess

    from reference import DEPS, ensure_jars

    ensure_jars()
    bootstrap = cluster.bootstrap
    topic = f"b2b-{uuid.uuid4().hex[:8]}"
    client = admin(bootstrap)
    client.create_topics([NewTopic(topic, num_partitions=1, replication_factor=3)],
                         operation_timeout=10, request_timeout=15)[topic].result(timeout=20)
    source = DEPS.parent.parent / "tests" / "java" / "src" / "sluice" / "BackToBackTxn.java"
    done = subprocess.run(["java", "-XX:TieredStopAtLevel=1", "-Xmx256m",
                           "-Dorg.slf4j.simpleLogger.defaultLogLevel=warn", "-cp", f"{DEPS}/*", str(source),
                           bootstrap, topic, f"b2b-{topic}"], capture_output=True, text=True, timeout=180)
    assert done.returncode == 0, f"{done.stdout}\n{done.stderr[-3000:]}"
    committed = [f"txn-{i}" for i in range(10) if i % 3 != 1]
    assert done.stdout.strip().splitlines()[-1] == "PASS " + ",".join(committed), done.stdout
