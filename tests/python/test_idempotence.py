"""An idempotent producer through broker stalls: the broker is SIGSTOPped twice mid-stream for
longer than the client's request timeout, then resumed, so the client times requests out,
reconnects and sends again. Every message must be in the log exactly once and in produce order
per partition. (Whether librdkafka resends a batch the broker already appended depends on
timing; the deterministic check of retry deduplication is broker/tests/idempotence.rs.)"""

from __future__ import annotations

import os
import signal
import threading
import time
from collections import defaultdict

from harness import consumer, create_topic, producer, read_to_end, watermarks

TOPIC = "idempotent"
PARTITIONS = 3
COUNT = 30_000


def test_retries_after_a_stalled_broker_leave_no_duplicates_and_no_gaps(fresh_broker):
    broker = fresh_broker
    create_topic(broker.bootstrap, TOPIC, PARTITIONS)
    p = producer(
        broker.bootstrap,
        **{
            "enable.idempotence": True,
            "linger.ms": 2,
            "batch.num.messages": 500,
            # Short request timeouts, so that a stalled broker makes the client resend batches
            # it has already sent (the broker may have appended them): the retries dedupe
            # has to catch.
            "request.timeout.ms": 1500,
            "message.timeout.ms": 120_000,
            "max.in.flight.requests.per.connection": 5,
        },
    )
    acked: list[int] = []
    errors: list[str] = []

    def on_delivery(err, msg):
        if err is not None:
            errors.append(str(err))
        else:
            acked.append(int(msg.value()))

    def stall_twice():
        for _ in range(2):
            time.sleep(0.4)
            os.kill(broker.pid, signal.SIGSTOP)
            time.sleep(2.5)
            os.kill(broker.pid, signal.SIGCONT)

    staller = threading.Thread(target=stall_twice)
    staller.start()
    for seq in range(COUNT):
        while True:
            try:
                p.produce(TOPIC, key=str(seq % 97).encode(), value=str(seq).encode(), on_delivery=on_delivery)
                break
            except BufferError:
                p.poll(0.05)
        if seq % 1000 == 0:
            p.poll(0)
    staller.join()
    assert p.flush(120) == 0, "messages still undelivered"
    assert errors == [], f"{len(errors)} deliveries failed, first: {errors[:3]}"
    assert sorted(acked) == list(range(COUNT))

    c = consumer(broker.bootstrap)
    from confluent_kafka import TopicPartition

    c.assign([TopicPartition(TOPIC, i, 0) for i in range(PARTITIONS)])
    ends = {(TOPIC, i): hi for i, (_, hi) in watermarks(c, TOPIC, PARTITIONS).items()}
    messages = read_to_end(c, ends)
    c.close()
    values = [int(m.value()) for m in messages]
    assert len(values) == COUNT, f"{len(values) - COUNT:+d} messages against what was produced (duplicates or losses)"
    assert sorted(values) == list(range(COUNT)), "some message is missing or duplicated"
    per_partition: dict[int, list[int]] = defaultdict(list)
    for m in messages:
        per_partition[m.partition()].append(int(m.value()))
    for partition, seqs in per_partition.items():
        assert seqs == sorted(seqs), f"partition {partition} is out of produce order"
    assert sum(ends.values()) == COUNT, "the log holds more records than were produced"
