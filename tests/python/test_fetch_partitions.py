"""One Fetch of 1,000 partitions spread over both shards answers exactly what 1,000 Fetches of
one partition each answer: records, offsets and errors, without a session and with one (full,
then incremental), and with limits small enough that the response fills up, where it must follow
Kafka's rules: partitions in request (or session) order, whole batches, at most `max_bytes`
except that the first batch always goes, and partitions left out still listed with their high
watermark and log start offset.

Every batch produced here has the same size, so what a full response carries is fixed by those
rules alone (the broker reads the shards in parallel, each up to the limit, then trims in request
order; with batches of one size that trimming gives exactly the greedy fill modelled here).

The broker logs the work each fetch did (`sluice::fetch` at debug level); the test reads it to
check the work stays linear in the partitions asked for.
"""

from __future__ import annotations

import os
import random
import re
import signal
import struct
import uuid

import pytest
from kafka.protocol.consumer.fetch import FetchRequest
from kafka.protocol.metadata.metadata import MetadataRequest
from kafka.protocol.producer.produce import ProduceRequest

from conftest import BROKERS_KEY, _finish
from harness import Broker, create_topic
from wire import Pipeline, batch, build

TOPIC = "wide"
PARTITIONS = 1000
RECORDS_PER_BATCH = 3
# Small segments: preallocation stays small for 1,000 partitions, and segments roll, so reads
# after a restart come from closed segment files (spliced, `fetch.zero.copy`).
SEGMENT_BYTES = 300
UNKNOWN_TOPIC_OR_PARTITION = 3
UNKNOWN_TOPIC_ID = 100
BIG = 16 << 20
# Steps per partition a fetch may take (`Work` in broker/src/shard/read.rs): a handful of passes.
WORK_PER_PARTITION_MAX = 10
# A clean stop closes every log with its fsyncs, 64 at a time per shard: about 2.3 s for 1,000
# partitions in a debug build (11 s when they closed one after another), with room to spare on
# a loaded machine.
STOP_TIMEOUT_S = 60


@pytest.fixture(scope="module", autouse=True)
def work_log():
    """Started before the module's broker: it logs each fetch's work."""
    saved = os.environ.get("RUST_LOG")
    os.environ["RUST_LOG"] = "info,sluice::fetch=debug"
    yield
    if saved is None:
        del os.environ["RUST_LOG"]
    else:
        os.environ["RUST_LOG"] = saved


@pytest.fixture(scope="module")
def broker(request, work_log):
    """As conftest's `broker` (two shards), allowed the time a clean stop of 1,000 logs takes."""
    b = Broker(cores=2, num_partitions=3, name=request.module.__name__)
    request.node.stash[BROKERS_KEY] = request.node.stash.get(BROKERS_KEY, []) + [b]
    failed_before = request.session.testsfailed
    b.start()
    yield b
    if b.running():
        assert b.stop(signal.SIGTERM, timeout=STOP_TIMEOUT_S) == 0, b.log_tail()
    _finish(b, request.session.testsfailed > failed_before)


def batches_of(p: int) -> int:
    return 1 + p % 3


def value(p: int, b: int, r: int, round_: int = 0) -> bytes:
    # One length for every value, so every batch has one size.
    return f"{TOPIC}-{p:04d}-{b}-{r}-{round_}".encode()


def produce_round(bootstrap: str, partitions, b: int, round_: int = 0) -> None:
    """Batch `b` to each of `partitions`, in one Produce."""
    pipe = Pipeline(bootstrap)
    pipe.send(build(ProduceRequest, 9, acks=-1, timeout_ms=30_000, topic_data=[{
        "name": TOPIC, "partition_data": [
            {"index": p, "records": batch([value(p, b, r, round_) for r in range(RECORDS_PER_BATCH)],
                                          timestamp_ms=1_700_000_000_000)}
            for p in partitions]}]))
    (r,) = pipe.responses()
    pipe.close()
    for p in r["responses"][0]["partition_responses"]:
        assert p["error_code"] == 0, p


def fetch_request(parts, max_bytes=BIG, session=(0, -1), version=12, forgotten=(), by_id=None):
    """A Fetch of `parts`, (topic, partition, offset, partition_max_bytes) in order; consecutive
    partitions of one topic share a topic entry. `by_id` maps topic names to ids (v13+)."""
    topics = []
    for topic, p, offset, pmax in parts:
        if not topics or topics[-1][0] != topic:
            topics.append((topic, []))
        topics[-1][1].append({"partition": p, "current_leader_epoch": -1, "fetch_offset": offset,
                              "last_fetched_epoch": -1, "log_start_offset": -1, "partition_max_bytes": pmax})
    if version >= 13:
        entries = [{"topic": t, "topic_id": by_id[t], "partitions": ps} for t, ps in topics]
    else:
        entries = [{"topic": t, "partitions": ps} for t, ps in topics]
    return build(FetchRequest, version, replica_id=-1, max_wait_ms=0, min_bytes=0, max_bytes=max_bytes,
                 isolation_level=0, session_id=session[0], session_epoch=session[1], topics=entries,
                 forgotten_topics_data=list(forgotten), rack_id="")


def ask(bootstrap: str, *requests) -> list[dict]:
    pipe = Pipeline(bootstrap)
    out = ask_on(pipe, *requests)
    pipe.close()
    return out


def ask_on(pipe: Pipeline, *requests) -> list[dict]:
    """On one connection: a fetch session lives on the shard that accepted its connection."""
    for r in requests:
        pipe.send(r)
    return pipe.responses()


def flatten(response: dict, key: str = "topic") -> list[tuple]:
    """(topic, partition, error, high watermark, last stable, log start, records) in order."""
    assert response["error_code"] == 0, response["error_code"]
    return [(t[key], p["partition_index"], p["error_code"], p["high_watermark"], p["last_stable_offset"],
             p["log_start_offset"], p["records"] or b"")
            for t in response["responses"] for p in t["partitions"]]


def batch_sizes(records: bytes) -> list[int]:
    sizes, at = [], 0
    while at + 12 <= len(records):
        (length,) = struct.unpack(">i", records[at + 8:at + 12])
        sizes.append(12 + length)
        at += 12 + length
    assert at == len(records), "records end inside a batch"
    return sizes


def next_offset(records: bytes, offset: int) -> int:
    at, nxt = 0, offset
    while at + 61 <= len(records):
        base, length = struct.unpack(">qi", records[at:at + 12])
        (last_delta,) = struct.unpack(">i", records[at + 23:at + 27])
        nxt = base + last_delta + 1
        at += 12 + length
    return nxt


def reference(bootstrap: str, parts) -> dict:
    """What a Fetch of each partition alone answers, with limits nothing reaches."""
    answers = ask(bootstrap, *[fetch_request([(t, p, o, BIG)]) for t, p, o, _ in parts])
    out = {}
    for (t, p, o, _), a in zip(parts, answers):
        (row,) = flatten(a)
        out[(t, p, o)] = row
    return out


def greedy(parts, ref: dict, max_bytes: int) -> list[tuple]:
    """The response Kafka's rules give: in order, each partition the whole batches of its own
    answer that fit in min(partition_max_bytes, what is left), the first batch always."""
    out, total = [], 0
    for t, p, o, pmax in parts:
        row = ref[(t, p, o)]
        room = min(pmax, max_bytes - total)
        kept, used = 0, 0
        for size in batch_sizes(row[6]):
            if used + size > room and not (total == 0 and kept == 0):
                break
            used += size
            kept += 1
        total += used
        out.append(row[:6] + (row[6][:used],))
    return out


def works(broker, partitions: int) -> list[tuple[int, int]]:
    """(rounds, work) of each fetch the broker answered for `partitions` partitions so far."""
    pattern = re.compile(r"fetch answered .*?partitions=(\d+) rounds=(\d+) work=(\d+)")
    return [(int(m[2]), int(m[3])) for m in pattern.finditer(broker.log_text()) if int(m[1]) == partitions]


@pytest.fixture(scope="module")
def wide(broker):
    create_topic(broker.bootstrap, TOPIC, PARTITIONS, {"segment.bytes": str(SEGMENT_BYTES)})
    for b in range(3):
        produce_round(broker.bootstrap, [p for p in range(PARTITIONS) if batches_of(p) > b], b)
    # Request order: shuffled, so it interleaves the shards unevenly; some partitions from the
    # middle of a batch (the batch holding the offset comes whole) or from their end.
    order = list(range(PARTITIONS))
    random.Random(12).shuffle(order)
    parts = []
    for p in order:
        offset = {0: 1, 1: RECORDS_PER_BATCH * batches_of(p)}.get(p % 7, 0)
        parts.append((TOPIC, p, offset, BIG))
    return parts


def test_one_fetch_of_1000_partitions_answers_what_each_alone_does(broker, wide):
    unknown = [(TOPIC, PARTITIONS, 0, BIG), ("no-such-topic", 0, 0, BIG), (TOPIC, -1, 0, BIG)]
    parts = wide[:400] + unknown[:1] + wide[400:700] + unknown[1:] + wide[700:]
    ref = reference(broker.bootstrap, parts)
    (single,) = ask(broker.bootstrap, fetch_request(parts))
    assert flatten(single) == [ref[(t, p, o)] for t, p, o, _ in parts]
    rows = flatten(single)
    assert {r[2] for r in rows if r[0] != TOPIC or not 0 <= r[1] < PARTITIONS} == {UNKNOWN_TOPIC_OR_PARTITION}
    # The data is what was produced: every partition's high watermark, records from offset 0.
    for t, p, o, _ in wide:
        row = ref[(t, p, o)]
        assert row[2] == 0 and row[3] == RECORDS_PER_BATCH * batches_of(p), row[:6]
        if o == 0:
            assert value(p, 0, 0) in row[6]
    # Linear work: one fetch, one round.
    ((rounds, work),) = works(broker, len(parts))
    assert rounds == 1
    assert len(parts) <= work <= WORK_PER_PARTITION_MAX * len(parts), work


def test_by_topic_id_with_an_unknown_id_mixed_in(broker, wide):
    (md,) = ask(broker.bootstrap, build(MetadataRequest, 12, topics=[{"topic_id": None, "name": TOPIC}],
                                        allow_auto_topic_creation=False,
                                        include_topic_authorized_operations=False))
    topic_id = md["topics"][0]["topic_id"]
    stranger = uuid.uuid4()
    parts = wide[:500] + [("stranger", 0, 0, BIG)] + wide[500:]
    ref = reference(broker.bootstrap, wide)
    (single,) = ask(broker.bootstrap, fetch_request(parts, version=13,
                                                    by_id={TOPIC: topic_id, "stranger": stranger}))
    rows = flatten(single, key="topic_id")
    known = [r for r in rows if r[0] == topic_id]
    assert [r[1:] for r in known] == [ref[(t, p, o)][1:] for t, p, o, _ in wide]
    (odd,) = [r for r in rows if r[0] != topic_id]
    assert odd[0] == stranger and odd[1] == 0 and odd[2] == UNKNOWN_TOPIC_ID


@pytest.mark.parametrize("max_bytes", [10, 2_000, 40_000])
def test_a_full_response_fills_in_request_order(broker, wide, max_bytes):
    ref = reference(broker.bootstrap, wide)
    (single,) = ask(broker.bootstrap, fetch_request(wide, max_bytes=max_bytes))
    rows = flatten(single)
    assert rows == greedy(wide, ref, max_bytes)
    sizes = [sum(batch_sizes(r[6])) for r in rows]
    with_records = [i for i, s in enumerate(sizes) if s]
    # The first batch goes whatever the limit; beyond it the limit holds.
    assert with_records and sum(sizes) <= max(max_bytes, sizes[with_records[0]])
    if max_bytes < sizes[with_records[0]]:
        assert with_records == [with_records[0]] and len(batch_sizes(rows[with_records[0]][6])) == 1
    # The partitions left out are listed too, with their true offsets.
    assert len(rows) == PARTITIONS and all(r[3] == ref[(t, p, o)][3] for r, (t, p, o, _) in zip(rows, wide))
    assert sum(1 for s in sizes if s == 0) > 0


def test_the_partition_limit_holds_for_each_partition(broker, wide):
    ref = reference(broker.bootstrap, wide)
    one_batch = batch_sizes(ref[wide[0][:3]][6] or ref[wide[1][:3]][6])[0]
    parts = [(t, p, o, one_batch) for t, p, o, _ in wide]
    (single,) = ask(broker.bootstrap, fetch_request(parts))
    rows = flatten(single)
    assert rows == greedy(parts, ref, BIG)
    assert all(len(batch_sizes(r[6])) <= 1 for r in rows)


def test_sessions_full_then_incremental(broker, wide):
    parts = wide
    ref = reference(broker.bootstrap, parts)
    conn = Pipeline(broker.bootstrap)
    (full,) = ask_on(conn, fetch_request(parts, session=(0, 0)))
    session = full["session_id"]
    assert session > 0
    assert flatten(full) == [ref[(t, p, o)] for t, p, o, _ in parts]
    # The client moves each partition to where its records ended: nothing new, nothing listed.
    moved = [(t, p, next_offset(ref[(t, p, o)][6], o), pmax) for t, p, o, pmax in parts]
    (nothing,) = ask_on(conn, fetch_request(moved, session=(session, 1)))
    assert nothing["session_id"] == session and flatten(nothing) == []
    (still_nothing,) = ask_on(conn, fetch_request([], session=(session, 2)))
    assert flatten(still_nothing) == []
    # An incremental fetch with nothing new visits each partition a bounded number of times.
    rounds, work = works(broker, PARTITIONS)[-1]
    assert rounds == 1 and PARTITIONS <= work <= WORK_PER_PARTITION_MAX * PARTITIONS, work

    # New records on some partitions of both shards: exactly those come back, in session order.
    # Every partition that returned records moved to the back of the session, in request order;
    # the others (fetched at their end) stay in front.
    grown = [wide[i][1] for i in (3, 100, 101, 450, 451, 452, 998)]
    produce_round(broker.bootstrap, grown, 7, round_=1)
    (news,) = ask_on(conn, fetch_request([], session=(session, 3)))
    served = [q for q in parts if ref[q[:3]][6]]
    unserved = [q for q in parts if not ref[q[:3]][6]]
    order = [q[1] for q in unserved + served]
    expected_parts = sorted((moved[[q[1] for q in parts].index(p)] for p in grown),
                            key=lambda q: order.index(q[1]))
    expected = reference(broker.bootstrap, expected_parts)
    rows = flatten(news)
    assert [r[1] for r in rows] == [q[1] for q in expected_parts]
    assert rows == [expected[q[:3]] for q in expected_parts]
    assert all(r[6] for r in rows), "each grown partition carries its new records"
    # Forgotten partitions leave the session: forgetting the grown ones, nothing is left to say.
    (forgot,) = ask_on(conn, fetch_request(
        [], session=(session, 4), forgotten=[{"topic": TOPIC, "partitions": grown}]))
    assert flatten(forgot) == []
    (closed,) = ask_on(conn, fetch_request([], session=(session, -1)))
    assert closed["session_id"] == 0
    conn.close()


def test_a_session_serves_the_partitions_left_out_first(broker, wide):
    """With a small limit, the next incremental response starts with the partitions the last
    one left out (served ones moved to the back)."""
    max_bytes = 3_000
    # Only partitions fetched from offset 0, so that each has records.
    parts = [q for q in wide if q[2] == 0]
    ref = reference(broker.bootstrap, parts)
    conn = Pipeline(broker.bootstrap)
    (full,) = ask_on(conn, fetch_request(parts, max_bytes=max_bytes, session=(0, 0)))
    session = full["session_id"]
    first = flatten(full)
    assert first == greedy(parts, ref, max_bytes)
    served = [(q, row) for q, row in zip(parts, first) if row[6]]
    assert 0 < len(served) < len(parts)
    # The client sends the new offsets of the partitions that returned records.
    updated = [(t, p, next_offset(row[6], o), pmax) for (t, p, o, pmax), row in served]
    (second,) = ask_on(conn, fetch_request(updated, max_bytes=max_bytes, session=(session, 1)))
    served_keys = {q[1] for q, _ in served}
    session_order = [q for q in parts if q[1] not in served_keys] + updated
    ref2 = reference(broker.bootstrap, session_order)
    expected = [row for row in greedy(session_order, ref2, max_bytes) if row[6]]
    assert flatten(second) == expected
    assert flatten(second)[0][1] == next(q[1] for q in parts if q[1] not in served_keys)
    conn.close()


def test_after_a_restart_reads_from_segment_files_answer_the_same(broker, wide):
    """A restart empties the batch cache: records now come from the segment files (spliced
    where the segment is closed, and then from one segment only, so perhaps fewer batches than
    the cache gave), and one fetch of all still answers what each alone does."""
    before = reference(broker.bootstrap, wide)
    assert broker.stop(signal.SIGTERM, timeout=STOP_TIMEOUT_S) == 0, broker.log_tail()
    broker.start()
    (single,) = ask(broker.bootstrap, fetch_request(wide))
    after = reference(broker.bootstrap, wide)
    assert flatten(single) == [after[q[:3]] for q in wide]
    for q in wide:
        assert after[q[:3]][:6] == before[q[:3]][:6]
        assert before[q[:3]][6].startswith(after[q[:3]][6])
        assert bool(after[q[:3]][6]) == bool(before[q[:3]][6]), q
    (tiny,) = ask(broker.bootstrap, fetch_request(wide, max_bytes=10))
    assert flatten(tiny) == greedy(wide, after, 10)
