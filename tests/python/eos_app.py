"""A consume-transform-produce application for test_exactly_once_kills.py, run as its own process
so that it can be killed with SIGKILL: reads `in-<n>` records with read_committed in a group,
writes `out-<n>` for each in a transaction that also carries the group's offsets, and commits.

    eos_app.py CLIENT BOOTSTRAP IN_TOPIC OUT_TOPIC GROUP TRANSACTIONAL_ID TOTAL

CLIENT is `confluent` (librdkafka) or `kafka-python`. Prints `committed <count>` after every
commit (the records transformed by this process so far) and `aborted <reason>` when a
transaction fails and is aborted (it then rewinds to the committed offsets). Exits 0 once the
group's committed offsets reach TOTAL records in all, 3 when the producer cannot go on (fenced,
or an abort that fails): the test then starts a new instance, as an operator would.
"""

from __future__ import annotations

import sys
import time

BATCH = 200


def run_confluent(bootstrap, in_topic, out_topic, group, transactional_id, total):
    from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaException, Producer, TopicPartition

    c = Consumer({
        "bootstrap.servers": bootstrap,
        "group.id": group,
        "isolation.level": "read_committed",
        "enable.auto.commit": False,
        "auto.offset.reset": "earliest",
        "session.timeout.ms": 6000,
    })
    c.subscribe([in_topic])
    p = Producer({
        "bootstrap.servers": bootstrap,
        "transactional.id": transactional_id,
        "transaction.timeout.ms": 10000,
        "message.timeout.ms": 10000,
        "linger.ms": 5,
    })
    p.init_transactions(60)
    done = 0

    while True:
        batch = [m for m in c.consume(num_messages=BATCH, timeout=0.5) if m.error() is None]
        if not batch:
            if all_committed(c, in_topic, total):
                return 0
            continue
        try:
            p.begin_transaction()
            for m in batch:
                p.produce(out_topic, key=m.key(), value=b"out-" + m.value()[3:], partition=m.partition())
            p.send_offsets_to_transaction(c.position(c.assignment()), c.consumer_group_metadata(), 30)
            p.commit_transaction(30)
            done += len(batch)
            print(f"committed {done}", flush=True)
        except KafkaException as e:
            err = e.args[0]
            if err.fatal():
                print(f"fatal {err}", flush=True)
                return 3
            print(f"aborted {err}", flush=True)
            try:
                p.abort_transaction(30)
            except KafkaException as e2:
                print(f"abort failed {e2}", flush=True)
                return 3
            for tp in c.committed(c.assignment(), timeout=30):
                c.seek(TopicPartition(tp.topic, tp.partition, tp.offset if tp.offset >= 0 else OFFSET_BEGINNING))


def all_committed(c, in_topic, total) -> bool:
    """Whether the group's committed offsets (stable ones) add up to every input record."""
    from confluent_kafka import KafkaException, TopicPartition

    try:
        md = c.list_topics(in_topic, timeout=10)
        tps = [TopicPartition(in_topic, p) for p in md.topics[in_topic].partitions]
        return sum(max(tp.offset, 0) for tp in c.committed(tps, timeout=10)) >= total
    except KafkaException:
        return False


def run_kafka_python(bootstrap, in_topic, out_topic, group, transactional_id, total):
    from kafka import KafkaConsumer, KafkaProducer
    from kafka.errors import KafkaError, ProducerFencedError
    from kafka.structs import OffsetAndMetadata, TopicPartition

    c = KafkaConsumer(
        in_topic,
        bootstrap_servers=bootstrap,
        group_id=group,
        isolation_level="read_committed",
        enable_auto_commit=False,
        auto_offset_reset="earliest",
        session_timeout_ms=6000,
    )
    p = KafkaProducer(bootstrap_servers=bootstrap, transactional_id=transactional_id, linger_ms=5,
                      transaction_timeout_ms=10000)
    p.init_transactions()
    done = 0
    while True:
        polled = c.poll(timeout_ms=500, max_records=BATCH)
        records = [r for rs in polled.values() for r in rs]
        if not records:
            parts = c.partitions_for_topic(in_topic) or set()
            committed = [c.committed(TopicPartition(in_topic, q)) for q in parts]
            if sum(x or 0 for x in committed) >= total:
                return 0
            continue
        try:
            p.begin_transaction()
            for r in records:
                p.send(out_topic, key=r.key, value=b"out-" + r.value[3:], partition=r.partition)
            offsets = {tp: OffsetAndMetadata(c.position(tp), "", -1) for tp in polled}
            p.send_offsets_to_transaction(offsets, c.group_metadata())
            p.commit_transaction()
            done += len(records)
            print(f"committed {done}", flush=True)
        except ProducerFencedError as e:
            print(f"fatal {e!r}", flush=True)
            return 3
        except KafkaError as e:
            print(f"aborted {e!r}", flush=True)
            try:
                p.abort_transaction()
            except KafkaError as e2:
                print(f"abort failed {e2!r}", flush=True)
                return 3
            for tp in polled:
                committed = c.committed(tp)
                if committed is None:
                    c.seek_to_beginning(tp)
                else:
                    c.seek(tp, committed)


def main() -> int:
    client, bootstrap, in_topic, out_topic, group, transactional_id, total = sys.argv[1:8]
    run = run_confluent if client == "confluent" else run_kafka_python
    started = time.monotonic()
    code = run(bootstrap, in_topic, out_topic, group, transactional_id, int(total))
    print(f"exit {code} after {time.monotonic() - started:.1f} s", flush=True)
    return code


if __name__ == "__main__":
    sys.exit(main())
