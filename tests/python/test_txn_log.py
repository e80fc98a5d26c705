"""The log side of transactions (KIP-98), driven the way a transaction coordinator drives a
partition leader: transactional batches from producers, then WriteTxnMarkers with their commit
or abort. librdkafka consumers read the result with `isolation.level` read_committed and
read_uncommitted; raw Fetch and ListOffsets requests check the last stable offset and the
aborted-transaction list; a restart (SIGTERM and SIGKILL) must rebuild all of it.

The producers here are idempotent ones whose batches carry the transactional flag, and the test
writes the markers itself, as a coordinator would: the log side on its own, without the
transaction coordinator (test_transactions.py drives that with real transactional producers).
"""

from __future__ import annotations

import time

from confluent_kafka import OFFSET_BEGINNING, KafkaError, TopicPartition
from kafka.protocol.api_message import ApiMessage
from kafka.protocol.admin.transactions import DescribeProducersRequest
from kafka.protocol.consumer.fetch import FetchRequest
from kafka.protocol.consumer.offsets import ListOffsetsRequest
from kafka.protocol.producer.produce import ProduceRequest
from kafka.protocol.producer.transaction import InitProducerIdRequest
from kafka.record.default_records import DefaultRecordBatchBuilder

from harness import consumer, create_topic
from wire import Pipeline, build

READ_COMMITTED, READ_UNCOMMITTED = 1, 0
ABORT, COMMIT = False, True
INVALID_PRODUCER_EPOCH = 47
INVALID_RECORD = 87


class WriteTxnMarkersRequest(ApiMessage):
    pass


class WriteTxnMarkersResponse(ApiMessage):
    pass


def one(bootstrap: str, request) -> dict:
    pipe = Pipeline(bootstrap)
    try:
        pipe.send(request)
        (r,) = pipe.responses()
    finally:
        pipe.close()
    return r


def producer_id(bootstrap: str) -> tuple[int, int]:
    r = one(bootstrap, build(InitProducerIdRequest, 4, transactional_id=None, transaction_timeout_ms=60_000,
                             producer_id=-1, producer_epoch=-1))
    assert r["error_code"] == 0, r
    return r["producer_id"], r["producer_epoch"]


def txn_batch(pid: int, epoch: int, seq: int, values: list[bytes], transactional: bool = True,
              control: bool = False) -> bytes:
    b = DefaultRecordBatchBuilder(magic=2, compression_type=0, is_transactional=transactional, producer_id=pid,
                                  producer_epoch=epoch, base_sequence=seq, batch_size=1 << 20)
    now = int(time.time() * 1000)
    for i, v in enumerate(values):
        b.append(i, timestamp=now, key=None, value=v, headers=[])
    data = bytearray(b.build())
    if control:
        # kafka-python cannot build control batches: set the attribute bit (5) and fix the CRC.
        import kafka.record.util as util
        attrs = int.from_bytes(data[21:23], "big") | 0x20
        data[21:23] = attrs.to_bytes(2, "big")
        data[17:21] = util.calc_crc32c(bytes(data[21:])).to_bytes(4, "big")
    return bytes(data)


def produce(bootstrap: str, topic: str, records: bytes) -> dict:
    r = one(bootstrap, build(ProduceRequest, 9, transactional_id=None, acks=-1, timeout_ms=10_000, topic_data=[{
        "name": topic, "partition_data": [{"index": 0, "records": records}]}]))
    return r["responses"][0]["partition_responses"][0]


def marker(bootstrap: str, topic: str, pid: int, epoch: int, commit: bool) -> int:
    r = one(bootstrap, build(WriteTxnMarkersRequest, 1, markers=[{
        "producer_id": pid, "producer_epoch": epoch, "transaction_result": commit, "coordinator_epoch": 0,
        "topics": [{"name": topic, "partition_indexes": [0]}]}]))
    (m,) = r["markers"]
    assert m["producer_id"] == pid
    return m["topics"][0]["partitions"][0]["error_code"]


def latest(bootstrap: str, topic: str, isolation: int) -> int:
    r = one(bootstrap, build(ListOffsetsRequest, 7, replica_id=-1, isolation_level=isolation, topics=[{
        "name": topic, "partitions": [{"partition_index": 0, "current_leader_epoch": -1, "timestamp": -1}]}]))
    p = r["topics"][0]["partitions"][0]
    assert p["error_code"] == 0, p
    return p["offset"]


def fetch(bootstrap: str, topic: str, isolation: int) -> dict:
    r = one(bootstrap, build(FetchRequest, 11, replica_id=-1, max_wait_ms=0, min_bytes=0, max_bytes=1 << 20,
                             isolation_level=isolation, session_id=0, session_epoch=-1, topics=[{
                                 "topic": topic, "partitions": [{
                                     "partition": 0, "current_leader_epoch": -1, "fetch_offset": 0,
                                     "log_start_offset": -1, "partition_max_bytes": 1 << 20}]}],
                             forgotten_topics_data=[], rack_id=""))
    p = r["responses"][0]["partitions"][0]
    assert p["error_code"] == 0, p
    return p


def read(bootstrap: str, topic: str, isolation: str) -> list[tuple[int, bytes]]:
    """(offset, value) of every record a librdkafka consumer with `isolation` delivers, up to
    the partition's end for that isolation level."""
    c = consumer(bootstrap, **{"isolation.level": isolation, "enable.partition.eof": True})
    try:
        c.assign([TopicPartition(topic, 0, OFFSET_BEGINNING)])
        out = []
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            m = c.poll(0.5)
            if m is None:
                continue
            if m.error() is not None:
                if m.error().code() == KafkaError._PARTITION_EOF:
                    return out
                raise AssertionError(f"consumer error: {m.error()}")
            out.append((m.offset(), m.value()))
        raise AssertionError(f"no end of partition after {out}")
    finally:
        c.close()


def describe_producers(bootstrap: str, topic: str) -> dict[int, int]:
    r = one(bootstrap, build(DescribeProducersRequest, 0, topics=[{"name": topic, "partition_indexes": [0]}]))
    p = r["topics"][0]["partitions"][0]
    assert p["error_code"] == 0, p
    return {s["producer_id"]: s["current_txn_start_offset"] for s in p["active_producers"]}


def check_decided(bootstrap: str, topic: str, p1: int, p2: int) -> None:
    """The state after both transactions ended: p1's committed, p2's aborted."""
    committed = read(bootstrap, topic, "read_committed")
    assert [v for _, v in committed] == [b"plain-0", b"plain-1", b"p1-0", b"p1-1", b"p1-2", b"p1-3", b"tail"]
    everything = read(bootstrap, topic, "read_uncommitted")
    assert [v for _, v in everything] == [b"plain-0", b"plain-1", b"p1-0", b"p1-1", b"p2-0", b"p2-1", b"p1-2",
                                          b"p1-3", b"tail"]
    # Offsets: 0-1 plain, 2-3 p1, 4-5 p2, 6-7 p1, 8 p1's commit, 9 p2's abort, 10 tail.
    assert [o for o, _ in everything] == [0, 1, 2, 3, 4, 5, 6, 7, 10]
    assert latest(bootstrap, topic, READ_COMMITTED) == 11
    assert latest(bootstrap, topic, READ_UNCOMMITTED) == 11
    f = fetch(bootstrap, topic, READ_COMMITTED)
    assert (f["high_watermark"], f["last_stable_offset"]) == (11, 11)
    assert [(a["producer_id"], a["first_offset"]) for a in f["aborted_transactions"]] == [(p2, 4)]
    assert fetch(bootstrap, topic, READ_UNCOMMITTED)["aborted_transactions"] is None
    assert describe_producers(bootstrap, topic) == {p1: -1, p2: -1}


def test_markers_decide_what_read_committed_consumers_see_and_survive_restarts(fresh_broker):
    b = fresh_broker
    topic = "txn-log"
    create_topic(b.bootstrap, topic, 1)
    (p1, e1), (p2, e2) = producer_id(b.bootstrap), producer_id(b.bootstrap)

    assert produce(b.bootstrap, topic, txn_batch(-1, -1, -1, [b"plain-0", b"plain-1"], transactional=False))[
        "error_code"] == 0
    assert produce(b.bootstrap, topic, txn_batch(p1, e1, 0, [b"p1-0", b"p1-1"]))["base_offset"] == 2
    assert produce(b.bootstrap, topic, txn_batch(p2, e2, 0, [b"p2-0", b"p2-1"]))["base_offset"] == 4
    assert produce(b.bootstrap, topic, txn_batch(p1, e1, 2, [b"p1-2", b"p1-3"]))["base_offset"] == 6

    # Open transactions hold the last stable offset at the first of them.
    assert latest(b.bootstrap, topic, READ_COMMITTED) == 2
    assert latest(b.bootstrap, topic, READ_UNCOMMITTED) == 8
    f = fetch(b.bootstrap, topic, READ_COMMITTED)
    assert (f["high_watermark"], f["last_stable_offset"]) == (8, 2)
    assert [v for _, v in read(b.bootstrap, topic, "read_committed")] == [b"plain-0", b"plain-1"]
    assert len(read(b.bootstrap, topic, "read_uncommitted")) == 8
    assert describe_producers(b.bootstrap, topic) == {p1: 2, p2: 4}

    # A client may not write markers itself; a marker from an older epoch is refused.
    refused = produce(b.bootstrap, topic, txn_batch(p1, e1, -1, [b"x"], control=True))
    assert refused["error_code"] == INVALID_RECORD, refused
    assert marker(b.bootstrap, topic, p1, e1 - 1, COMMIT) == INVALID_PRODUCER_EPOCH

    assert marker(b.bootstrap, topic, p1, e1, COMMIT) == 0
    # p2's transaction (from offset 4) still holds the stable offset.
    assert latest(b.bootstrap, topic, READ_COMMITTED) == 4
    assert marker(b.bootstrap, topic, p2, e2, ABORT) == 0
    assert produce(b.bootstrap, topic, txn_batch(-1, -1, -1, [b"tail"], transactional=False))["base_offset"] == 10
    check_decided(b.bootstrap, topic, p1, p2)

    # The producer state, open transactions and aborted ones come back after a clean restart
    # and after a crash (replayed from the log).
    b.stop_cleanly()
    b.start()
    check_decided(b.bootstrap, topic, p1, p2)
    b.kill()
    b.start()
    check_decided(b.bootstrap, topic, p1, p2)


def test_an_open_transaction_survives_a_crash_and_its_abort_still_hides_it(fresh_broker):
    b = fresh_broker
    topic = "txn-open"
    create_topic(b.bootstrap, topic, 1)
    pid, epoch = producer_id(b.bootstrap)
    assert produce(b.bootstrap, topic, txn_batch(pid, epoch, 0, [b"a", b"b", b"c"]))["error_code"] == 0
    assert latest(b.bootstrap, topic, READ_COMMITTED) == 0
    b.kill()
    b.start()
    assert latest(b.bootstrap, topic, READ_COMMITTED) == 0
    assert describe_producers(b.bootstrap, topic) == {pid: 0}
    # The coordinator fences with a bumped epoch when it aborts (as Kafka's timeout abort does).
    assert marker(b.bootstrap, topic, pid, epoch + 1, ABORT) == 0
    assert latest(b.bootstrap, topic, READ_COMMITTED) == 4
    assert read(b.bootstrap, topic, "read_committed") == []
    assert [v for _, v in read(b.bootstrap, topic, "read_uncommitted")] == [b"a", b"b", b"c"]
    f = fetch(b.bootstrap, topic, READ_COMMITTED)
    assert [(a["producer_id"], a["first_offset"]) for a in f["aborted_transactions"]] == [(pid, 0)]
    # The old epoch is fenced for data too.
    stale = produce(b.bootstrap, topic, txn_batch(pid, epoch, 3, [b"d"]))
    assert stale["error_code"] == INVALID_PRODUCER_EPOCH, stale
