"""Transactions end to end with librdkafka's transactional producer (KIP-98): the transaction
coordinator on `__transaction_state` (InitProducerId with a transactional id,
AddPartitionsToTxn, EndTxn), its markers, and read_committed consumers reading the result.

- commits and aborts over two topics of three partitions: read_committed sees exactly the
  committed records, once; read_uncommitted sees every record;
- zombie fencing: a second producer with the same transactional.id fences the first, whose
  commit then fails with a fatal fencing error;
- a transaction left open past its `transaction.timeout.ms` is aborted by the coordinator, and
  the last stable offset moves past it;
- a restart (SIGTERM) with a committed and an open transaction: the coordinator reloads from
  `__transaction_state`, the committed records stay visible and the open one is aborted by its
  timeout.
"""

from __future__ import annotations

import time
import uuid

import pytest
from confluent_kafka import OFFSET_BEGINNING, KafkaError, KafkaException, TopicPartition

from harness import consumer, create_topic, producer

# Coordinators look for timed-out transactions twice a second, so the timeout tests take seconds.
BROKER_ARGS = ["--transaction-abort-timed-out-transaction-cleanup-interval-ms", "500"]

PARTITIONS = 3
TXN_TIMEOUT_MS_SHORT = 3000


def txn_producer(bootstrap: str, transactional_id: str, **extra):
    config = {
        "transactional.id": transactional_id,
        "enable.idempotence": True,
        "linger.ms": 5,
        **extra,
    }
    return producer(bootstrap, **config)


def reader(bootstrap: str, isolation: str, tps: list[tuple[str, int]]):
    c = consumer(bootstrap, **{"isolation.level": isolation})
    c.assign([TopicPartition(t, p, OFFSET_BEGINNING) for t, p in tps])
    return c


def read_values(c, expected: int, timeout: float = 20.0, settle: float = 1.0) -> list[bytes]:
    """Reads until `expected` records arrived, then `settle` seconds more (so that extra records
    would be seen); fails on a consumer error or when time runs out."""
    out = []
    deadline = time.monotonic() + timeout
    settle_until = None
    while True:
        now = time.monotonic()
        if len(out) >= expected and settle_until is None:
            settle_until = now + settle
        if settle_until is not None and now > settle_until:
            return out
        assert now < deadline, f"timed out with {len(out)} of {expected} records"
        for m in c.consume(num_messages=1000, timeout=0.2):
            err = m.error()
            if err is not None:
                if err.code() == KafkaError._PARTITION_EOF:
                    continue
                raise AssertionError(f"consumer error: {err}")
            out.append(m.value())


def produce_txn(p, topics: list[str], tag: str, per_partition: int = 5) -> list[bytes]:
    values = []
    for t in topics:
        for part in range(PARTITIONS):
            for i in range(per_partition):
                v = f"{tag}-{t}-{part}-{i}".encode()
                p.produce(t, value=v, partition=part)
                values.append(v)
    return values


def topics_for(bootstrap: str, count: int) -> list[str]:
    names = [f"txn-{uuid.uuid4().hex[:8]}" for _ in range(count)]
    for name in names:
        create_topic(bootstrap, name, PARTITIONS)
    return names


def all_partitions(topics: list[str]) -> list[tuple[str, int]]:
    return [(t, p) for t in topics for p in range(PARTITIONS)]


def test_commit_and_abort_read_committed(fresh_broker):
    bootstrap = fresh_broker.bootstrap
    topics = topics_for(bootstrap, 2)
    p = txn_producer(bootstrap, "txn-commit-abort")
    p.init_transactions(30)

    p.begin_transaction()
    committed = produce_txn(p, topics, "first")
    p.commit_transaction(30)

    p.begin_transaction()
    aborted = produce_txn(p, topics, "aborted")
    p.flush(30)
    p.abort_transaction(30)

    p.begin_transaction()
    committed += produce_txn(p, topics, "second")
    p.commit_transaction(30)

    c = reader(bootstrap, "read_committed", all_partitions(topics))
    try:
        got = read_values(c, len(committed))
    finally:
        c.close()
    assert sorted(got) == sorted(committed), "read_committed must see each committed record once"

    c = reader(bootstrap, "read_uncommitted", all_partitions(topics))
    try:
        got = read_values(c, len(committed) + len(aborted))
    finally:
        c.close()
    assert sorted(got) == sorted(committed + aborted)


def test_second_producer_fences_the_first(fresh_broker):
    bootstrap = fresh_broker.bootstrap
    (topic,) = topics_for(bootstrap, 1)
    first = txn_producer(bootstrap, "txn-zombie")
    first.init_transactions(30)
    first.begin_transaction()
    zombie = produce_txn(first, [topic], "zombie", per_partition=2)
    first.flush(30)

    second = txn_producer(bootstrap, "txn-zombie")
    second.init_transactions(30)

    with pytest.raises(KafkaException) as raised:
        first.produce(topic, value=b"after-fencing", partition=0)
        first.commit_transaction(30)
    err = raised.value.args[0]
    assert err.code() in (KafkaError._FENCED, KafkaError.PRODUCER_FENCED, KafkaError.INVALID_PRODUCER_EPOCH), err
    assert err.fatal(), err

    second.begin_transaction()
    good = produce_txn(second, [topic], "good", per_partition=2)
    second.commit_transaction(30)

    c = reader(bootstrap, "read_committed", all_partitions([topic]))
    try:
        got = read_values(c, len(good))
    finally:
        c.close()
    assert sorted(got) == sorted(good)
    assert not set(got) & set(zombie + [b"after-fencing"])


def open_transaction(bootstrap: str, topic: str, transactional_id: str):
    p = txn_producer(
        bootstrap,
        transactional_id,
        **{"transaction.timeout.ms": TXN_TIMEOUT_MS_SHORT, "message.timeout.ms": TXN_TIMEOUT_MS_SHORT},
    )
    p.init_transactions(30)
    p.begin_transaction()
    values = produce_txn(p, [topic], "open", per_partition=2)
    p.flush(30)
    return p, values


def test_timed_out_transaction_is_aborted(fresh_broker):
    bootstrap = fresh_broker.bootstrap
    (topic,) = topics_for(bootstrap, 1)
    started = time.monotonic()
    _open_producer, opened = open_transaction(bootstrap, topic, "txn-left-open")

    later = txn_producer(bootstrap, "txn-later")
    later.init_transactions(30)
    later.begin_transaction()
    after = produce_txn(later, [topic], "after", per_partition=2)
    later.commit_transaction(30)

    # The open transaction holds the last stable offset below the committed one until the
    # coordinator aborts it.
    c = reader(bootstrap, "read_committed", all_partitions([topic]))
    try:
        got = read_values(c, len(after), timeout=20)
    finally:
        c.close()
    assert sorted(got) == sorted(after)
    assert time.monotonic() - started >= TXN_TIMEOUT_MS_SHORT / 1000 * 0.9


def test_restart_reloads_the_coordinator(fresh_broker):
    bootstrap = fresh_broker.bootstrap
    (topic,) = topics_for(bootstrap, 1)
    p = txn_producer(bootstrap, "txn-before-restart")
    p.init_transactions(30)
    p.begin_transaction()
    committed = produce_txn(p, [topic], "committed", per_partition=3)
    p.commit_transaction(30)
    p = None

    open_producer, opened = open_transaction(bootstrap, topic, "txn-open-at-restart")
    open_producer = None

    fresh_broker.restart()
    bootstrap = fresh_broker.bootstrap

    c = reader(bootstrap, "read_committed", all_partitions([topic]))
    try:
        got = read_values(c, len(committed), timeout=30)
    finally:
        c.close()
    assert sorted(got) == sorted(committed)

    # The reloaded coordinator aborts the open transaction at its timeout: a transaction
    # committed after it becomes visible to read_committed.
    later = txn_producer(bootstrap, "txn-after-restart")
    later.init_transactions(30)
    later.begin_transaction()
    after = produce_txn(later, [topic], "after", per_partition=2)
    later.commit_transaction(30)
    c = reader(bootstrap, "read_committed", all_partitions([topic]))
    try:
        got = read_values(c, len(committed) + len(after), timeout=30)
    finally:
        c.close()
    assert sorted(got) == sorted(committed + after)
    assert not set(got) & set(opened)
