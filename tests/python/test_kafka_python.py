"""kafka-python (a pure-Python client with its own protocol code) against a real `sluice`."""

from __future__ import annotations

import time

from kafka import KafkaConsumer, KafkaProducer
from kafka import TopicPartition as KTP

from confluent_kafka import TopicPartition
from harness import consumer as rd_consumer
from harness import read_to_end, watermarks

COUNT = 2_000
SEND_TIMEOUT_S = 30


def kp_producer(broker, **extra) -> KafkaProducer:
    config = dict(
        bootstrap_servers=broker.bootstrap,
        acks="all",
        linger_ms=5,
        # enable_idempotence is left at kafka-python's default (on, since the broker is >= 0.11).
        request_timeout_ms=15_000,
    )
    config.update(extra)
    return KafkaProducer(**config)


def kp_consumer(broker) -> KafkaConsumer:
    # group_id=None: manual assignment only, no group coordinator.
    return KafkaConsumer(
        bootstrap_servers=broker.bootstrap,
        group_id=None,
        enable_auto_commit=False,
        auto_offset_reset="none",
        fetch_max_wait_ms=100,
        request_timeout_ms=15_000,
    )


def record(seq: int) -> dict:
    return dict(
        key=b"user-%d" % (seq % 97),
        value=b"payload-%d-" % seq + bytes([seq % 251]) * (seq % 300),
        headers=[("seq", str(seq).encode()), ("trace", b"\x00\xff%d" % (seq * 31)), ("empty", b"")],
    )


def send_all(p: KafkaProducer, topic: str, count: int):
    futures = [p.send(topic, **record(s)) for s in range(count)]
    p.flush(timeout=SEND_TIMEOUT_S)
    return [f.get(timeout=SEND_TIMEOUT_S) for f in futures]


def poll_until(c: KafkaConsumer, ends: dict, timeout: float = 30.0) -> list:
    """Polls until every partition in `ends` has delivered its record just before the end."""
    out = []
    last = {tp: -1 for tp in ends}
    deadline = time.monotonic() + timeout
    while any(last[tp] < end - 1 for tp, end in ends.items()):
        assert time.monotonic() < deadline, f"timed out; last offsets {last}, ends {ends}"
        for tp, records in c.poll(timeout_ms=500).items():
            for r in records:
                assert r.offset < ends[tp], f"{tp}: offset {r.offset} at or past the end {ends[tp]}"
                last[tp] = r.offset
                out.append(r)
    return out


def test_api_version_is_detected(broker):
    p = KafkaProducer(bootstrap_servers=broker.bootstrap)
    c = KafkaConsumer(bootstrap_servers=broker.bootstrap, group_id=None)
    try:
        # No api_version given: both asked the broker (ApiVersions) and settled on a version
        # that has record batches with headers and zstd (>= 2.1).
        for client in (p, c):
            detected = client.config["api_version"]
            assert isinstance(detected, tuple) and detected >= (2, 1), detected
        # From that version on the producer is idempotent by default (InitProducerId).
        assert p.config["enable_idempotence"] is True
    finally:
        p.close(timeout=5)
        c.close()


def test_round_trip_with_keys_and_headers_on_an_auto_created_topic(broker):
    topic = "kafka-python-round-trip"
    p = kp_producer(broker)
    metas = send_all(p, topic, COUNT)
    p.close(timeout=10)
    partitions = sorted({m.partition for m in metas})
    assert partitions == [0, 1, 2], "the auto-created topic should have --num-partitions=3 partitions, all used"

    c = kp_consumer(broker)
    assert c.partitions_for_topic(topic) == {0, 1, 2}
    tps = [KTP(topic, q) for q in partitions]
    c.assign(tps)
    c.seek_to_beginning()
    ends = c.end_offsets(tps)
    assert c.beginning_offsets(tps) == {tp: 0 for tp in tps}
    assert sum(ends.values()) == COUNT
    got = poll_until(c, ends)
    assert len(got) == COUNT

    where = {(m.partition, m.offset): s for s, m in enumerate(metas)}
    assert len(where) == COUNT
    per_partition = {q: [] for q in partitions}
    key_partition = {}
    for r in got:
        seq = where[(r.partition, r.offset)]
        want = record(seq)
        assert (r.key, r.value) == (want["key"], want["value"]), f"record {seq}"
        assert r.headers == want["headers"], f"record {seq} headers"
        assert r.timestamp == metas[seq].timestamp
        assert key_partition.setdefault(r.key, r.partition) == r.partition
        per_partition[r.partition].append((r.offset, seq))
    for q, entries in per_partition.items():
        assert [o for o, _ in entries] == list(range(ends[KTP(topic, q)]))
        assert [s for _, s in entries] == sorted(s for _, s in entries), f"partition {q} order"

    # Seek into the middle of one partition: the first record is the one at that offset.
    tp = KTP(topic, 1)
    mid = ends[tp] // 2
    c.assign([tp])
    c.seek(tp, mid)
    first = None
    deadline = time.monotonic() + 15
    while first is None and time.monotonic() < deadline:
        records = c.poll(timeout_ms=500).get(tp, [])
        first = records[0] if records else None
    assert first is not None and first.offset == mid
    assert first.value == record(where[(1, mid)])["value"]

    # ListOffsets by timestamp through kafka-python's own encoder.
    target = metas[where[(1, mid)]].timestamp
    found = c.offsets_for_times({tp: target})[tp]
    assert found is not None and found.offset <= mid and found.timestamp >= target
    c.close()


def test_gzip_and_lz4_from_kafka_python_read_by_librdkafka(broker):
    """Batches compressed by kafka-python's own encoders, stored by the broker as sent, decoded
    by librdkafka."""
    for codec in ("gzip", "lz4"):
        topic = f"kafka-python-{codec}"
        p = kp_producer(broker, compression_type=codec, linger_ms=20)
        metas = send_all(p, topic, COUNT)
        p.close(timeout=10)
        c = rd_consumer(broker.bootstrap)
        marks = watermarks(c, topic, 3)
        assert sum(h for _, h in marks.values()) == COUNT
        c.assign([TopicPartition(topic, q, 0) for q in range(3)])
        msgs = read_to_end(c, {(topic, q): marks[q][1] for q in range(3)})
        c.close()
        where = {(m.partition, m.offset): s for s, m in enumerate(metas)}
        assert len(msgs) == COUNT
        for m in msgs:
            want = record(where[(m.partition(), m.offset())])
            assert (m.key(), m.value(), m.headers()) == (want["key"], want["value"], want["headers"]), codec

