"""Durability across restarts of a real `sluice`: every message the broker acknowledged (acks=all,
default flush.mode=batch) is there after SIGTERM and after SIGKILL in the middle of a produce
stream, once, at the offset it was acknowledged at."""

from __future__ import annotations

import re
import signal
import time
from collections import defaultdict

import pytest
from confluent_kafka import TopicPartition

from harness import admin, assert_all_delivered, consumer, create_topic, digest, produce_all, producer, read_to_end, unanswered_partitions, watermarks

TOPIC = "durable"
PARTITIONS = 4
CLEAN_COUNT = 20_000
# Each SIGKILL comes once this many more messages were acknowledged since the last restart.
KILL_AFTER_ACKS = 15_000
KILL_CYCLES = 3
# Messages the producer still sends into the dead broker after the kill.
SENT_AFTER_KILL = 2_000


def key_of(seq: int) -> bytes:
    return b"k%d" % (seq % 500)


def value_of(seq: int) -> bytes:
    return b"%d|%s" % (seq, digest("restart", seq).encode())


def read_all(broker) -> tuple[dict, list]:
    """Reads every partition from 0 to its high watermark. Returns {seq: [(partition, offset)]}
    and the raw messages; checks payloads and that offsets run 0, 1, 2, ... with no gap."""
    c = consumer(broker.bootstrap)
    marks = watermarks(c, TOPIC, PARTITIONS)
    for p, (low, _) in marks.items():
        assert low == 0, f"partition {p} starts at {low}"
    c.assign([TopicPartition(TOPIC, p, 0) for p in range(PARTITIONS)])
    msgs = read_to_end(c, {(TOPIC, p): marks[p][1] for p in range(PARTITIONS)})
    c.close()
    where = defaultdict(list)
    offsets = defaultdict(list)
    for m in msgs:
        seq = int(m.value().split(b"|", 1)[0])
        assert (m.key(), m.value()) == (key_of(seq), value_of(seq)), f"message {seq} is damaged"
        where[seq].append((m.partition(), m.offset()))
        offsets[m.partition()].append(m.offset())
    for p in range(PARTITIONS):
        assert offsets[p] == list(range(marks[p][1])), f"partition {p} offsets have gaps or repeats"
    return where, msgs


def check_acknowledged(where: dict, acked: dict) -> None:
    missing = [s for s in acked if s not in where]
    assert not missing, f"{len(missing)} of {len(acked)} acknowledged messages are gone, e.g. {sorted(missing)[:5]}"
    twice = [s for s in acked if len(where[s]) != 1]
    assert not twice, f"acknowledged messages stored more than once: {[(s, where[s]) for s in twice[:5]]}"
    moved = [(s, acked[s], where[s][0]) for s in acked if where[s][0] != acked[s]]
    assert not moved, f"acknowledged messages not at their acknowledged offset: {moved[:5]}"


def test_acknowledged_messages_survive_sigterm_and_sigkill(fresh_broker):
    broker = fresh_broker
    create_topic(broker.bootstrap, TOPIC, PARTITIONS)
    acked: dict[int, tuple[int, int]] = {}

    # 1. Acknowledged, clean shutdown, restart: all there.
    reports = produce_all(producer(broker.bootstrap), TOPIC, ({"key": key_of(s), "value": value_of(s)} for s in range(CLEAN_COUNT)))
    assert_all_delivered(reports)
    acked.update({s: (r.partition, r.offset) for s, r in enumerate(reports)})
    broker.restart()  # SIGTERM; fails unless the broker exits 0
    stopped = broker.log_text().rsplit("===== start 2 =====", 1)[0]
    assert stopped.count("shard stopped cleanly") == 2, "both shards should report a clean stop"
    # Shards open their partitions before serving, but the port answers once any shard serves.
    deadline = time.monotonic() + 10
    while len(reopened := re.findall(rf"log opened dir=\S*/{TOPIC}-\d+ .*", broker.current_log())) < PARTITIONS:
        assert time.monotonic() < deadline, f"only these partitions were opened: {reopened}"
        time.sleep(0.05)
    assert len(reopened) == PARTITIONS, reopened
    assert all("clean=true" in line for line in reopened), f"a cleanly closed log was recovered as unclean: {reopened}"
    where, msgs = read_all(broker)
    assert len(msgs) == CLEAN_COUNT
    check_acknowledged(where, acked)

    # 2. SIGKILL while a producer is sending, restart: every acknowledged message is there once.
    next_seq = CLEAN_COUNT
    for cycle in range(KILL_CYCLES):
        p = producer(broker.bootstrap, **{"linger.ms": 5, "message.timeout.ms": 30_000, "retries": 0})
        ok: dict[int, tuple[int, int]] = {}
        failed: set[int] = set()

        def on_delivery(err, msg):
            seq = int(msg.value().split(b"|", 1)[0])
            if err is None:
                ok[seq] = (msg.partition(), msg.offset())
            else:
                failed.add(seq)

        killed = False
        in_flight_at_kill = 0
        sent_after_kill = 0
        while sent_after_kill < SENT_AFTER_KILL:
            try:
                p.produce(TOPIC, key=key_of(next_seq), value=value_of(next_seq), on_delivery=on_delivery)
            except BufferError:
                p.poll(0.01)
                continue
            next_seq += 1
            p.poll(0)
            if killed:
                sent_after_kill += 1
            elif len(ok) >= KILL_AFTER_ACKS and (in_flight := len(p)) > 0:
                # Killed while messages are in flight; on a busy machine the producer may
                # momentarily have everything acknowledged, and then the kill waits.
                in_flight_at_kill = in_flight
                broker.kill()
                killed = True
        # Nothing may reach a restarted broker from this producer: drop what it still holds.
        p.purge()
        assert p.flush(30) == 0
        del p
        assert in_flight_at_kill > 0, "the kill should come while messages are in flight"
        assert failed, f"cycle {cycle}: no send failed, so the kill was not mid-stream"
        assert not (set(ok) & failed)
        acked.update(ok)

        broker.start()
        where, msgs = read_all(broker)
        check_acknowledged(where, acked)
        print(f"cycle {cycle}: {len(ok)} acknowledged, {len(failed)} failed, {len(msgs)} stored in all")

    # 3. The recovered log takes new appends right after its end.
    c = consumer(broker.bootstrap)
    ends = {p: h for p, (_, h) in watermarks(c, TOPIC, PARTITIONS).items()}
    c.close()
    more = produce_all(producer(broker.bootstrap), TOPIC, ({"partition": q, "key": key_of(next_seq + q), "value": value_of(next_seq + q)} for q in range(PARTITIONS)))
    assert_all_delivered(more)
    assert [(r.partition, r.offset) for r in more] == [(q, ends[q]) for q in range(PARTITIONS)]
    acked.update({next_seq + q: (r.partition, r.offset) for q, r in enumerate(more)})
    where, _ = read_all(broker)
    check_acknowledged(where, acked)


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGKILL], ids=["sigterm", "sigkill"])
def test_restart_on_the_same_port_with_clients_connected(fresh_broker, sig):
    """Clients hold connections when the broker stops; it comes back on the same port at once,
    and the same clients carry on. (Before 4368a3f the start-up port check failed for about 60 s
    on the stopped broker's connections in TIME_WAIT.)"""
    broker = fresh_broker
    create_topic(broker.bootstrap, TOPIC, 1)
    p = producer(broker.bootstrap)
    c = consumer(broker.bootstrap)
    assert_all_delivered(produce_all(p, TOPIC, [{"key": key_of(s), "value": value_of(s)} for s in range(10)]))
    c.assign([TopicPartition(TOPIC, 0, 0)])
    assert len(read_to_end(c, {(TOPIC, 0): 10})) == 10
    if sig == signal.SIGKILL:
        broker.kill()
        broker.start()
    else:
        broker.restart(sig)
    assert_all_delivered(produce_all(p, TOPIC, [{"key": key_of(10), "value": value_of(10)}]))
    c.assign([TopicPartition(TOPIC, 0, 0)])
    assert [m.offset() for m in read_to_end(c, {(TOPIC, 0): 11})] == list(range(11))
    c.close()


def test_every_listed_partition_answers_once_the_port_does(fresh_broker):
    broker = fresh_broker
    topic = "recovering"
    create_topic(broker.bootstrap, topic, 2)
    # Partition 0 gets enough data that recovering it takes a while; partition 1 almost none, so
    # the shards finish opening at different times.
    big = produce_all(producer(broker.bootstrap, **{"linger.ms": 20}), topic, ({"partition": 0, "value": b"r" * 200} for _ in range(600_000)))
    assert_all_delivered(big)
    assert_all_delivered(produce_all(producer(broker.bootstrap), topic, [{"partition": 1, "value": b"small"}]))
    broker.kill()
    broker.start(new_port=True, wait_for_partitions=False)
    missing = unanswered_partitions(admin(broker.bootstrap))
    assert missing == [], f"{len(missing)} listed partitions did not answer ListOffsets: {missing[:3]}"
