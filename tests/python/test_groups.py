"""Consumer groups against a real `sluice --cores 2`, driven by confluent-kafka (librdkafka), with
both the classic protocol (JoinGroup/SyncGroup/Heartbeat, eager and cooperative-sticky) and the
KIP-848 consumer protocol (`group.protocol=consumer`, ConsumerGroupHeartbeat).

Group members run as separate Python processes (this file run as a script, see `member_main`),
so one can be killed with SIGKILL. Each member writes a JSON line, flushed to the OS at once, for
everything it does: partitions assigned, revoked or lost (with CLOCK_MONOTONIC timestamps, which
every process on the machine shares), each batch it consumed, each commit it sent and its
outcome. The tests read those logs back and check, from the data:

- at every moment each partition has at most one owner, and every message a member consumed was
  consumed while it owned that partition;
- with no failure, every message is consumed exactly once; after a member is killed, nothing is
  lost and only messages at or after its last commit are consumed again, by the new owner, which
  starts exactly at that commit;
- the final assignment covers every partition once, and the broker (DescribeGroups /
  ConsumerGroupDescribe) reports the same assignment as the members themselves;
- committed offsets survive broker restarts, two groups read a topic independently, and
  `sluice group reset-offsets` moves where a group starts.

Every member commits synchronously after each batch it processed (the next offset of the last
message per partition), and in its revoke callback commits what it processed of the revoked
partitions (only if uncommitted, or in any case for `revoke_commit="always"`).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
import traceback
from collections import Counter, defaultdict
from dataclasses import dataclass
from pathlib import Path

import pytest
from confluent_kafka import Consumer, ConsumerGroupState, KafkaException, TopicPartition
from confluent_kafka import ConsumerGroupTopicPartitions

from harness import SLUICE_BIN, admin, assert_all_delivered, create_topic, digest, produce_all, producer

# A new group waits this long for more members before its first assignment (Kafka's default,
# 3000 ms, would make every test here wait 3 s per new group).
INITIAL_REBALANCE_DELAY_MS = 300
# The broker's group.consumer.session.timeout.ms and group.consumer.heartbeat.interval.ms for
# KIP-848 members (Kafka's default session timeout, 45 s, would make the kill test wait that long).
CONSUMER_SESSION_TIMEOUT_MS = 6_000
CONSUMER_HEARTBEAT_MS = 2_000
BROKER_ARGS = [
    "--group-initial-rebalance-delay-ms",
    str(INITIAL_REBALANCE_DELAY_MS),
    "--group-consumer-session-timeout-ms",
    str(CONSUMER_SESSION_TIMEOUT_MS),
    "--group-consumer-heartbeat-interval-ms",
    str(CONSUMER_HEARTBEAT_MS),
]

PARTITIONS = 6
STREAM_COUNT = 30_000
# Messages per second while members come, go and die: the stream lasts about 6 s.
STREAM_RATE = 5_000
KEYS = 997

CLASSIC_SESSION_TIMEOUT_MS = 6_000
CLASSIC_HEARTBEAT_MS = 1_000
CLASSIC = {"session.timeout.ms": CLASSIC_SESSION_TIMEOUT_MS, "heartbeat.interval.ms": CLASSIC_HEARTBEAT_MS}
# KIP-848: the broker owns the session timeout, heartbeat interval and assignor; the client's
# session.timeout.ms and partition.assignment.strategy do not apply, so none are set.
CONSUMER = {"group.protocol": "consumer"}
PROTOCOLS = {"classic": CLASSIC, "consumer": CONSUMER}

# Bounds for a stuck broker or client; a passing run takes a fraction of these.
DONE_TIMEOUT_S = 90
STABLE_TIMEOUT_S = 30


def key_of(seq: int) -> bytes:
    return b"k%03d" % ((seq * 7919) % KEYS)


def value_of(seq: int) -> bytes:
    return b"%d|%s" % (seq, digest("groups", seq)[:24].encode())


def seq_of(value: bytes) -> int:
    return int(value.split(b"|", 1)[0])


# ---- the member process ---------------------------------------------------------------------


def member_main(spec: dict) -> int:
    """One group member: subscribes, consumes, commits after every batch, logs everything to
    spec["log"] (one JSON object per line) until spec["stop"] exists, then closes."""
    log = open(spec["log"], "a", buffering=1)  # line-buffered: each event reaches the OS at once
    topic = spec["topic"]
    commit_delay = spec.get("commit_delay", 0.0)
    # "pending": the revoke callback commits what was processed but not committed yet;
    # "always": it commits the processed positions of the revoked partitions in any case.
    revoke_commit = spec.get("revoke_commit", "pending")

    def emit(ev: str, **fields) -> None:
        log.write(json.dumps({"t": time.monotonic(), "ev": ev, **fields}) + "\n")

    processed: dict[int, int] = {}  # partition -> next offset after the last processed message
    committed: dict[int, int] = {}

    def commit(offsets: dict[int, int], where: str) -> None:
        emit("committing", where=where, offsets=offsets)
        try:
            result = c.commit(offsets=[TopicPartition(topic, p, o) for p, o in offsets.items()], asynchronous=False)
        except KafkaException as e:
            emit("commit_failed", where=where, offsets=offsets, error=str(e))
            return
        ok = {tp.partition: tp.offset for tp in result if tp.error is None}
        failed = {tp.partition: str(tp.error) for tp in result if tp.error is not None}
        for p, o in ok.items():
            committed[p] = max(committed.get(p, -1), o)
        emit("committed", where=where, offsets=ok, errors=failed)

    def on_assign(consumer, parts):
        emit("assign", parts=sorted(tp.partition for tp in parts))

    def on_revoke(consumer, parts):
        ps = sorted(tp.partition for tp in parts)
        if revoke_commit == "always":
            pending = {p: processed[p] for p in ps if p in processed}
        else:
            pending = {p: processed[p] for p in ps if processed.get(p, -1) > committed.get(p, -1)}
        if pending:
            commit(pending, "revoke")
        for p in ps:
            processed.pop(p, None)
            committed.pop(p, None)
        emit("revoke", parts=ps)

    def on_lost(consumer, parts):
        ps = sorted(tp.partition for tp in parts)
        for p in ps:
            processed.pop(p, None)
            committed.pop(p, None)
        emit("lost", parts=ps)

    config = {
        "bootstrap.servers": spec["bootstrap"],
        "group.id": spec["group"],
        "client.id": spec["name"],
        "enable.auto.commit": False,
        "auto.offset.reset": "earliest",
        "fetch.wait.max.ms": 100,
        "log.connection.close": False,
        **spec.get("config", {}),
    }
    c = Consumer(config)
    c.subscribe([topic], on_assign=on_assign, on_revoke=on_revoke, on_lost=on_lost)
    emit("started", pid=os.getpid())
    stop = Path(spec["stop"])
    while not stop.exists():
        msgs = c.consume(num_messages=500, timeout=0.2)
        if not msgs:
            continue
        records = []
        batch: dict[int, int] = {}
        for m in msgs:
            err = m.error()
            if err is not None:
                emit("error", code=err.code(), error=str(err))
                continue
            seq = seq_of(m.value())
            if m.key() != key_of(seq) or m.value() != value_of(seq):
                emit("damaged", partition=m.partition(), offset=m.offset(), key=repr(m.key()), value=repr(m.value()))
            records.append([m.partition(), m.offset(), seq])
            batch[m.partition()] = m.offset() + 1
        if not records:
            continue
        emit("consumed", records=records)
        processed.update(batch)
        if commit_delay:
            time.sleep(commit_delay)
        commit(batch, "batch")
    emit("stopping", assignment=sorted(tp.partition for tp in c.assignment()))
    c.close()
    emit("closed")
    log.close()
    return 0


# ---- the test side of members -----------------------------------------------------------------


class Member:
    """A member process this test started, and the events it logged so far."""

    def __init__(
        self,
        workdir: Path,
        name: str,
        bootstrap: str,
        group: str,
        topic: str,
        config: dict,
        commit_delay: float = 0.0,
        revoke_commit: str = "pending",
    ):
        self.name = name
        self.log_path = workdir / f"{name}.jsonl"
        self.stop_path = workdir / f"{name}.stop"
        self.stderr_path = workdir / f"{name}.stderr"
        spec = {
            "name": name,
            "bootstrap": bootstrap,
            "group": group,
            "topic": topic,
            "config": config,
            "commit_delay": commit_delay,
            "revoke_commit": revoke_commit,
            "log": str(self.log_path),
            "stop": str(self.stop_path),
        }
        self.killed_at: float | None = None
        with open(self.stderr_path, "ab") as err:
            self.proc = subprocess.Popen(
                [sys.executable, __file__, "--member", json.dumps(spec)],
                stdin=subprocess.DEVNULL,
                stdout=err,
                stderr=subprocess.STDOUT,
            )
        self._events: list[dict] = []
        self._pos = 0

    def events(self) -> list[dict]:
        """Every complete line logged so far (read incrementally)."""
        try:
            with open(self.log_path, "rb") as f:
                f.seek(self._pos)
                data = f.read()
        except FileNotFoundError:
            return self._events
        end = data.rfind(b"\n") + 1
        for line in data[:end].splitlines():
            e = json.loads(line)
            e["member"] = self.name
            self._events.append(e)
        self._pos += end
        return self._events

    def kill(self) -> float:
        """SIGKILL to this member's PID; returns the moment it was sent."""
        self.killed_at = time.monotonic()
        os.kill(self.proc.pid, signal.SIGKILL)
        self.proc.wait(timeout=10)
        return self.killed_at

    def request_stop(self) -> None:
        self.stop_path.touch()

    def wait_stopped(self, timeout: float = 30.0) -> None:
        try:
            code = self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            raise AssertionError(f"member {self.name} did not close within {timeout} s\n{self.stderr()}")
        assert code == 0, f"member {self.name} exited with {code}\n{self.stderr()}"
        assert self.events()[-1]["ev"] == "closed", f"member {self.name} did not log its close"

    def stderr(self) -> str:
        try:
            return f"--- {self.stderr_path} ---\n" + self.stderr_path.read_text(errors="replace")[-4000:]
        except FileNotFoundError:
            return ""

    def check_alive(self) -> None:
        code = self.proc.poll()
        if code is not None and self.killed_at is None:
            raise AssertionError(f"member {self.name} exited with {code}\n{self.stderr()}")


@pytest.fixture
def members(tmp_path):
    """Starts member processes; at teardown any still running gets SIGKILL (by its PID)."""
    started: list[Member] = []

    def start(name: str, *args, **kwargs) -> Member:
        m = Member(tmp_path, name, *args, **kwargs)
        started.append(m)
        return m

    yield start
    for m in started:
        if m.proc.poll() is None:
            os.kill(m.proc.pid, signal.SIGKILL)
            m.proc.wait(timeout=10)


class Feeder(threading.Thread):
    """Produces `count` keyed messages at about `rate` per second (acks=all) in the background
    and keeps their delivery reports. With `hold_at`, it stops after that many messages until
    `release()`: a test that needs messages to flow after some event holds the end back."""

    def __init__(
        self, bootstrap: str, topic: str, count: int = STREAM_COUNT, rate: float = STREAM_RATE, hold_at: int | None = None
    ):
        super().__init__(daemon=True)
        self.bootstrap, self.topic, self.count, self.rate = bootstrap, topic, count, rate
        self.hold_at = hold_at
        self.released = threading.Event()
        self.sent = 0
        self.reports = None
        self.error: BaseException | None = None
        self._at = self._ends = None

    def release(self) -> None:
        self.released.set()

    def paced(self):
        started = time.monotonic()
        for seq in range(self.count):
            if seq == self.hold_at:
                assert self.released.wait(timeout=60), f"the stream was held at {seq} messages for 60 s"
                started = time.monotonic() - seq / self.rate
            if seq % 250 == 0:
                ahead = started + seq / self.rate - time.monotonic()
                if ahead > 0:
                    time.sleep(ahead)
            self.sent = seq
            yield {"key": key_of(seq), "value": value_of(seq)}

    def run(self) -> None:
        try:
            self.reports = produce_all(producer(self.bootstrap), self.topic, self.paced(), flush_timeout=60)
        except BaseException as e:  # re-raised by result()
            self.error = e

    def done(self) -> bool:
        return not self.is_alive()

    def result(self) -> dict[tuple[int, int], int]:
        """{(partition, offset): seq} of every message; fails unless every one was acknowledged."""
        self.join(timeout=90)
        assert not self.is_alive(), "the producer is still running after 90 s"
        if self.error is not None:
            raise self.error
        if self._at is None:
            assert_all_delivered(self.reports)
            at = {(r.partition, r.offset): seq for seq, r in enumerate(self.reports)}
            assert len(at) == self.count, "two messages were acknowledged at the same offset"
            self._at, self._ends = at, ends_of(at)
        return self._at

    def ends(self) -> dict[int, int]:
        self.result()
        return self._ends


def produce_stream(bootstrap: str, topic: str, count: int) -> dict[tuple[int, int], int]:
    """Produces `count` keyed messages at once; returns {(partition, offset): seq}."""
    reports = produce_all(producer(bootstrap), topic, ({"key": key_of(s), "value": value_of(s)} for s in range(count)))
    assert_all_delivered(reports)
    return {(r.partition, r.offset): seq for seq, r in enumerate(reports)}


def ends_of(at: dict[tuple[int, int], int]) -> dict[int, int]:
    ends = defaultdict(int)
    for p, o in at:
        ends[p] = max(ends[p], o + 1)
    for p, end in ends.items():
        assert sum(1 for q, _ in at if q == p) == end, f"partition {p} offsets have gaps"
    return dict(ends)


# ---- reading the members' logs -----------------------------------------------------------------


@dataclass
class Interval:
    member: str
    partition: int
    start: float
    end: float  # inf while still owned


def all_events(ms: list[Member]) -> list[dict]:
    return sorted((e for m in ms for e in m.events()), key=lambda e: e["t"])


def ownership(ms: list[Member]) -> tuple[list[Interval], dict[str, set[int]]]:
    """Replays each member's assign/revoke/lost events: every interval a member owned a
    partition (from its assign callback to the end of its revoke or lost callback, or its
    SIGKILL), and what each member owns now. Fails on an assign of an owned partition or a
    revoke of one not owned."""
    intervals = []
    now = {}
    for m in ms:
        owned: dict[int, float] = {}
        for e in m.events():
            if e["ev"] == "assign":
                for p in e["parts"]:
                    assert p not in owned, f"{m.name} was assigned partition {p} it already owned (t={e['t']:.3f})"
                    owned[p] = e["t"]
            elif e["ev"] in ("revoke", "lost"):
                for p in e["parts"]:
                    assert p in owned, f"{m.name}: {e['ev']} of partition {p} it did not own (t={e['t']:.3f})"
                    intervals.append(Interval(m.name, p, owned.pop(p), e["t"]))
        end = m.killed_at if m.killed_at is not None else float("inf")
        intervals += [Interval(m.name, p, start, end) for p, start in owned.items()]
        now[m.name] = set(owned) if m.killed_at is None else set()
    return intervals, now


def check_single_owner(ms: list[Member]) -> list[Interval]:
    """At every moment each partition has at most one owner, and each consumed batch was
    consumed by the owner of its partitions at that moment."""
    intervals, _ = ownership(ms)
    by_partition = defaultdict(list)
    for i in intervals:
        by_partition[i.partition].append(i)
    for p, spans in by_partition.items():
        spans.sort(key=lambda i: i.start)
        for a, b in zip(spans, spans[1:]):
            assert b.start >= a.end, (
                f"partition {p} had two owners: {a.member} from {a.start:.3f} to {a.end:.3f} and "
                f"{b.member} from {b.start:.3f}"
            )
    for e in all_events(ms):
        if e["ev"] != "consumed":
            continue
        for p in {r[0] for r in e["records"]}:
            assert any(
                i.member == e["member"] and i.partition == p and i.start <= e["t"] <= i.end for i in by_partition[p]
            ), f"{e['member']} consumed from partition {p} at {e['t']:.3f} without owning it"
    return intervals


def consumed(ms: list[Member]) -> list[tuple[str, float, int, int, int]]:
    """(member, t, partition, offset, seq) of every message consumed."""
    return [(e["member"], e["t"], p, o, s) for e in all_events(ms) if e["ev"] == "consumed" for p, o, s in e["records"]]


def check_records(ms: list[Member], at: dict[tuple[int, int], int]) -> Counter:
    """Every consumed message is the one acknowledged at its offset and none was damaged or
    failed; returns how often each (partition, offset) was consumed."""
    bad = [e for e in all_events(ms) if e["ev"] in ("damaged", "error")]
    assert not bad, f"members logged damaged messages or consumer errors: {bad[:5]}"
    counts = Counter()
    for member, _, p, o, seq in consumed(ms):
        assert at.get((p, o)) == seq, f"{member} read seq {seq} at {p}@{o}, acknowledged there was {at.get((p, o))}"
        counts[(p, o)] += 1
    return counts


def commit_failures(ms: list[Member]) -> list[dict]:
    return [e for e in all_events(ms) if e["ev"] == "commit_failed" or (e["ev"] == "committed" and e["errors"])]


def check_commits(ms: list[Member]) -> None:
    # A member's very last commit, made in the revoke callback of its close() after the others
    # have left, may be sent by librdkafka outside the group (generation -1), which Kafka, like
    # Sluice, refuses with UNKNOWN_MEMBER_ID while the group still has members. Every other
    # commit must succeed; exactly-once consumption is checked separately.
    events = all_events(ms)
    last_commit_t = {}
    for e in events:
        if e["ev"] in ("commit_failed", "committed"):
            last_commit_t[e["member"]] = e["t"]
    failed = [
        e
        for e in commit_failures(ms)
        if not (
            e["ev"] == "commit_failed"
            and e.get("where") == "revoke"
            and "UNKNOWN_MEMBER_ID" in e.get("error", "")
            and e["t"] == last_commit_t.get(e["member"])
        )
    ]
    assert not failed, f"{len(failed)} commits failed, first: {failed[:3]}"


def committed_max(ms: list[Member]) -> dict[int, int]:
    best = defaultdict(lambda: -1)
    for e in all_events(ms):
        if e["ev"] == "committed":
            for p, o in e["offsets"].items():
                best[int(p)] = max(best[int(p)], o)
    return best


def wait_until(what: str, predicate, ms: list[Member], timeout: float, poll: float = 0.25):
    deadline = time.monotonic() + timeout
    while True:
        for m in ms:
            m.check_alive()
        result = predicate()
        if result:
            return result
        if time.monotonic() > deadline:
            _, now = ownership(ms)
            raise AssertionError(
                f"timed out after {timeout} s waiting for {what}; members own {now}, "
                f"committed {dict(committed_max(ms))}\n" + "\n".join(m.stderr() for m in ms)
            )
        time.sleep(poll)


def balanced(ms: list[Member], live: list[Member]) -> dict[str, set[int]] | None:
    """What each live member owns, once every partition has exactly one live owner and the
    counts differ by at most one; else None."""
    _, now = ownership(ms)
    owned = [now[m.name] for m in live]
    if sorted(p for s in owned for p in s) != list(range(PARTITIONS)):
        return None
    if max(map(len, owned)) - min(map(len, owned)) > 1:
        return None
    return {m.name: now[m.name] for m in live}


def all_committed(ms: list[Member], feeder: Feeder | None, ends: dict[int, int] | None = None) -> bool:
    if feeder is not None:
        if not feeder.done():
            return False
        ends = feeder.ends()
    best = committed_max(ms)
    return all(best[p] >= ends[p] for p in range(PARTITIONS))


def broker_assignment(bootstrap: str, group: str) -> tuple[object, dict[str, set[int]]]:
    """The broker's view (DescribeGroups, or ConsumerGroupDescribe for KIP-848 groups): the
    state and each member's assignment, by client.id."""
    client = admin(bootstrap)  # kept alive until the future completes
    description = client.describe_consumer_groups([group], request_timeout=10)[group].result(timeout=15)
    return description.state, {
        m.client_id: {tp.partition for tp in m.assignment.topic_partitions} for m in description.members
    }


def wait_broker_agrees(bootstrap: str, group: str, expected: dict[str, set[int]], ms: list[Member]) -> None:
    """The broker reports the group Stable with the members and assignment the members logged."""
    last = []

    def agrees():
        state, seen = broker_assignment(bootstrap, group)
        last[:] = [state, seen]
        return state == ConsumerGroupState.STABLE and seen == expected

    try:
        wait_until("the broker's description to match the members' assignment", agrees, ms, 15)
    except AssertionError as e:
        raise AssertionError(f"{e}\nbroker says {last}, members logged {expected}") from None


def group_offsets(bootstrap: str, group: str, topic: str, partitions: int = PARTITIONS) -> dict[int, int]:
    """The group's committed offsets (OffsetFetch), -1001 where there is none."""
    request = ConsumerGroupTopicPartitions(group, [TopicPartition(topic, p) for p in range(partitions)])
    client = admin(bootstrap)  # kept alive until the future completes
    result = client.list_consumer_group_offsets([request], request_timeout=10)[group].result(timeout=15)
    for tp in result.topic_partitions:
        assert tp.error is None, f"OffsetFetch for {group} {tp.partition}: {tp.error}"
    return {tp.partition: tp.offset for tp in result.topic_partitions}


def stop_all(ms: list[Member]) -> None:
    for m in ms:
        if m.killed_at is None:
            m.request_stop()
    for m in ms:
        if m.killed_at is None:
            m.wait_stopped()


def nothing_lost(counts: Counter, at: dict[tuple[int, int], int]) -> None:
    missing = sorted(set(at) - set(counts))
    assert not missing, f"{len(missing)} of {len(at)} messages never consumed, e.g. {missing[:5]}"


def exactly_once(counts: Counter, at: dict[tuple[int, int], int]) -> None:
    nothing_lost(counts, at)
    twice = sorted(k for k, n in counts.items() if n > 1)
    assert not twice, f"{len(twice)} messages consumed more than once, e.g. {twice[:5]}"


# ---- 1 and 4: three members, nothing fails ------------------------------------------------------


@pytest.mark.parametrize("protocol", ["classic", "consumer"])
def test_three_members_share_a_stream_exactly_once(broker, members, protocol):
    topic, group = f"shared-{protocol}", f"three-{protocol}"
    create_topic(broker.bootstrap, topic, PARTITIONS)
    # The last third of the stream waits until all three members own partitions.
    feeder = Feeder(broker.bootstrap, topic, hold_at=STREAM_COUNT * 2 // 3)

    def member(name):
        # Commit on revoke in any case, as applications commonly do: with the eager protocol
        # that commit always reaches the broker while the group prepares the rebalance.
        return members(name, broker.bootstrap, group, topic, PROTOCOLS[protocol], revoke_commit="always")

    ms = [member("m0")]
    feeder.start()
    # The others join while the stream is flowing, one rebalance each.
    for name in ("m1", "m2"):
        time.sleep(1.0)
        ms.append(member(name))
    wait_until("one owner per partition, two each", lambda: balanced(ms, ms), ms, STABLE_TIMEOUT_S)
    feeder.release()

    wait_until("every message committed", lambda: all_committed(ms, feeder), ms, DONE_TIMEOUT_S)
    final = wait_until("one owner per partition, two each", lambda: balanced(ms, ms), ms, STABLE_TIMEOUT_S)
    wait_broker_agrees(broker.bootstrap, group, final, ms)
    at = feeder.result()
    ends = ends_of(at)
    assert group_offsets(broker.bootstrap, group, topic) == ends, "OffsetFetch disagrees with the commits"
    stop_all(ms)

    check_single_owner(ms)
    counts = check_records(ms, at)
    nothing_lost(counts, at)
    assert sorted(map(len, final.values())) == [2, 2, 2], final
    per_member = Counter(member for member, *_ in consumed(ms))
    assert all(per_member[m.name] > 0 for m in ms), f"messages consumed per member: {per_member}"
    check_commits(ms)
    exactly_once(counts, at)


# ---- 2 and 4: one member killed with SIGKILL mid-stream -----------------------------------------


@pytest.mark.parametrize(
    "protocol, session_s, heartbeat_s",
    [
        ("classic", CLASSIC_SESSION_TIMEOUT_MS / 1000, CLASSIC_HEARTBEAT_MS / 1000),
        ("consumer", CONSUMER_SESSION_TIMEOUT_MS / 1000, CONSUMER_HEARTBEAT_MS / 1000),
    ],
)
def test_killed_member_partitions_move_after_the_session_timeout(broker, members, protocol, session_s, heartbeat_s):
    topic, group = f"kill-{protocol}", f"kill-{protocol}"
    create_topic(broker.bootstrap, topic, PARTITIONS)
    config = PROTOCOLS[protocol]
    survivors = [members(f"s{i}", broker.bootstrap, group, topic, config) for i in range(2)]
    # The victim waits between logging a batch and committing it, so the kill can land between
    # the two: those messages were consumed but not committed and must be consumed again.
    victim = members("victim", broker.bootstrap, group, topic, config, commit_delay=0.25)
    ms = survivors + [victim]
    wait_until("three members with two partitions each", lambda: balanced(ms, ms), ms, STABLE_TIMEOUT_S)
    feeder = Feeder(broker.bootstrap, topic, rate=10_000)
    feeder.start()

    def victim_mid_batch():
        # Late in the stream; the victim, slower, is well behind.
        evs = victim.events()
        return feeder.sent >= STREAM_COUNT * 0.9 and evs[-1]["ev"] == "consumed"

    wait_until("the victim to be between a batch and its commit", victim_mid_batch, ms, 60, poll=0.01)
    t_kill = victim.kill()
    victim_parts = set()
    for e in victim.events():
        if e["ev"] == "assign":
            victim_parts |= set(e["parts"])
        elif e["ev"] in ("revoke", "lost"):
            victim_parts -= set(e["parts"])
    assert len(victim_parts) == 2, f"the victim owned {victim_parts} when killed"
    # Nobody owns the victim's partitions until its session expires: what is committed for them
    # now is the victim's last commit.
    time.sleep(0.5)
    committed_at_death = group_offsets(broker.bootstrap, group, topic)

    wait_until(
        "every message committed",
        lambda: all_committed(ms, feeder),
        ms,
        session_s + DONE_TIMEOUT_S,
    )
    final = wait_until("the survivors owning every partition", lambda: balanced(ms, survivors), ms, STABLE_TIMEOUT_S)
    wait_broker_agrees(broker.bootstrap, group, final, ms)
    at = feeder.result()
    stop_all(ms)

    check_single_owner(ms)
    counts = check_records(ms, at)

    # The victim's partitions moved, not before its session could have expired.
    moves = [
        e for e in all_events(survivors) if e["ev"] == "assign" and e["t"] > t_kill and victim_parts & set(e["parts"])
    ]
    assert moves, f"the victim's partitions {victim_parts} never moved"
    delay = moves[0]["t"] - t_kill
    print(f"{protocol}: the victim's partitions {sorted(victim_parts)} moved {delay:.1f} s after the kill")
    assert session_s - 2 * heartbeat_s - 0.5 <= delay <= session_s + 20, (
        f"the victim's partitions moved {delay:.1f} s after the kill; the session timeout is {session_s} s"
    )
    # What was committed for them is what the victim last committed (or had in flight).
    for p in victim_parts:
        logged = [e["offsets"][str(p)] for e in victim.events() if e["ev"] == "committed" and str(p) in e["offsets"]]
        in_flight = [e["offsets"][str(p)] for e in victim.events() if e["ev"] == "committing" and str(p) in e["offsets"]]
        allowed = {logged[-1] if logged else None, in_flight[-1] if in_flight else None} - {None}
        if not allowed:  # the victim never committed p: whatever its previous owner committed
            allowed = {committed_max(survivors)[p]} if committed_max(survivors)[p] >= 0 else {-1001}
        assert committed_at_death[p] in allowed, (
            f"partition {p}: committed {committed_at_death[p]} after the kill; the victim logged {sorted(allowed)}"
        )
    # The new owners start exactly at that commit.
    for p in victim_parts:
        start = committed_at_death[p] if committed_at_death[p] >= 0 else 0
        after = [o for member, t, q, o, _ in consumed(survivors) if q == p and t > t_kill]
        assert after, f"nobody consumed partition {p} after the kill"
        assert min(after) == after[0] == start, f"partition {p}: the new owner started at {after[0]}, committed was {start}"
    # Nothing lost; only the victim's uncommitted messages were consumed twice.
    missing = sorted(set(at) - set(counts))
    assert not missing, f"{len(missing)} of {len(at)} messages never consumed, e.g. {missing[:5]}"
    by_victim = {(p, o) for member, _, p, o, _ in consumed([victim])}
    uncommitted = sorted((p, o) for p, o in by_victim if p in victim_parts and o >= committed_at_death[p])
    twice = sorted(k for k, n in counts.items() if n > 1)
    wrong = [k for k in twice if k not in set(uncommitted) or counts[k] > 2]
    assert not wrong, f"consumed again although committed, or more than twice: {wrong[:10]}"
    assert twice == uncommitted, (
        f"{len(twice)} messages consumed twice; the victim consumed {len(uncommitted)} past its last commit"
    )
    assert twice, "the kill landed between a batch and its commit, so that batch must be consumed again"
    print(f"{protocol}: {len(twice)} messages the victim consumed after its last commit were consumed again")
    check_commits(ms)


# ---- 3: cooperative-sticky, a third member joins under load ----------------------------------------


def test_cooperative_sticky_revokes_only_what_moves(broker, members):
    topic, group = "cooperative", "cooperative"
    create_topic(broker.bootstrap, topic, PARTITIONS)
    config = {**CLASSIC, "partition.assignment.strategy": "cooperative-sticky"}
    first = [members(f"m{i}", broker.bootstrap, group, topic, config) for i in range(2)]
    before = wait_until("two members with three partitions each", lambda: balanced(first, first), first, STABLE_TIMEOUT_S)
    # The last third of the stream waits until the newcomer owns partitions.
    feeder = Feeder(broker.bootstrap, topic, hold_at=STREAM_COUNT * 2 // 3)
    feeder.start()
    wait_until(
        "both members consuming",
        lambda: {m for m, *_ in consumed(first)} == {"m0", "m1"} and len(consumed(first)) >= 3_000,
        first,
        30,
    )
    t_join = time.monotonic()
    newcomer = members("m2", broker.bootstrap, group, topic, config)
    ms = first + [newcomer]
    wait_until("three members with two partitions each", lambda: balanced(ms, ms), ms, STABLE_TIMEOUT_S)
    feeder.release()
    wait_until("every message committed", lambda: all_committed(ms, feeder), ms, DONE_TIMEOUT_S)
    final = wait_until("three members with two partitions each", lambda: balanced(ms, ms), ms, STABLE_TIMEOUT_S)
    wait_broker_agrees(broker.bootstrap, group, final, ms)
    at = feeder.result()
    stop_all(ms)
    stopping = min(e["t"] for e in all_events(ms) if e["ev"] == "stopping")

    check_single_owner(ms)
    assert sorted(map(len, final.values())) == [2, 2, 2], final
    moved = final["m2"]
    for m in ("m0", "m1"):
        assert final[m] <= before[m], f"{m} gained partitions: {before[m]} -> {final[m]}"
    assert moved == (before["m0"] - final["m0"]) | (before["m1"] - final["m1"])
    # Every revocation while the newcomer joined lists only partitions that went to it, and
    # never everything the member owned.
    owned = {m: set(before[m]) for m in ("m0", "m1")}
    revokes = [
        e for e in all_events(first) if e["ev"] in ("revoke", "lost") and t_join < e["t"] < stopping and e["parts"]
    ]
    assert revokes, "the old members never revoked anything for the newcomer"
    print(f"before the join {before}, after {final}; revoked: {[(e['member'], e['parts']) for e in revokes]}")
    for e in revokes:
        assert e["ev"] == "revoke", f"{e['member']} lost partitions {e['parts']}"
        parts = set(e["parts"])
        assert parts <= moved, f"{e['member']} revoked {sorted(parts)}; only {sorted(moved)} moved to the newcomer"
        assert parts != owned[e["member"]], f"{e['member']} revoked all of its partitions {sorted(parts)}"
        owned[e["member"]] -= parts
    assigned_to_old = [e for e in all_events(first) if e["ev"] == "assign" and t_join < e["t"] < stopping and e["parts"]]
    assert not assigned_to_old, f"the old members were assigned partitions after the join: {assigned_to_old}"
    # Before the join too, a revocation only ever handed partitions to the member that joined.
    for e in all_events(first):
        if e["ev"] == "revoke" and e["t"] < t_join:
            other = "m1" if e["member"] == "m0" else "m0"
            assert set(e["parts"]) <= before[other], f"{e['member']} revoked {e['parts']} before the join"

    counts = check_records(ms, at)
    nothing_lost(counts, at)
    assert any(m == "m2" for m, *_ in consumed([newcomer])), "the newcomer consumed nothing"
    # Partitions that stayed put were consumed exactly once. A moved one was consumed again
    # only from the last commit its old owner had acknowledged before the move, where the
    # newcomer started.
    twice = {k for k, n in counts.items() if n > 1}
    assert not {k for k in twice if k[0] not in moved}, f"partitions that did not move were consumed twice: {sorted(twice)[:10]}"
    assert all(counts[k] == 2 for k in twice), "a message was consumed three times"
    for p in moved:
        t_move = min(e["t"] for e in newcomer.events() if e["ev"] == "assign" and p in e["parts"])
        acked = [
            e["offsets"][str(p)]
            for e in all_events(first)
            if e["ev"] == "committed" and e["t"] < t_move and str(p) in e["offsets"]
        ]
        start = max(acked) if acked else 0
        mine = [o for _, _, q, o, _ in consumed([newcomer]) if q == p]
        assert mine and mine[0] == start, f"partition {p}: the newcomer started at {mine[:1]}, the last commit was {start}"
        again = {(p, o) for _, t, q, o, _ in consumed(first) if q == p and o >= start}
        assert {k for k in twice if k[0] == p} == again, f"partition {p}: consumed twice are not those after the commit {start}"
    # The commit an old owner makes in its revoke callback comes after the first sync of the
    # rebalance, with the new generation, while the group is Stable (or PreparingRebalance again
    # if the other old member rejoined first): it succeeds, so nothing is consumed twice at all.
    # Cooperative members keep consuming during a rebalance, and Kafka too refuses the commit of
    # a batch that reaches it while the group is CompletingRebalance (REBALANCE_IN_PROGRESS) or
    # after the join completed a generation the member has not heard of yet
    # (ILLEGAL_GENERATION): harmless, the position stays and a later commit covers it.
    expected = ("REBALANCE_IN_PROGRESS", "ILLEGAL_GENERATION")
    failed = commit_failures(ms)
    print(f"batch commits refused during the rebalance: {[(e['member'], e.get('error') or e['errors']) for e in failed]}")
    other = [e for e in failed if e["where"] != "batch" or not any(code in json.dumps(e) for code in expected)]
    assert not other, f"commits failed: {other[:3]}"
    exactly_once(counts, at)


# ---- committing while the group prepares a rebalance -------------------------------------------


def test_a_member_commits_while_its_group_prepares_a_rebalance(broker):
    """A member that has not rejoined yet is still in the current generation, and Kafka accepts
    its commits until the join completes: that is how an eager member commits in its revoke
    callback."""
    topic, group = "prepare", "prepare"
    create_topic(broker.bootstrap, topic, 2)
    ends = ends_of(produce_stream(broker.bootstrap, topic, 200))
    first = group_consumer(broker.bootstrap, group)
    second = None
    try:
        read_subscribed(first, topic, ends)
        first.commit(offsets=[TopicPartition(topic, p, 1) for p in ends], asynchronous=False)
        # A second member joins; the group waits in PreparingRebalance for the first one, which
        # does not poll, so it has not rejoined.
        second = group_consumer(broker.bootstrap, group)
        second.subscribe([topic])
        deadline = time.monotonic() + 15
        while broker_state(broker.bootstrap, group) != ConsumerGroupState.PREPARING_REBALANCING:
            assert time.monotonic() < deadline, f"the group is {broker_state(broker.bootstrap, group)}, never PreparingRebalance"
            second.poll(0.1)
        offsets = [TopicPartition(topic, p, end) for p, end in ends.items()]
        try:
            result = first.commit(offsets=offsets, asynchronous=False)
            outcome = [tp.error for tp in result if tp.error is not None] or "ok"
        except KafkaException as e:
            outcome = e.args[0]
        # Still preparing: the first member has not rejoined, its generation is the current one.
        assert broker_state(broker.bootstrap, group) == ConsumerGroupState.PREPARING_REBALANCING
        assert outcome == "ok", f"the commit failed: {outcome}"
        assert group_offsets(broker.bootstrap, group, topic, len(ends)) == ends
    finally:
        first.close()
        if second is not None:
            second.close()


def broker_state(bootstrap: str, group: str):
    client = admin(bootstrap)
    return client.describe_consumer_groups([group], request_timeout=10)[group].result(timeout=15).state


# ---- 5: committed offsets survive a broker restart ------------------------------------------------


def group_consumer(bootstrap: str, group: str, **extra) -> Consumer:
    return Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": group,
            "enable.auto.commit": False,
            "auto.offset.reset": "earliest",
            "fetch.wait.max.ms": 100,
            "log.connection.close": False,
            **CLASSIC,
            **extra,
        }
    )


def read_subscribed(c: Consumer, topic: str, ends: dict[int, int], timeout: float = 60.0) -> dict[int, list[int]]:
    """Subscribes and reads until every partition delivered the message before its end;
    returns the offsets read per partition, in order."""
    c.subscribe([topic])
    offsets = defaultdict(list)
    pending = {p for p, end in ends.items() if end > 0}
    deadline = time.monotonic() + timeout
    while pending:
        assert time.monotonic() < deadline, f"timed out; still waiting for partitions {pending}, read {({p: (o[0], o[-1]) for p, o in offsets.items() if o})}"
        for m in c.consume(num_messages=1000, timeout=0.5):
            assert m.error() is None, m.error()
            offsets[m.partition()].append(m.offset())
            if m.offset() >= ends[m.partition()] - 1:
                pending.discard(m.partition())
    return offsets


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGKILL], ids=["sigterm", "sigkill"])
def test_committed_offsets_survive_a_broker_restart(fresh_broker, sig):
    broker = fresh_broker
    topic, group, parts, count = "resume", "resume", 4, 8_000
    create_topic(broker.bootstrap, topic, parts)
    at = produce_stream(broker.bootstrap, topic, count)
    ends = ends_of(at)
    targets = {p: ends[p] // 3 + 17 * p for p in range(parts)}

    c = group_consumer(broker.bootstrap, group)
    read = read_subscribed(c, topic, {p: targets[p] for p in range(parts)})
    assert all(read[p][0] == 0 for p in range(parts)), "a new group starts at the earliest offset"
    result = c.commit(offsets=[TopicPartition(topic, p, o) for p, o in targets.items()], asynchronous=False)
    assert all(tp.error is None for tp in result), result
    c.close()
    assert group_offsets(broker.bootstrap, group, topic, parts) == targets

    if sig == signal.SIGKILL:
        broker.kill()
    else:
        broker.stop_cleanly()
    broker.start()
    assert group_offsets(broker.bootstrap, group, topic, parts) == targets, "committed offsets changed across the restart"

    # More messages after the restart: the resumed consumer reads across the old end too.
    more = produce_all(producer(broker.bootstrap), topic, ({"key": key_of(s), "value": value_of(s)} for s in range(count, count + 2_000)))
    assert_all_delivered(more)
    at.update({(r.partition, r.offset): count + i for i, r in enumerate(more)})
    new_ends = ends_of(at)
    c = group_consumer(broker.bootstrap, group)
    read = read_subscribed(c, topic, new_ends)
    c.close()
    for p in range(parts):
        assert read[p][0] == targets[p], f"partition {p}: resumed at {read[p][0]}, committed was {targets[p]}"
        assert read[p] == list(range(targets[p], new_ends[p])), f"partition {p}: offsets after the commit are skipped or repeated"


# ---- 6: two groups read the same stream independently -----------------------------------------------


def test_two_groups_each_read_everything(broker, members):
    topic = "two-groups"
    create_topic(broker.bootstrap, topic, PARTITIONS)
    feeder = Feeder(broker.bootstrap, topic, count=12_000)
    groups = {
        "reader-a": [members(f"a{i}", broker.bootstrap, "reader-a", topic, CLASSIC) for i in range(2)],
        "reader-b": [members(f"b{i}", broker.bootstrap, "reader-b", topic, CONSUMER) for i in range(2)],
    }
    everyone = [m for ms in groups.values() for m in ms]
    for name, ms in groups.items():
        wait_until(f"{name} to assign every partition", lambda: balanced(ms, ms), everyone, STABLE_TIMEOUT_S)
    feeder.start()
    for name, ms in groups.items():
        wait_until(f"{name} to commit every message", lambda: all_committed(ms, feeder), everyone, DONE_TIMEOUT_S)
    at = feeder.result()
    ends = ends_of(at)
    for name, ms in groups.items():
        assert group_offsets(broker.bootstrap, name, topic) == ends, f"{name}'s committed offsets"
    stop_all(everyone)
    for name, ms in groups.items():
        check_single_owner(ms)
        check_commits(ms)
        exactly_once(check_records(ms, at), at)


# ---- 7: sluice group reset-offsets ----------------------------------------------------------------


def cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([str(SLUICE_BIN), *args], capture_output=True, text=True, timeout=60)


def test_reset_offsets_with_the_cli(broker):
    topic, group, parts = "reset", "resettable", 3
    create_topic(broker.bootstrap, topic, parts)
    at = produce_stream(broker.bootstrap, topic, 3_000)
    ends = ends_of(at)
    assert min(ends.values()) > 100

    # The group reads everything and commits the ends; then it has no members.
    c = group_consumer(broker.bootstrap, group)
    read = read_subscribed(c, topic, ends)
    assert all(read[p] == list(range(ends[p])) for p in range(parts))
    c.commit(offsets=[TopicPartition(topic, p, ends[p]) for p in range(parts)], asynchronous=False)
    c.close()
    assert group_offsets(broker.bootstrap, group, topic, parts) == ends

    def reset(*how: str) -> subprocess.CompletedProcess:
        return cli("group", "reset-offsets", group, "--topic", topic, *how, "--execute", "--bootstrap-server", broker.bootstrap)

    def starts_at(expected: dict[int, int]) -> None:
        c = group_consumer(broker.bootstrap, group)
        try:
            read = read_subscribed(c, topic, ends)
        finally:
            c.close()
        for p in range(parts):
            assert read[p][0] == expected[p], f"partition {p}: started at {read[p][0]}, reset to {expected[p]}"
            assert read[p] == list(range(expected[p], ends[p])), f"partition {p}: offsets skipped or repeated"

    done = reset("--to-offset", "100")
    assert done.returncode == 0, done.stderr
    assert group_offsets(broker.bootstrap, group, topic, parts) == {p: 100 for p in range(parts)}
    starts_at({p: 100 for p in range(parts)})

    done = reset("--to-earliest")
    assert done.returncode == 0, done.stderr
    assert group_offsets(broker.bootstrap, group, topic, parts) == {p: 0 for p in range(parts)}
    starts_at({p: 0 for p in range(parts)})

    # With a member in the group, --execute is refused and changes nothing.
    c = group_consumer(broker.bootstrap, group)
    try:
        read_subscribed(c, topic, ends)
        refused = reset("--to-offset", "100")
        assert refused.returncode != 0, f"reset-offsets on a group with an active member succeeded:\n{refused.stdout}"
        assert "active member" in refused.stderr, refused.stderr
        assert group_offsets(broker.bootstrap, group, topic, parts) == {p: 0 for p in range(parts)}
    finally:
        c.close()


if __name__ == "__main__" and len(sys.argv) == 3 and sys.argv[1] == "--member":
    try:
        code = member_main(json.loads(sys.argv[2]))
    except BaseException:
        traceback.print_exc()
        code = 1
    sys.exit(code)
