"""Exactly-once consume-transform-produce: a consumer group's offsets sent in the producer's
transaction (AddOffsetsToTxn, then TxnOffsetCommit to the group coordinator), applied by the
transaction's commit marker on `__consumer_offsets` and dropped by its abort marker.

- librdkafka (confluent-kafka) and kafka-python each run the loop over an input topic, aborting
  every third transaction on purpose and rewinding to the committed offsets: a read_committed
  reader sees each input's output exactly once, a read_uncommitted reader also sees the aborted
  outputs, and the group's committed offsets end at the input's end offsets;
- offsets sent in an open transaction are not committed: OffsetFetch with `require_stable`
  (KIP-447) answers UNSTABLE_OFFSET_COMMIT for them, the commit marker makes them the group's
  offsets, an abort marker leaves the old ones;
- each client's loop as its own process (eos_app.py) over 20,000 records, killed with SIGKILL
  twice mid-run and started again, and the broker killed with SIGKILL once: read_committed
  still sees each output exactly once and the offsets reach the input's end;
- a SIGKILL with one transaction's offsets committed and another's still open: after the
  restart the group coordinator replays both from its log, the committed offsets stand, and the
  open transaction's offsets are dropped when its timeout aborts it.
"""

from __future__ import annotations

import random
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest
from confluent_kafka import OFFSET_BEGINNING, ConsumerGroupTopicPartitions, KafkaError, KafkaException, TopicPartition

from harness import admin, consumer, create_topic, produce_all, producer

# Coordinators look for timed-out transactions twice a second, so the timeout test takes seconds.
BROKER_ARGS = ["--transaction-abort-timed-out-transaction-cleanup-interval-ms", "500"]

PARTITIONS = 3
INPUTS = 3000
ABORT_EVERY = 3
TXN_TIMEOUT_MS_SHORT = 8000


def names(prefix: str) -> tuple[str, str, str]:
    tag = uuid.uuid4().hex[:8]
    return f"{prefix}-in-{tag}", f"{prefix}-out-{tag}", f"{prefix}-group-{tag}"


def fill_input(bootstrap: str, topic: str, count: int = INPUTS) -> None:
    create_topic(bootstrap, topic, PARTITIONS)
    p = producer(bootstrap, **{"enable.idempotence": True})
    reports = produce_all(p, topic, [{"key": b"k%d" % i, "value": b"in-%d" % i} for i in range(count)])
    assert all(r.error is None for r in reports)


def read_all(bootstrap: str, topic: str, isolation: str, expected: int, timeout: float = 30.0) -> list[bytes]:
    """Every value of `topic` as a consumer at `isolation` sees it: reads until `expected` arrived
    and a second more (so extra records would show), failing on an error or when time runs out."""
    c = consumer(bootstrap, **{"isolation.level": isolation, "enable.partition.eof": False})
    c.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in range(PARTITIONS)])
    out: list[bytes] = []
    deadline = time.monotonic() + timeout
    settle_until = None
    try:
        while True:
            now = time.monotonic()
            if len(out) >= expected and settle_until is None:
                settle_until = now + 1.0
            if settle_until is not None and now > settle_until:
                return out
            assert now < deadline, f"{topic} ({isolation}): timed out with {len(out)} of {expected} records"
            for m in c.consume(num_messages=1000, timeout=0.2):
                assert m.error() is None, m.error()
                out.append(m.value())
    finally:
        c.close()


def committed_offsets(bootstrap: str, group: str, topic: str, require_stable: bool = True) -> dict[int, object]:
    """The group's committed offset per partition (an int), or the partition's error."""
    request = ConsumerGroupTopicPartitions(group, [TopicPartition(topic, p) for p in range(PARTITIONS)])
    client = admin(bootstrap)  # kept until the answer: a destroyed client fails its futures
    futures = client.list_consumer_group_offsets([request], require_stable=require_stable, request_timeout=10)
    try:
        result = futures[group].result(timeout=15)
    except KafkaException as e:
        return {p: e.args[0].code() for p in range(PARTITIONS)}
    return {tp.partition: (tp.error.code() if tp.error else tp.offset) for tp in result.topic_partitions}


def wait_committed(bootstrap: str, group: str, topic: str, want: dict[int, int], timeout: float = 30.0) -> dict:
    deadline = time.monotonic() + timeout
    while True:
        got = committed_offsets(bootstrap, group, topic)
        if all(got.get(p) == o for p, o in want.items()) or time.monotonic() > deadline:
            return got
        time.sleep(0.2)


def end_offsets(bootstrap: str, topic: str) -> dict[int, int]:
    c = consumer(bootstrap)
    try:
        return {p: c.get_watermark_offsets(TopicPartition(topic, p), timeout=10, cached=False)[1] for p in range(PARTITIONS)}
    finally:
        c.close()


def check_outputs(bootstrap: str, in_topic: str, out_topic: str, group: str, total: int, aborted: int) -> None:
    want = sorted(b"out-%d" % i for i in range(total))
    got = read_all(bootstrap, out_topic, "read_committed", total)
    assert sorted(got) == want, (
        f"read_committed must see each input's output exactly once: {len(got)} records, "
        f"{len(set(got))} distinct, {len(set(want) - set(got))} missing"
    )
    assert aborted > 0, "the loop aborts transactions on purpose"
    uncommitted = read_all(bootstrap, out_topic, "read_uncommitted", total + aborted)
    assert len(uncommitted) == total + aborted, (len(uncommitted), total, aborted)
    assert set(uncommitted) == set(want), "aborted outputs are outputs of the same inputs, again"
    ends = end_offsets(bootstrap, in_topic)
    assert wait_committed(bootstrap, group, in_topic, ends) == ends


def test_confluent_consume_transform_produce(fresh_broker):
    bootstrap = fresh_broker.bootstrap
    in_topic, out_topic, group = names("eos-ck")
    fill_input(bootstrap, in_topic)
    create_topic(bootstrap, out_topic, PARTITIONS)

    c = consumer(
        bootstrap,
        **{
            "group.id": group,
            "isolation.level": "read_committed",
            "auto.offset.reset": "earliest",
            "enable.partition.eof": False,
        },
    )
    c.subscribe([in_topic])
    p = producer(bootstrap, **{"transactional.id": f"{group}-txn", "enable.idempotence": True, "linger.ms": 5})
    p.init_transactions(30)
    done = aborted = transactions = 0
    deadline = time.monotonic() + 90
    try:
        while done < INPUTS:
            assert time.monotonic() < deadline, f"only {done} of {INPUTS} inputs transformed"
            batch = c.consume(num_messages=200, timeout=0.5)
            if not batch:
                continue
            for m in batch:
                assert m.error() is None, m.error()
            p.begin_transaction()
            for m in batch:
                p.produce(out_topic, key=m.key(), value=b"out-" + m.value()[3:], partition=m.partition())
            p.send_offsets_to_transaction(c.position(c.assignment()), c.consumer_group_metadata(), 30)
            transactions += 1
            if transactions % ABORT_EVERY == 0:
                # Flushed first, so that the aborted outputs are in the log (an abort drops what
                # is still unsent).
                assert p.flush(30) == 0
                p.abort_transaction(30)
                aborted += len(batch)
                # Back to what the group committed: the aborted batch is read again.
                for tp in c.committed(c.assignment(), timeout=10):
                    c.seek(TopicPartition(tp.topic, tp.partition, tp.offset if tp.offset >= 0 else OFFSET_BEGINNING))
            else:
                p.commit_transaction(30)
                done += len(batch)
    finally:
        c.close()
    check_outputs(bootstrap, in_topic, out_topic, group, INPUTS, aborted)


def test_kafka_python_consume_transform_produce(fresh_broker):
    from kafka import KafkaConsumer, KafkaProducer
    from kafka.structs import OffsetAndMetadata
    from kafka.structs import TopicPartition as KTopicPartition

    bootstrap = fresh_broker.bootstrap
    in_topic, out_topic, group = names("eos-kp")
    fill_input(bootstrap, in_topic)
    create_topic(bootstrap, out_topic, PARTITIONS)

    c = KafkaConsumer(
        in_topic,
        bootstrap_servers=bootstrap,
        group_id=group,
        isolation_level="read_committed",
        enable_auto_commit=False,
        auto_offset_reset="earliest",
    )
    p = KafkaProducer(bootstrap_servers=bootstrap, transactional_id=f"{group}-txn", linger_ms=5)
    p.init_transactions()
    done = aborted = transactions = 0
    deadline = time.monotonic() + 90
    try:
        while done < INPUTS:
            assert time.monotonic() < deadline, f"only {done} of {INPUTS} inputs transformed"
            polled = c.poll(timeout_ms=500, max_records=200)
            records = [r for rs in polled.values() for r in rs]
            if not records:
                continue
            p.begin_transaction()
            for r in records:
                p.send(out_topic, key=r.key, value=b"out-" + r.value[3:], partition=r.partition)
            offsets = {tp: OffsetAndMetadata(c.position(tp), "", -1) for tp in polled}
            p.send_offsets_to_transaction(offsets, c.group_metadata())
            transactions += 1
            if transactions % ABORT_EVERY == 0:
                p.flush()
                p.abort_transaction()
                aborted += len(records)
                for tp in polled:
                    committed = c.committed(tp)
                    if committed is None:
                        c.seek_to_beginning(tp)
                    else:
                        c.seek(tp, committed)
            else:
                p.commit_transaction()
                done += len(records)
        assert isinstance(next(iter(polled)), KTopicPartition)
    finally:
        c.close()
        p.close()
    check_outputs(bootstrap, in_topic, out_topic, group, INPUTS, aborted)


def send_offsets(bootstrap: str, transactional_id: str, group: str, topic: str, offset: int, **extra):
    """A transactional producer with one record and `offset` for every partition of `topic` sent
    in its open transaction."""
    p = producer(bootstrap, **{"transactional.id": transactional_id, "enable.idempotence": True, **extra})
    p.init_transactions(30)
    p.begin_transaction()
    p.produce(topic, value=b"with-offsets", partition=0)
    offsets = [TopicPartition(topic, part, offset) for part in range(PARTITIONS)]
    # A group the producer does not belong to: its metadata is the group id alone (KIP-447's
    # checks apply only to a member's metadata).
    meta = consumer(bootstrap, **{"group.id": group}).consumer_group_metadata()
    p.send_offsets_to_transaction(offsets, meta, 30)
    return p


def test_offsets_are_unstable_until_the_marker(fresh_broker):
    bootstrap = fresh_broker.bootstrap
    topic, _, group = names("eos-stable")
    create_topic(bootstrap, topic, PARTITIONS)
    unstable = KafkaError.UNSTABLE_OFFSET_COMMIT

    p = send_offsets(bootstrap, f"{group}-a", group, topic, 10)
    assert committed_offsets(bootstrap, group, topic) == {0: unstable, 1: unstable, 2: unstable}
    # Without require_stable the group has nothing committed yet.
    assert committed_offsets(bootstrap, group, topic, require_stable=False) == {0: -1001, 1: -1001, 2: -1001}
    p.commit_transaction(30)
    assert wait_committed(bootstrap, group, topic, {0: 10, 1: 10, 2: 10}) == {0: 10, 1: 10, 2: 10}

    p = send_offsets(bootstrap, f"{group}-b", group, topic, 20)
    assert committed_offsets(bootstrap, group, topic) == {0: unstable, 1: unstable, 2: unstable}
    p.abort_transaction(30)
    assert wait_committed(bootstrap, group, topic, {0: 10, 1: 10, 2: 10}) == {0: 10, 1: 10, 2: 10}
    # The abort marker dropped them for good: the offsets stay 10.
    time.sleep(1)
    assert committed_offsets(bootstrap, group, topic) == {0: 10, 1: 10, 2: 10}


def test_offsets_replayed_after_kill9(fresh_broker):
    bootstrap = fresh_broker.bootstrap
    topic, _, group = names("eos-kill")
    create_topic(bootstrap, topic, PARTITIONS)
    unstable = KafkaError.UNSTABLE_OFFSET_COMMIT

    p = send_offsets(bootstrap, f"{group}-a", group, topic, 10)
    p.commit_transaction(30)
    assert wait_committed(bootstrap, group, topic, {0: 10, 1: 10, 2: 10}) == {0: 10, 1: 10, 2: 10}
    p = None
    open_producer = send_offsets(
        bootstrap,
        f"{group}-b",
        group,
        topic,
        20,
        **{"transaction.timeout.ms": TXN_TIMEOUT_MS_SHORT, "message.timeout.ms": TXN_TIMEOUT_MS_SHORT},
    )
    assert committed_offsets(bootstrap, group, topic) == {0: unstable, 1: unstable, 2: unstable}

    fresh_broker.restart(sig=signal.SIGKILL)
    bootstrap = fresh_broker.bootstrap
    # Replayed: the open transaction's offsets are pending again (the first answer once the
    # coordinator has loaded, well within the transaction's timeout) ...
    loading = (KafkaError.COORDINATOR_LOAD_IN_PROGRESS, KafkaError.NOT_COORDINATOR, KafkaError.COORDINATOR_NOT_AVAILABLE)
    deadline = time.monotonic() + 10
    while (got := committed_offsets(bootstrap, group, topic))[0] in loading and time.monotonic() < deadline:
        time.sleep(0.1)
    assert got == {0: unstable, 1: unstable, 2: unstable}, got
    # ... until its timeout aborts it; then the committed ones are the group's.
    got = wait_committed(bootstrap, group, topic, {0: 10, 1: 10, 2: 10}, timeout=30)
    assert got == {0: 10, 1: 10, 2: 10}, got
    assert committed_offsets(bootstrap, group, topic, require_stable=False) == {0: 10, 1: 10, 2: 10}
    open_producer = None


APP = Path(__file__).with_name("eos_app.py")
KILL_INPUTS = 20_000
APP_KILLS = 2


def start_app(client: str, bootstrap: str, in_topic: str, out_topic: str, group: str, log):
    return subprocess.Popen(
        [sys.executable, str(APP), client, bootstrap, in_topic, out_topic, group, f"{group}-txn", str(KILL_INPUTS)],
        stdout=log,
        stderr=subprocess.STDOUT,
    )


def committed_count(log_path: Path) -> int:
    lines = [ln for ln in log_path.read_text().splitlines() if ln.startswith("committed ")]
    return int(lines[-1].split()[1]) if lines else 0


@pytest.mark.parametrize("client", ["confluent", "kafka-python"])
def test_exactly_once_through_kills(fresh_broker, client, tmp_path):
    """The application (eos_app.py, its own process) is killed with SIGKILL twice at moments
    its transactions are running and started again, and the broker once: the outputs are still
    exactly once for read_committed, and the offsets reach the input's end."""
    bootstrap = fresh_broker.bootstrap
    in_topic, out_topic, group = names(f"eos-kill-{client}")
    fill_input(bootstrap, in_topic, KILL_INPUTS)
    create_topic(bootstrap, out_topic, PARTITIONS)
    rng = random.Random(KILL_INPUTS)
    instance = 0
    app = None
    try:
        for kill in range(APP_KILLS + 1):
            log_path = tmp_path / f"app-{instance}.log"
            app = start_app(client, bootstrap, in_topic, out_topic, group, log_path.open("w"))
            instance += 1
            if kill == APP_KILLS:
                break
            # Killed once it has committed a few transactions, at a random moment after.
            deadline = time.monotonic() + 60
            while committed_count(log_path) < 600:
                assert app.poll() is None, log_path.read_text()[-2000:]
                assert time.monotonic() < deadline, "the application made no progress"
                time.sleep(0.05)
            time.sleep(rng.uniform(0.0, 0.3))
            app.send_signal(signal.SIGKILL)
            app.wait(timeout=10)
            if kill == 0:
                # The broker too, with the killed application's transaction open.
                fresh_broker.restart(sig=signal.SIGKILL)
        code = app.wait(timeout=120)
        assert code == 0, (tmp_path / f"app-{instance - 1}.log").read_text()[-3000:]
    finally:
        if app is not None and app.poll() is None:
            app.kill()
            app.wait(timeout=10)
    want = sorted(b"out-%d" % i for i in range(KILL_INPUTS))
    got = read_all(bootstrap, out_topic, "read_committed", KILL_INPUTS, timeout=60)
    assert sorted(got) == want, (
        f"read_committed must see each input's output exactly once: {len(got)} records, "
        f"{len(set(got))} distinct, {len(set(want) - set(got))} missing"
    )
    # What a killed instance had sent in its open transaction was aborted when the next one
    # fenced it: read_uncommitted sees those outputs again, nothing else.
    uncommitted = read_all(bootstrap, out_topic, "read_uncommitted", KILL_INPUTS, timeout=60)
    assert set(uncommitted) == set(want)
    ends = end_offsets(bootstrap, in_topic)
    assert wait_committed(bootstrap, group, in_topic, ends) == ends
