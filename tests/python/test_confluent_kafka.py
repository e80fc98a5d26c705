"""confluent-kafka (librdkafka) against a real `sluice --cores 2`: bulk keyed produce and
consume, replay from an offset and from a timestamp, compression, cross-shard routing and
ListOffsets."""

from __future__ import annotations

import re
import time
from collections import defaultdict

import pytest
from confluent_kafka import KafkaError, TopicPartition
from confluent_kafka.admin import OffsetSpec

from harness import (
    admin,
    Stats,
    assert_all_delivered,
    consumer,
    create_topic,
    digest,
    produce_all,
    producer,
    read_to_end,
    watermarks,
)

BIG_TOPIC = "bulk-keyed"
BIG_PARTITIONS = 12
BIG_COUNT = 100_000
BIG_KEYS = 3_000
# Producing and reading 100,000 messages takes about a second; these bound a stuck broker.
BIG_PRODUCE_TIMEOUT_S = 120
BIG_READ_TIMEOUT_S = 120


def big_key(seq: int) -> bytes:
    # 7919 is prime, so seq -> key walks all BIG_KEYS keys, each once per BIG_KEYS messages.
    return b"key-%04d" % ((seq * 7919) % BIG_KEYS)


def big_value(seq: int) -> bytes:
    key = big_key(seq)
    return b"%d|%s|%s" % (seq, key, digest(key, seq).encode())


def seq_of(value: bytes) -> int:
    return int(value.split(b"|", 1)[0])


@pytest.fixture(scope="module")
def bulk(broker):
    """100,000 keyed messages produced with acks=all to a 12-partition topic; returns the delivery
    reports by sequence number."""
    create_topic(broker.bootstrap, BIG_TOPIC, BIG_PARTITIONS)
    p = producer(broker.bootstrap, **{"linger.ms": 20})
    started = time.monotonic()
    reports = produce_all(
        p,
        BIG_TOPIC,
        ({"key": big_key(s), "value": big_value(s)} for s in range(BIG_COUNT)),
        flush_timeout=BIG_PRODUCE_TIMEOUT_S,
    )
    print(f"produced {BIG_COUNT} messages in {time.monotonic() - started:.1f} s")
    return reports


def test_100k_keyed_messages_round_trip(broker, bulk):
    assert_all_delivered(bulk)
    assert len(bulk) == BIG_COUNT
    at = {(r.partition, r.offset): seq for seq, r in enumerate(bulk)}
    assert len(at) == BIG_COUNT, "two messages were acknowledged at the same partition and offset"

    c = consumer(broker.bootstrap)
    marks = watermarks(c, BIG_TOPIC, BIG_PARTITIONS)
    acked_per_partition = defaultdict(int)
    for r in bulk:
        acked_per_partition[r.partition] += 1
    for p in range(BIG_PARTITIONS):
        assert marks[p] == (0, acked_per_partition[p]), f"partition {p} watermarks"
    assert len(acked_per_partition) == BIG_PARTITIONS, "keys should spread over every partition"

    c.assign([TopicPartition(BIG_TOPIC, p, 0) for p in range(BIG_PARTITIONS)])
    started = time.monotonic()
    msgs = read_to_end(c, {(BIG_TOPIC, p): marks[p][1] for p in range(BIG_PARTITIONS)}, BIG_READ_TIMEOUT_S)
    print(f"consumed {len(msgs)} messages in {time.monotonic() - started:.1f} s")
    c.close()

    assert len(msgs) == BIG_COUNT
    offsets = defaultdict(list)
    seqs = defaultdict(list)
    key_partition = {}
    seen = set()
    for m in msgs:
        p, key, value = m.partition(), m.key(), m.value()
        offsets[p].append(m.offset())
        seq = seq_of(value)
        assert seq not in seen, f"sequence {seq} consumed twice"
        seen.add(seq)
        assert value == big_value(seq), f"payload of sequence {seq} is damaged: {value!r}"
        assert key == big_key(seq), f"key of sequence {seq} is {key!r}"
        assert at[(p, m.offset())] == seq, f"{p}@{m.offset()} holds {seq}, acknowledged there was {at[(p, m.offset())]}"
        assert m.timestamp()[1] == bulk[seq].timestamp
        assert key_partition.setdefault(key, p) == p, f"key {key!r} is in partitions {key_partition[key]} and {p}"
        seqs[p].append(seq)
    assert seen == set(range(BIG_COUNT))
    assert len(key_partition) == BIG_KEYS
    for p in range(BIG_PARTITIONS):
        assert offsets[p] == list(range(acked_per_partition[p])), f"partition {p} offsets are not 0, 1, 2, ..."
        assert seqs[p] == sorted(seqs[p]), f"partition {p} does not keep the order messages were produced in"


def test_replay_from_an_offset(broker, bulk):
    by_partition = defaultdict(dict)
    for seq, r in enumerate(bulk):
        by_partition[r.partition][r.offset] = seq
    starts = {}
    for p in range(BIG_PARTITIONS):
        end = len(by_partition[p])
        starts[p] = [0, end // 3, end - 1][p % 3]
    c = consumer(broker.bootstrap)
    c.assign([TopicPartition(BIG_TOPIC, p, o) for p, o in starts.items()])
    first = {}
    deadline = time.monotonic() + 30
    while len(first) < BIG_PARTITIONS and time.monotonic() < deadline:
        for m in c.consume(num_messages=1000, timeout=0.5):
            assert m.error() is None, m.error()
            first.setdefault(m.partition(), m)
    c.close()
    assert sorted(first) == list(range(BIG_PARTITIONS))
    for p, m in first.items():
        assert m.offset() == starts[p], f"partition {p}: first offset {m.offset()}, asked for {starts[p]}"
        seq = by_partition[p][starts[p]]
        assert (m.key(), m.value()) == (big_key(seq), big_value(seq))


def test_fetch_at_the_end_waits_and_past_the_end_is_out_of_range(broker, bulk):
    end = sum(1 for r in bulk if r.partition == 0)
    c = consumer(broker.bootstrap)
    c.assign([TopicPartition(BIG_TOPIC, 0, end)])
    assert [m for m in c.consume(num_messages=10, timeout=1.5)] == []
    c.close()

    c = consumer(broker.bootstrap)  # auto.offset.reset=error
    c.assign([TopicPartition(BIG_TOPIC, 0, end + 5)])
    errors = []
    deadline = time.monotonic() + 15
    while not errors and time.monotonic() < deadline:
        for m in c.consume(num_messages=10, timeout=0.5):
            assert m.error() is not None, f"got a message at {m.offset()} past the end {end}"
            errors.append(m.error())
    c.close()
    assert errors, "fetching past the end gave no error"
    assert errors[0].code() == KafkaError._AUTO_OFFSET_RESET, errors[0]
    assert "out of range" in errors[0].str().lower(), errors[0]


TS_TOPIC = "by-time"
TS_PARTITIONS = 3
TS_COUNT = 3_000
TS_STEP_MS = 10


def test_replay_from_a_timestamp(broker):
    create_topic(broker.bootstrap, TS_TOPIC, TS_PARTITIONS)
    t0 = int(time.time() * 1000) - 3_600_000
    reports = produce_all(
        producer(broker.bootstrap),
        TS_TOPIC,
        (
            {"key": b"k%d" % (s % 50), "value": b"v%d" % s, "timestamp": t0 + s * TS_STEP_MS}
            for s in range(TS_COUNT)
        ),
    )
    assert_all_delivered(reports)
    in_partition = defaultdict(list)  # partition -> [(offset, timestamp, seq)] by offset
    for seq, r in enumerate(reports):
        assert r.timestamp == t0 + seq * TS_STEP_MS
        in_partition[r.partition].append((r.offset, r.timestamp, seq))
    for entries in in_partition.values():
        entries.sort()

    def expected(p, target):
        return next(((o, t, s) for o, t, s in in_partition[p] if t >= target), None)

    c = consumer(broker.bootstrap)
    # Before everything, exactly on a message, between two messages, the last one, after all.
    for target in [t0 - 1000, t0 + 1234 * TS_STEP_MS, t0 + 2000 * TS_STEP_MS + 3, t0 + (TS_COUNT - 1) * TS_STEP_MS, t0 + TS_COUNT * TS_STEP_MS]:
        found = c.offsets_for_times([TopicPartition(TS_TOPIC, p, target) for p in range(TS_PARTITIONS)], timeout=10)
        for tp in found:
            assert tp.error is None, tp.error
            want = expected(tp.partition, target)
            want_offset = -1 if want is None else want[0]
            assert tp.offset == want_offset, f"partition {tp.partition}, timestamp {target - t0:+d} ms from t0: offset {tp.offset}, expected {want_offset}"

    target = t0 + 1500 * TS_STEP_MS + 5
    found = c.offsets_for_times([TopicPartition(TS_TOPIC, p, target) for p in range(TS_PARTITIONS)], timeout=10)
    c.assign(found)
    first = {}
    deadline = time.monotonic() + 30
    while len(first) < TS_PARTITIONS and time.monotonic() < deadline:
        for m in c.consume(num_messages=100, timeout=0.5):
            assert m.error() is None, m.error()
            first.setdefault(m.partition(), m)
    c.close()
    assert sorted(first) == list(range(TS_PARTITIONS))
    for p, m in first.items():
        offset, ts, seq = expected(p, target)
        assert (m.offset(), m.timestamp()[1], m.value()) == (offset, ts, b"v%d" % seq)
        assert ts >= target and all(t < target for o, t, _ in in_partition[p] if o < offset)


COMPRESSED_COUNT = 5_000


def compressible_value(seq: int) -> bytes:
    return (b"sluice message %08d " % seq) * 8


@pytest.mark.parametrize(
    "codec",
    [
        "gzip",
        "snappy",
        "lz4",
        "zstd",
    ],
)
def test_compressed_batches_round_trip(broker, codec):
    topic = f"compressed-{codec}"
    create_topic(broker.bootstrap, topic, 2)
    raw = sum(len(compressible_value(s)) for s in range(COMPRESSED_COUNT))

    pstats = Stats()
    p = producer(broker.bootstrap, **{"compression.type": codec}, **pstats.config())
    reports = produce_all(p, topic, ({"key": b"%d" % s, "value": compressible_value(s)} for s in range(COMPRESSED_COUNT)))
    assert_all_delivered(reports)
    sent = Stats.wire_bytes(pstats.wait_for(p, lambda s: s["txmsgs"] >= COMPRESSED_COUNT), "txbytes")

    cstats = Stats()
    c = consumer(broker.bootstrap, **cstats.config())
    marks = watermarks(c, topic, 2)
    assert marks[0][1] + marks[1][1] == COMPRESSED_COUNT
    c.assign([TopicPartition(topic, q, 0) for q in range(2)])
    msgs = read_to_end(c, {(topic, q): marks[q][1] for q in range(2)})
    received = Stats.wire_bytes(cstats.wait_for(c, lambda s: s["rxmsgs"] >= COMPRESSED_COUNT), "rxbytes")
    c.close()

    assert len(msgs) == COMPRESSED_COUNT
    got = {}
    for m in msgs:
        seq = int(m.key())
        assert m.value() == compressible_value(seq)
        r = reports[seq]
        assert (m.partition(), m.offset()) == (r.partition, r.offset)
        got[seq] = m
    assert sorted(got) == list(range(COMPRESSED_COUNT))
    # The payload compresses more than tenfold: the batches crossed the wire (both ways, so the
    # broker stored and served them) compressed.
    assert sent < raw / 4, f"producer sent {sent} bytes for {raw} bytes of values: not compressed"
    assert received < raw / 4, f"consumer received {received} bytes for {raw} bytes of values: not compressed"


def test_partitions_are_placed_round_robin_on_both_shards(broker):
    """White-box: placement is only visible in the broker's log, where each shard names the
    partitions it opens (`opened partitions topic=.. shard=.. partitions=[..]`). If that line
    changes shape, this test must follow it. (Before 4368a3f every partition went to shard 0.)"""
    topic = "placement"
    create_topic(broker.bootstrap, topic, 4)
    owners = {}
    for line in broker.log_text().splitlines():
        m = re.search(r"opened partitions topic=(\S+) shard=(\d+) partitions=\[([\d, ]+)\]", line)
        if m and m.group(1) == topic:
            for p in m.group(3).split(", "):
                owners[int(p)] = int(m.group(2))
    owners = [owners.get(p) for p in range(4)]
    assert owners[0] != owners[1] and owners[2] != owners[3], f"owner shards {owners}"
    assert sorted(owners) == [0, 0, 1, 1], f"owner shards {owners}"


def test_one_connection_reaches_partitions_on_both_shards(broker):
    """With --cores 2, partitions are placed round-robin on the shards, so whichever shard takes
    the connection, half the partitions are owned by the other one."""
    topic = "cross-shard"
    partitions = 4
    per_partition = 2_500
    create_topic(broker.bootstrap, topic, partitions)
    assert "shards=2" in broker.log_text(), "the broker did not start two shards"

    p = producer(broker.bootstrap)
    reports = produce_all(
        p,
        topic,
        ({"partition": s % partitions, "key": b"%d" % s, "value": b"%d:%s" % (s, digest(s).encode())} for s in range(partitions * per_partition)),
    )
    assert_all_delivered(reports)
    for s, r in enumerate(reports):
        assert (r.partition, r.offset) == (s % partitions, s // partitions)

    c = consumer(broker.bootstrap)
    c.assign([TopicPartition(topic, q, 0) for q in range(partitions)])
    msgs = read_to_end(c, {(topic, q): per_partition for q in range(partitions)})
    per = defaultdict(list)
    for m in msgs:
        per[m.partition()].append((m.offset(), m.key(), m.value()))
    for q in range(partitions):
        want = [(i, b"%d" % (i * partitions + q), b"%d:%s" % (i * partitions + q, digest(i * partitions + q).encode())) for i in range(per_partition)]
        assert per[q] == want, f"partition {q} content"

    # A fetch long-polling on all partitions must wake up when any shard appends.
    c.close()
    waiting = consumer(broker.bootstrap, **{"fetch.wait.max.ms": 5_000})
    waiting.assign([TopicPartition(topic, q, per_partition) for q in range(partitions)])
    assert waiting.consume(num_messages=10, timeout=1.0) == []
    for q in range(partitions):
        p.produce(topic, partition=q, value=b"late-%d" % q)
        p.flush(10)
        sent_at = time.monotonic()
        got = []
        while not got and time.monotonic() - sent_at < 10:
            got = waiting.consume(num_messages=10, timeout=0.1)
        latency = time.monotonic() - sent_at
        assert [(m.partition(), m.offset(), m.value()) for m in got] == [(q, per_partition, b"late-%d" % q)]
        assert latency < 2.5, f"partition {q}: a waiting fetch saw the append only after {latency:.2f} s"
    waiting.close()


def test_list_offsets_earliest_latest_and_by_timestamp(broker):
    topic = "list-offsets"
    create_topic(broker.bootstrap, topic, 2)
    c = consumer(broker.bootstrap)
    assert watermarks(c, topic, 2) == {0: (0, 0), 1: (0, 0)}
    empty = c.offsets_for_times([TopicPartition(topic, 0, 1_000)], timeout=10)
    assert empty[0].offset == -1

    t0 = int(time.time() * 1000) - 600_000
    # Partition 0: timestamps out of order, one batch per message. Partition 1: in order.
    stamps0 = [t0 + d for d in (500, 100, 900, 300, 700, 900, 200)]
    stamps1 = [t0 + 100 * i for i in range(20)]
    p = producer(broker.bootstrap, **{"linger.ms": 0})
    for i, ts in enumerate(stamps0):
        reports = produce_all(p, topic, [{"partition": 0, "value": b"p0-%d" % i, "timestamp": ts}])
        assert_all_delivered(reports)
        assert reports[0].offset == i
    reports = produce_all(p, topic, ({"partition": 1, "value": b"p1-%d" % i, "timestamp": ts} for i, ts in enumerate(stamps1)))
    assert_all_delivered(reports)

    assert watermarks(c, topic, 2) == {0: (0, len(stamps0)), 1: (0, len(stamps1))}

    def offset_for(partition, ts):
        [tp] = c.offsets_for_times([TopicPartition(topic, partition, ts)], timeout=10)
        assert tp.error is None, tp.error
        return tp.offset

    # The earliest offset whose timestamp is at or after the target, in offset order.
    assert offset_for(0, t0) == 0
    assert offset_for(0, t0 + 500) == 0
    assert offset_for(0, t0 + 501) == 2
    assert offset_for(0, t0 + 901) == -1
    assert offset_for(1, t0 + 250) == 3
    assert offset_for(1, t0 + 1900) == 19
    assert offset_for(1, t0 + 1901) == -1

    client = admin(broker.bootstrap)
    specs = {
        TopicPartition(topic, 0): OffsetSpec.max_timestamp(),
        TopicPartition(topic, 1): OffsetSpec.max_timestamp(),
    }
    result = {tp.partition: f.result(timeout=10) for tp, f in client.list_offsets(specs, request_timeout=10).items()}
    # The first record carrying the highest timestamp (KIP-734).
    assert (result[0].offset, result[0].timestamp) == (2, t0 + 900)
    assert (result[1].offset, result[1].timestamp) == (19, t0 + 1900)
    earliest = client.list_offsets({TopicPartition(topic, 0): OffsetSpec.earliest()}, request_timeout=10)
    latest = client.list_offsets({TopicPartition(topic, 0): OffsetSpec.latest()}, request_timeout=10)
    assert [f.result(timeout=10).offset for f in earliest.values()] == [0]
    assert [f.result(timeout=10).offset for f in latest.values()] == [len(stamps0)]
    c.close()


def test_offset_for_timestamp_inside_a_compressed_batch(broker):
    topic = "by-time-compressed"
    create_topic(broker.bootstrap, topic, 1)
    t0 = int(time.time() * 1000) - 600_000
    p = producer(broker.bootstrap, **{"compression.type": "gzip", "linger.ms": 100})
    reports = produce_all(p, topic, ({"partition": 0, "value": b"c%d" % i, "timestamp": t0 + 10 * i} for i in range(100)))
    assert_all_delivered(reports)
    assert [r.offset for r in reports] == list(range(100))
    c = consumer(broker.bootstrap)
    [tp] = c.offsets_for_times([TopicPartition(topic, 0, t0 + 505)], timeout=10)
    c.close()
    assert tp.offset == 51
