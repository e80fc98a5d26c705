"""Jepsen-style tests of a Sluice cluster: real processes, real Kafka clients, real faults (root).

Three to five combined nodes (`--cores 1` each), each in a network namespace of its own
(netns.py: addresses 10.77.0.N that exist only inside the namespaces) with its data directory on
a small loop-mounted ext4 filesystem of its own. Real clients in the clients' namespace run
Jepsen's two Kafka workloads the whole time:

- queue: idempotent acks=all producers send unique values to `jepsen-queue` (replication factor
  3, `min.insync.replicas` 2); a consumer group, subscribed and committing after every poll,
  receives them. Every acknowledged send must be received; nothing received that was not sent.
  The producers and group members are librdkafka (confluent-kafka) threads and, unless
  `--no-java`, Apache Kafka's Java client in the same group (tests/java/src/sluice/
  JepsenQueue.java, one JVM with a producer and a member, run with Java's source launcher; its
  members and librdkafka's agree on the `range` assignor).
- list-append: idempotent acks=all producers append values to keys of `jepsen-append` (keyed
  produce: one partition per key, so each key is a list ordered by offset); readers assigned to
  every partition from offset 0 poll it. Every read of a key must be a prefix of one order, and
  one offset never holds two values.
- share: an idempotent acks=all producer sends unique values to `jepsen-share`; two members of
  one share group (KIP-932, librdkafka's share consumer) accept every record explicitly and
  commit the acknowledgements after every poll. Every acknowledged send must be delivered; none
  may be delivered again after its acceptance succeeded (the share partitions' state is
  persisted through the share coordinator on `__share_group_state`, which the faults move too).

Meanwhile the nemesis applies one fault per cycle, held for a random 1-4 s, then heals it and
pauses briefly. The schedule comes from the seed alone (each block of cycles holds every fault
once, in a seeded order, and each cycle draws its hold time and targets from a generator of its
own), so the same seed replays the same faults; the targets that depend on the cluster's state
(a partition's leader, the active controller) are looked up when the fault is applied. The
faults, named as Jepsen's nemeses:

- kill-leader, kill-controller, kill-random: kill -9 of a partition's leader (Metadata), of the
  active controller (DescribeQuorum, `sluice cluster --bootstrap-controller`) or of any node;
  healed by starting it again on its data.
- pause: SIGSTOP of a node; healed by SIGCONT.
- partition-halves (a minority cut off from the majority), partition-bridge (two halves that
  only one node in the middle reaches), partition-controller (the active controller isolated):
  nftables tables in the nodes' namespaces drop traffic between nodes; the clients still reach
  every node.
- packet-loss: `numgen random mod 100 < N drop` on one node's or every node's interface
  (N 10, 25 or 50), both ways, clients included.
- disk-full: one node's filesystem filled to its last block; healed by deleting the filler.
  Appends go into preallocated segments: with SEGMENT_BYTES each node rolls one every second or
  two, and those rolls (and new checkpoint files) meet the full disk.
- membership: with four or more nodes `sluice reassign drain` of a broker, healed by moving
  every drained partition back; with three, one partition's replicas shrunk to two (`sluice
  reassign move`, the dropped replica deleted), healed by moving it back to three.

Clock skew is not among them: Sluice measures time with monotonic clocks, which cannot be moved
for one real process here; the deterministic simulator (replication/tests/) jumps its clocks.
Delays cannot be injected either (this kernel has no netem): losses stand in for slow links.

At the end every fault is healed, the producers stop, the consumers go on until they have seen
every acknowledged value (or `DRAIN_S` passes), and every partition is read in full from offset 0
with `assign`. The checker reports what Jepsen's Kafka checker reports:

- lost: acknowledged, but not in the final read. Fails the run.
- duplicated: one value at more than one offset (acknowledgements, polls, final read). The
  producers are idempotent: fails the run. Each duplicate is attributed from the copies' batch
  headers on every replica: the same producer id, epoch and sequence twice (the broker appended
  a retry) or a later copy under a newer epoch (the client sent it again after bumping its
  epoch, librdkafka's known behaviour when messages time out).
- inconsistent offsets: one offset holding two values across acknowledgements and reads. Fails.
- unexpected: a value read that no producer sent, or whose bytes (every value carries PAD_BYTES
  derived from it) differ from what was sent. Fails.
- unseen: acknowledged, never returned by the workload's consumers' polls before the final read
  (after the drain). The queue's promise is that every acknowledged send is received once the
  cluster is healthy again: fails.
- incompatible orders: a reader's values of one key (list-append) that are not a prefix of the
  key's order in the final read. Fails.
- non-monotonic sends: one producer instance's acknowledged offsets on a partition going
  backwards in send order. Kafka's idempotent producer keeps its order per partition: fails.
- poll-skips and non-monotonic polls: a consumer's consecutive records of one partition skipping
  offsets that exist, or going back. Counted apart when an assignment (rebalance) came between:
  a group member resumes at its group's last commit, which may be behind what it read (back) or
  past it when another member read in between (a skip); the queue's unseen count is what shows
  whether the group as a whole missed something. Within one assignment a consumer's position
  only moves forward one record at a time (no seeks here, and no offset reset can be due: data
  at or below the high watermark is never truncated), so those fail the run.
- acknowledged without an offset: librdkafka's idempotent producer acknowledges an in-flight
  batch whose response was lost once a later batch of the partition succeeds (IMPLICITACK), with
  no offset. Counted as acknowledged (it must be in the final read), reported apart.
- share: lost (acknowledged, not in the final read), undelivered (acknowledged, never delivered
  to a share member), redelivered after acceptance (delivered again after a successful commit
  of its ACCEPT), duplicated or unexpected values: each fails the run. Reported: deliveries
  beyond the first, records never accepted successfully (a commit that failed leaves its outcome
  unknown, as in Kafka), delivery counts that repeat (acquisitions are written back without
  waiting, so a failover may lose the last one, as Kafka permits).
- a panic in any node's log fails the run. Node exits, nemesis errors, partitions short of their
  ISR after the last heal, the group's committed lag at the end, the nodes' open file descriptors
  and what their logs say the faults did are reported.

Run it (root):

    target/venv/bin/python tests/python/jepsen.py --cycles 1000 --seed 7 --nodes 5 --out target/jepsen

It prints the seed and a progress line per cycle and writes `result.json` (and the clients' and
nodes' logs) to the output directory; it exits non-zero when the checker finds an anomaly.
tests/python/test_jepsen.py runs a short one in the test command.
"""

from __future__ import annotations

import argparse
import bisect
import collections
import ctypes
import errno
import gzip
import hashlib
import json
import logging
import os
import random
import shutil
import signal
import struct
import subprocess
import sys
import threading
import time
from pathlib import Path

from confluent_kafka import Consumer, KafkaError, KafkaException, Producer, TopicPartition
from confluent_kafka.admin import NewTopic

from cluster import Cluster
from harness import CLIENT_DEFAULTS, REPO, SLUICE_BIN, TEST_DIR, BrokerError, admin
from netns import Network

QUEUE = "jepsen-queue"
APPEND = "jepsen-append"
SHARE = "jepsen-share"
QUEUE_PARTITIONS = 4
APPEND_PARTITIONS = 4
SHARE_PARTITIONS = 2
SHARE_GROUP = "jepsen-share-group"
SHARE_MEMBERS = 2
# Keys of the list-append workload, spread over its partitions by the default partitioner.
APPEND_KEYS = 12
GROUP = "jepsen-queue-group"
REPLICATION_FACTOR = 3
MIN_INSYNC_REPLICAS = 2
# Small segments, so that each node rolls one every few seconds at these rates: appends go into
# preallocated segments, and a full disk is met when a roll (or a new checkpoint file) needs
# blocks, as on a busy broker. Kafka 4 would refuse a `segment.bytes` below 1 MiB; Sluice takes
# Kafka's older minimum.
SEGMENT_BYTES = 64 << 10
# Each node's filesystem (a sparse image): room for the preallocated segments of every partition
# and a long run's records.
DISK_BYTES = 1 << 30

FAULTS = ("kill-leader", "kill-controller", "kill-random", "pause", "partition-halves",
          "partition-bridge", "partition-controller", "packet-loss", "disk-full", "membership")
# How long a fault is held before it is healed, and the pause after healing.
HOLD_S = (1.0, 4.0)
PAUSE_S = 0.5
LOSS_PERCENT = (10, 25, 50)

# Messages per second of each producer; two librdkafka producers per workload and the Java one.
PRODUCE_RATE = 40
# Bytes after each value: with SEGMENT_BYTES, what makes every node roll a segment every second
# or two.
PAD_BYTES = 256
QUEUE_CONSUMERS = 2
APPEND_READERS = 2
# After the last cycle, how long the consumers may take to see every acknowledged value.
DRAIN_S = 90.0
# How long a node restarted by a heal may take to serve and register again.
RECOVERY_S = 45.0
# How long a reassignment (membership fault and its heal) may take to complete.
REASSIGN_S = 120.0
# After the last heal, how long every partition may take to have all its replicas in sync again.
HEALTHY_S = 60.0
# The final read of one partition.
FINAL_READ_S = 120.0
# How long the first acknowledgements of every producer may take (the JVM compiles its source).
START_S = 120.0

NODE_ARGS = ["--replica-lag-time-max-ms", 3000, "--leader-imbalance-check-interval-seconds", 5]
# Four offsets and share state partitions instead of Kafka's 50: each preallocates a segment on
# every node. Share acquisition locks of 5 s: what a failover leaves acquired comes back soon.
NODE_TOML = ('"offsets.topic.num.partitions" = 4\n'
             '"share.coordinator.state.topic.num.partitions" = 4\n'
             '"group.share.min.record.lock.duration.ms" = 1000\n'
             '"group.share.record.lock.duration.ms" = 5000\n')

# librdkafka's idempotent producer bumps its epoch when a message times out and sends again, at
# sequence 0 of the new epoch, what it had sent under the old one (some of it already in the
# log): no broker can tell those from new records (librdkafka issue 4953). With 20 s here the
# first long run found 3,448 such duplicates. librdkafka's default (300 s) outlasts every fault
# and heal, as an operator's producers would run. It also bumps the epoch when a request sent
# behind a failed one is answered OUT_OF_ORDER_SEQUENCE_NUMBER, as Kafka answers it (the Java
# client retries those without a bump): one request in flight per connection sends nothing
# behind a failed one.
PRODUCER_CONFIG = {
    "acks": "all",
    "enable.idempotence": True,
    "max.in.flight.requests.per.connection": 1,
    "linger.ms": 5,
    "message.timeout.ms": 300_000,
    "request.timeout.ms": 5_000,
    "log.connection.close": False,
}
CONSUMER_CONFIG = {
    "enable.auto.commit": False,
    "auto.offset.reset": "earliest",
    "fetch.wait.max.ms": 100,
    "session.timeout.ms": 10_000,
    "heartbeat.interval.ms": 1_000,
    "log.connection.close": False,
}

JAVA_SOURCE = REPO / "tests" / "java" / "src" / "sluice" / "JepsenQueue.java"
JAVA_DEPS = REPO / "target" / "java-deps"

CLIENT_LOG = logging.getLogger("librdkafka")
# Set by the CLI's first SIGINT or SIGTERM: no more faults, then the drain, final read and checker.
STOP_REQUESTED = threading.Event()


def librdkafka_debug() -> dict:
    """`JEPSEN_LIBRDKAFKA_DEBUG` (e.g. `eos`) turns on librdkafka's debug contexts for the
    producers, logged to librdkafka.log."""
    contexts = os.environ.get("JEPSEN_LIBRDKAFKA_DEBUG")
    return {"debug": contexts} if contexts else {}


def say(line: str) -> None:
    print(line, flush=True)


def payload(value: str) -> bytes:
    """What is sent for `value`: the value, `|`, then PAD_BYTES that depend only on it (hex of
    its SHA-256, repeated), so a record whose bytes were mixed up with another's is caught."""
    digest = hashlib.sha256(value.encode()).hexdigest()
    return f"{value}|{(digest * (PAD_BYTES // len(digest) + 1))[:PAD_BYTES]}".encode()


def value_of(raw: bytes | None) -> str:
    """The value a record carries; `#corrupt` after it when its bytes are not what was sent for
    it (then no producer sent it: the checker counts it as unexpected)."""
    text = (raw or b"").decode(errors="replace")
    value = text.split("|", 1)[0]
    return value if payload(value) == raw else f"{value}#corrupt"


# ---- histories ---------------------------------------------------------------------------------


class ProducerHistory:
    """One producer's sends, in the order their outcomes arrived: (session, n, value, partition,
    offset) when acknowledged (offset -1 when the client did not say it), (session, n, value, -1,
    error name) when not. `session` counts the producer instances (a new one after a fatal
    error); `n` is the send order."""

    def __init__(self, name: str, workload: str, topic: str):
        self.name = name
        self.workload = workload
        self.topic = topic
        self.sends: list[tuple] = []
        self.attempted: set[str] = set()
        self.acked = 0

    def ack(self, session: int, n: int, value: str, partition: int, offset: int, observed) -> None:
        self.sends.append((session, n, value, partition, offset))
        self.acked += 1
        observed.acked[value] = (self.topic, partition, offset)

    def fail(self, session: int, n: int, value: str, error: str) -> None:
        self.sends.append((session, n, value, -1, error))


class ConsumerHistory:
    """One consumer's events in order: ("assign" | "revoke" | "lost", [partitions]) and
    ("poll", [(partition, offset, value), ...])."""

    def __init__(self, name: str, workload: str, topic: str):
        self.name = name
        self.workload = workload
        self.topic = topic
        self.events: list[tuple] = []
        self.records = 0

    def poll(self, batch: list[tuple], observed) -> None:
        self.events.append(("poll", batch))
        self.records += len(batch)
        for _, _, value in batch:
            observed.seen.add(value)


class Observed:
    """A workload's acknowledged values (value -> (topic, partition, offset)) and the values its
    consumers have returned, kept as the clients go, for progress lines and the drain."""

    def __init__(self):
        self.acked: dict[str, tuple] = {}
        self.seen: set[str] = set()

    def unseen(self) -> int:
        return sum(1 for v in list(self.acked) if v not in self.seen)


# ---- librdkafka clients ------------------------------------------------------------------------


class Client(threading.Thread):
    """A client thread; an exception in it is kept and fails the run."""

    def __init__(self, name: str):
        super().__init__(name=name, daemon=True)
        self.stopping = threading.Event()
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            self.work()
        except BaseException as e:  # noqa: BLE001 - reported by the run
            self.error = e

    def work(self) -> None:
        raise NotImplementedError


class LibrdkafkaProducer(Client):
    """Sends PRODUCE_RATE messages a second until stopped: the queue's values have no key (a
    random partition each), list-append's are keyed. A fatal error (the idempotent producer's
    state lost) starts a new producer instance, a new session."""

    def __init__(self, history: ProducerHistory, observed: Observed, bootstrap: str, seed: int, rate: int):
        super().__init__(history.name)
        self.history = history
        self.observed = observed
        self.bootstrap = bootstrap
        self.rng = random.Random(seed)
        self.rate = rate
        self.sessions = 0

    def message(self, n: int) -> tuple[str | None, str]:
        if self.history.workload == "queue":
            return None, f"q{self.history.name}-{n}"
        if self.history.workload == "share":
            return None, f"s{self.history.name}-{n}"
        key = f"k{self.rng.randrange(APPEND_KEYS)}"
        return key, f"a{self.history.name}-{key}-{n}"

    def work(self) -> None:
        n = 0
        interval = 1.0 / self.rate
        while not self.stopping.is_set():
            session = self.sessions
            self.sessions += 1
            broken = threading.Event()
            p = Producer({"bootstrap.servers": self.bootstrap, "client.id": self.history.name,
                          "logger": CLIENT_LOG, **PRODUCER_CONFIG, **librdkafka_debug()})

            next_at = time.monotonic()
            while not self.stopping.is_set() and not broken.is_set():
                key, value = self.message(n)
                self.history.attempted.add(value)

                def on_delivery(err, msg, session=session, n=n, value=value):
                    if err is None and msg.offset() is None:
                        # Delivered, librdkafka says, but with no offset: counted as
                        # acknowledged (it must be read), its offset unknown.
                        CLIENT_LOG.warning("%s: %s acknowledged on partition %s without an offset",
                                           self.history.name, value, msg.partition())
                        self.history.ack(session, n, value, msg.partition(), -1, self.observed)
                    elif err is None:
                        self.history.ack(session, n, value, msg.partition(), msg.offset(), self.observed)
                    else:
                        self.history.fail(session, n, value, err.name())
                        if err.fatal():
                            broken.set()

                while True:
                    try:
                        p.produce(self.history.topic, key=key, value=payload(value), on_delivery=on_delivery)
                        break
                    except BufferError:
                        p.poll(0.05)
                    except KafkaException as e:
                        # Refused before it was sent: this instance is in a fatal state.
                        self.history.fail(session, n, value, e.args[0].name())
                        broken.set()
                        break
                n += 1
                p.poll(0)
                next_at += interval
                wait = next_at - time.monotonic()
                if wait > 0:
                    p.poll(wait)
                else:
                    next_at = time.monotonic()
            # Whatever is not acknowledged within the flush stays unknown: purged, it is
            # reported as not acknowledged (it may still be in the log).
            p.flush(30)
            p.purge()
            p.flush(5)


class GroupConsumer(Client):
    """A member of the queue's consumer group: subscribed, a commit after every poll."""

    def __init__(self, history: ConsumerHistory, observed: Observed, bootstrap: str):
        super().__init__(history.name)
        self.history = history
        self.observed = observed
        self.bootstrap = bootstrap
        self.commit_failures = 0

    def work(self) -> None:
        def on_commit(err, partitions):
            if err is not None and err.code() != KafkaError._NO_OFFSET:
                self.commit_failures += 1

        c = Consumer({"bootstrap.servers": self.bootstrap, "group.id": GROUP, "client.id": self.history.name,
                      "partition.assignment.strategy": "range", "on_commit": on_commit, "logger": CLIENT_LOG,
                      **CONSUMER_CONFIG})
        events = self.history.events
        c.subscribe([self.history.topic],
                    on_assign=lambda _, tps: events.append(("assign", sorted(tp.partition for tp in tps))),
                    on_revoke=lambda _, tps: events.append(("revoke", sorted(tp.partition for tp in tps))),
                    on_lost=lambda _, tps: events.append(("lost", sorted(tp.partition for tp in tps))))
        try:
            while not self.stopping.is_set():
                batch = []
                for m in c.consume(num_messages=500, timeout=0.2):
                    if m.error() is None:
                        batch.append((m.partition(), m.offset(), value_of(m.value())))
                if batch:
                    self.history.poll(batch, self.observed)
                    try:
                        c.commit(asynchronous=True)
                    except KafkaException:
                        self.commit_failures += 1
        finally:
            c.close()


class AppendReader(Client):
    """Reads every partition of the list-append topic from offset 0 (assign, no group)."""

    def __init__(self, history: ConsumerHistory, observed: Observed, bootstrap: str):
        super().__init__(history.name)
        self.history = history
        self.observed = observed
        self.bootstrap = bootstrap

    def work(self) -> None:
        c = Consumer({"bootstrap.servers": self.bootstrap, "group.id": f"{self.history.name}-unused",
                      "client.id": self.history.name, "logger": CLIENT_LOG, **CONSUMER_CONFIG})
        partitions = list(range(APPEND_PARTITIONS))
        c.assign([TopicPartition(self.history.topic, p, 0) for p in partitions])
        self.history.events.append(("assign", partitions))
        try:
            while not self.stopping.is_set():
                batch = [(m.partition(), m.offset(), value_of(m.value()))
                         for m in c.consume(num_messages=500, timeout=0.2) if m.error() is None]
                if batch:
                    self.history.poll(batch, self.observed)
        finally:
            c.close()


class ShareMember(Client):
    """A member of the share workload's share group (librdkafka's share consumer): accepts every
    record explicitly and commits after every poll. Its history: every delivery (value,
    partition, offset, delivery count, when) and the values whose acceptance succeeded (value ->
    when the commit returned)."""

    def __init__(self, name: str, observed: Observed, bootstrap: str):
        super().__init__(name)
        self.observed = observed
        self.bootstrap = bootstrap
        self.deliveries: list[tuple[str, int, int, int, float]] = []
        self.accepted: dict[str, float] = {}
        self.commit_failures = 0

    def work(self) -> None:
        from confluent_kafka import AcknowledgeType, ShareConsumer

        c = ShareConsumer({"bootstrap.servers": self.bootstrap, "group.id": SHARE_GROUP, "client.id": self.name,
                           "share.acknowledgement.mode": "explicit", "logger": CLIENT_LOG,
                           "log.connection.close": False})
        c.subscribe([SHARE])
        try:
            while not self.stopping.is_set():
                try:
                    messages = [m for m in list(c.poll(0.2) or []) if m.error() is None]
                except KafkaException:
                    continue
                if not messages:
                    continue
                batch = []
                for m in messages:
                    value = value_of(m.value())
                    self.deliveries.append((value, m.partition(), m.offset(), m.delivery_count(), time.monotonic()))
                    self.observed.seen.add(value)
                    c.acknowledge(m, AcknowledgeType.ACCEPT)
                    batch.append((m.partition(), value))
                try:
                    result = c.commit_sync(15)
                except KafkaException:
                    self.commit_failures += 1
                    continue
                now = time.monotonic()
                failed = {tp.partition for tp, error in result.items() if error is not None}
                self.commit_failures += len(failed)
                for partition, value in batch:
                    if partition not in failed:
                        self.accepted.setdefault(value, now)
        finally:
            c.close()


def check_share(producers: list[ProducerHistory], members: list[ShareMember],
                final: dict[int, list[tuple[int, str]]], examples_max: int = 10) -> dict:
    """The share workload's checker (see the module's docstring for each count), its counts
    prefixed `share_`; `share_anomalies` names those that fail the run."""
    examples: dict[str, list] = collections.defaultdict(list)

    def note(kind: str, example) -> None:
        if len(examples[kind]) < examples_max:
            examples[kind].append(example)

    acked: dict[str, tuple[int, int]] = {}
    attempted: set[str] = set()
    for h in producers:
        attempted |= h.attempted
        for _, _, value, partition, outcome in h.sends:
            if partition >= 0:
                acked[value] = (partition, outcome)
    final_at: dict[str, list[tuple[int, int]]] = collections.defaultdict(list)
    for p, records in final.items():
        for o, v in records:
            final_at[v].append((p, o))
    deliveries: dict[str, list[tuple[int, int, int, float, str]]] = collections.defaultdict(list)
    accepted: dict[str, float] = {}
    for m in members:
        for value, p, o, count, at in m.deliveries:
            deliveries[value].append((p, o, count, at, m.name))
        for value, at in m.accepted.items():
            accepted[value] = min(at, accepted.get(value, at))

    lost = sorted(v for v in acked if v not in final_at)
    for v in lost[:examples_max]:
        note("share_lost", f"{v} acknowledged at {SHARE}-{acked[v][0]}@{acked[v][1]}")
    duplicated = sorted(v for v, places in final_at.items() if len(places) > 1)
    for v in duplicated[:examples_max]:
        note("share_duplicated", f"{v} at {final_at[v]}")
    unexpected = sorted(v for v in set(deliveries) | set(final_at) if v not in attempted)
    for v in unexpected[:examples_max]:
        note("share_unexpected", f"{v} delivered {deliveries.get(v, [])[:2]}, final {final_at.get(v, [])}")
    undelivered = sorted(v for v in acked if v not in deliveries)
    for v in undelivered[:examples_max]:
        note("share_undelivered", f"{v} acknowledged at {SHARE}-{acked[v][0]}@{acked[v][1]}")
    after_accept = sorted(v for v, d in deliveries.items() if v in accepted and any(at > accepted[v] for *_, at, _ in d))
    for v in after_accept[:examples_max]:
        note("share_redelivered_after_acceptance",
             f"{v}: accepted at {accepted[v]:.3f}, deliveries (partition, offset, count, when, member) {deliveries[v]}")
    counts_repeated = sorted(v for v, d in deliveries.items() if len({c for _, _, c, _, _ in d}) < len(d))
    for v in counts_repeated[:examples_max]:
        note("share_delivery_counts_repeated", f"{v}: {deliveries[v]}")
    result = {
        "share_acknowledged": len(acked),
        "share_final_read_records": sum(len(r) for r in final.values()),
        "share_lost": len(lost),
        "share_duplicated": len(duplicated),
        "share_unexpected": len(unexpected),
        "share_undelivered": len(undelivered),
        "share_redelivered_after_acceptance": len(after_accept),
        "share_delivered": len(deliveries),
        "share_deliveries": sum(len(d) for d in deliveries.values()),
        "share_redelivered": sum(1 for d in deliveries.values() if len(d) > 1),
        "share_accepted": len(accepted),
        "share_never_accepted": sum(1 for v in deliveries if v not in accepted),
        "share_delivery_counts_repeated": len(counts_repeated),
        "share_commit_failures": sum(m.commit_failures for m in members),
        "share_examples": dict(examples),
    }
    failing = ("share_lost", "share_duplicated", "share_unexpected", "share_undelivered",
               "share_redelivered_after_acceptance")
    result["share_anomalies"] = [k for k in failing if result[k] > 0]
    if not acked:
        result["share_anomalies"].append("share: nothing acknowledged")
    return result


# ---- the Java client ---------------------------------------------------------------------------


class JavaQueueClient(Client):
    """tests/java/src/sluice/JepsenQueue.java: a producer and a group member of the queue
    workload in one JVM. This thread reads its event lines into the histories (and a file)."""

    def __init__(self, name: str, observed: Observed, bootstrap: str, rate: int, out: Path):
        super().__init__(name)
        self.producer = ProducerHistory(name, "queue", QUEUE)
        self.consumer = ConsumerHistory(name, "queue", QUEUE)
        self.observed = observed
        self.out = out
        self.finished = False
        self.commit_failures = 0
        cmd = ["java", "-XX:TieredStopAtLevel=1", "-XX:+UseSerialGC", "-Xmx256m",
               "-Dorg.slf4j.simpleLogger.defaultLogLevel=warn", "-cp", f"{JAVA_DEPS}/*", str(JAVA_SOURCE),
               bootstrap, QUEUE, GROUP, name, str(rate)]
        self.stderr = open(out / f"{name}.err", "wb")
        self.proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self.stderr)

    def work(self) -> None:
        with open(self.out / f"{self.name}.out", "w") as raw:
            for line in self.proc.stdout:
                line = line.decode()
                raw.write(line)
                self.parse(line.split())

    def parse(self, words: list[str]) -> None:
        if not words:
            return
        if words[0] == "P" and words[1] in ("ack", "fail"):
            session, n = int(words[2]), int(words[3])
            value = f"j{self.name}-{n}"
            self.producer.attempted.add(value)
            if words[1] == "ack":
                self.producer.ack(session, n, value, int(words[4]), int(words[5]), self.observed)
            else:
                self.producer.fail(session, n, value, words[4])
        elif words[0] == "C" and words[1] in ("assign", "revoke", "lost"):
            parts = [] if words[2] == "-" else [int(p) for p in words[2].split(",")]
            self.consumer.events.append((words[1], parts))
        elif words[0] == "C" and words[1] == "poll":
            batch = []
            for r in words[2:]:
                partition, offset, value = r.split(":", 2)
                batch.append((int(partition), int(offset), value_of(value.encode())))
            self.consumer.poll(batch, self.observed)
        elif words[0] == "C" and words[1] == "commit_failed":
            self.commit_failures += 1
        elif words[0] == "attempted":
            self.producer.attempted.update(f"j{self.name}-{n}" for n in range(int(words[1])))
        elif words[0] == "done":
            self.finished = True

    def stop(self, timeout: float = 90.0) -> None:
        """Closes its stdin (the signal to stop) and waits for it to flush, close and exit."""
        try:
            self.proc.stdin.close()
        except OSError:
            pass
        try:
            self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self.join(30)
        self.stderr.close()


# ---- each node's filesystem --------------------------------------------------------------------


def run_command(args: list, **kw) -> subprocess.CompletedProcess:
    done = subprocess.run([str(a) for a in args], capture_output=True, text=True, **kw)
    assert done.returncode == 0, f"{' '.join(map(str, args))}: exit {done.returncode}: {done.stderr.strip()}"
    return done


def syncfs(path: Path) -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    fd = os.open(path, os.O_RDONLY)
    try:
        libc.syncfs(fd)
    finally:
        os.close(fd)


class Disk:
    """A sparse ext4 image of DISK_BYTES on a loop device, mounted at `mount_point`; the node's
    data directory lives inside it."""

    def __init__(self, root: Path):
        self.image = root / "fs.img"
        self.mount_point = root / "fs"
        self.device: str | None = None
        self.filler = self.mount_point / "filler"

    def create(self) -> None:
        self.mount_point.mkdir(parents=True, exist_ok=True)
        with open(self.image, "wb") as f:
            f.truncate(DISK_BYTES)
        run_command(["mkfs.ext4", "-q", "-F", "-m", "0", "-b", "4096", self.image])
        self.device = run_command(["losetup", "--find", "--show", self.image]).stdout.strip()
        assert self.device.startswith("/dev/loop"), self.device
        run_command(["mount", "-t", "ext4", self.device, self.mount_point])

    def fill(self) -> int:
        """Takes every free byte; returns how many."""
        taken = 0
        fd = os.open(self.filler, os.O_WRONLY | os.O_CREAT, 0o644)
        try:
            for chunk in (1 << 30, 64 << 20, 1 << 20, 64 << 10, 4096):
                while True:
                    try:
                        os.posix_fallocate(fd, taken, chunk)
                    except OSError as e:
                        if e.errno != errno.ENOSPC:
                            raise
                        break
                    taken += chunk
            os.fsync(fd)
        finally:
            os.close(fd)
        return taken

    def free(self) -> None:
        self.filler.unlink(missing_ok=True)
        syncfs(self.mount_point)

    def remove(self, keep_image: bool = False) -> list[str]:
        """Unmounts and detaches (the image stays when `keep_image`: `mount -o loop` it to look
        at a failed run's data); returns what went wrong."""
        problems = []
        if self.device is None:
            return problems
        deadline = time.monotonic() + 10
        while True:
            done = subprocess.run(["umount", str(self.mount_point)], capture_output=True, text=True)
            if done.returncode == 0:
                break
            if time.monotonic() > deadline:
                problems.append(f"umount {self.mount_point}: {done.stderr.strip()}; unmounted lazily")
                subprocess.run(["umount", "-l", str(self.mount_point)], capture_output=True)
                break
            time.sleep(0.2)
        done = subprocess.run(["losetup", "-d", self.device], capture_output=True, text=True)
        if done.returncode != 0:
            problems.append(f"losetup -d {self.device}: {done.stderr.strip()}")
        self.device = None
        if not keep_image:
            self.image.unlink(missing_ok=True)
        return problems


# ---- looking at the cluster --------------------------------------------------------------------


def sluice(*args, timeout: float = 30) -> subprocess.CompletedProcess:
    return subprocess.run([str(SLUICE_BIN), *map(str, args)], capture_output=True, text=True, timeout=timeout)


def active_controller(cluster: Cluster, paused: set[int], timeout: float = 15.0) -> int | None:
    """The quorum leader, from DescribeQuorum at any node that answers."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for n in cluster.nodes:
            if not n.running() or n.node_id in paused:
                continue
            try:
                out = sluice("cluster", "--bootstrap-controller", f"{n.host}:{n.controller_port}", timeout=10)
            except subprocess.TimeoutExpired:
                continue
            for line in out.stdout.splitlines():
                if line.startswith("LeaderId: ") and int(line.split()[1]) >= 0:
                    return int(line.split()[1])
        time.sleep(0.2)
    return None


def topic_partitions(bootstrap: str, topic: str | None = None) -> dict[tuple[str, int], tuple]:
    """(topic, partition) -> (leader, replicas, ISR) from Metadata; empty when none answers."""
    try:
        md = admin(bootstrap).list_topics(topic=topic, timeout=5)
    except KafkaException:
        return {}
    out = {}
    for name, t in md.topics.items():
        if t.error is not None:
            continue
        for p in t.partitions.values():
            out[(name, p.id)] = (p.leader, list(p.replicas), list(p.isrs))
    return out


def reassignments_done(bootstrap: str) -> bool:
    try:
        out = sluice("reassign", "list", "--bootstrap-server", bootstrap)
    except subprocess.TimeoutExpired:
        return False
    return out.returncode == 0 and "No partition reassignments in progress." in out.stdout


# ---- the nemesis -------------------------------------------------------------------------------


def schedule(seed: int, cycles: int, faults=FAULTS) -> list[tuple[str, float, int]]:
    """(fault, hold seconds, the cycle's own seed) for each cycle: every block of len(faults)
    cycles holds each fault once, in an order drawn from `seed`."""
    rng = random.Random(seed)
    plan = []
    while len(plan) < cycles:
        block = list(faults)
        rng.shuffle(block)
        plan.extend(block)
    return [(kind, round(rng.uniform(*HOLD_S), 2), rng.getrandbits(32)) for kind in plan[:cycles]]


class Nemesis:
    """Applies and heals the faults; keeps what it did."""

    def __init__(self, cluster: Cluster, net: Network, disks: dict[int, Disk]):
        self.cluster = cluster
        self.net = net
        self.disks = disks
        self.paused: set[int] = set()
        self.lossy: set[int] = set()
        self.counts: collections.Counter = collections.Counter()
        self.crashes: list[str] = []
        self.notes: collections.Counter = collections.Counter()

    @property
    def ids(self) -> list[int]:
        return [n.node_id for n in self.cluster.nodes]

    def live_bootstrap(self) -> str:
        return ",".join(n.bootstrap for n in self.cluster.nodes if n.running() and n.node_id not in self.paused)

    def apply(self, kind: str, rng: random.Random):
        """Applies `kind`; returns (what was done, the heal)."""
        self.counts[kind] += 1
        return getattr(self, "_" + kind.replace("-", "_"))(rng)

    # Kills.
    def _kill(self, node_id: int, why: str):
        victim = self.cluster.node(node_id)
        victim.kill()
        return f"kill -9 node {node_id} ({why})", lambda: self.restart(victim)

    def _kill_leader(self, rng):
        partitions = {QUEUE: QUEUE_PARTITIONS, APPEND: APPEND_PARTITIONS, SHARE: SHARE_PARTITIONS}
        topic = rng.choice(list(partitions))
        partition = rng.randrange(partitions[topic])
        fallback = rng.choice(self.ids)
        leader = topic_partitions(self.live_bootstrap(), topic).get((topic, partition), (-1,))[0]
        if leader not in self.ids:
            self.notes["kill-leader without a leader"] += 1
            return self._kill(fallback, f"{topic}-{partition} had no leader")
        return self._kill(leader, f"leader of {topic}-{partition}")

    def _kill_controller(self, rng):
        fallback = rng.choice(self.ids)
        controller = active_controller(self.cluster, self.paused)
        if controller is None:
            self.notes["kill-controller without a controller"] += 1
            return self._kill(fallback, "no active controller found")
        return self._kill(controller, "active controller")

    def _kill_random(self, rng):
        return self._kill(rng.choice(self.ids), "random")

    def restart(self, node) -> None:
        node.start(wait=False)
        node.wait_ready(wait_for_partitions=False)
        self.await_registration(node)

    def await_registration(self, node) -> None:
        deadline = time.monotonic() + RECOVERY_S
        while "broker state changed fenced=false" not in node.current_log():
            if time.monotonic() > deadline:
                self.notes["slow re-registration"] += 1
                return
            time.sleep(0.1)

    # Pauses.
    def _pause(self, rng):
        victim = self.cluster.node(rng.choice(self.ids))
        os.kill(victim.pid, signal.SIGSTOP)
        self.paused.add(victim.node_id)

        def heal():
            os.kill(victim.pid, signal.SIGCONT)
            self.paused.discard(victim.node_id)

        return f"SIGSTOP node {victim.node_id}", heal

    # Network partitions.
    def _partition_halves(self, rng):
        order = rng.sample(self.ids, len(self.ids))
        minority, majority = order[: len(order) // 2], order[len(order) // 2:]
        for m in minority:
            self.net.cut(m, majority)
        return f"partition {sorted(minority)} | {sorted(majority)}", self.net.heal

    def _partition_bridge(self, rng):
        order = rng.sample(self.ids, len(self.ids))
        bridge, rest = order[0], order[1:]
        left, right = rest[: len(rest) // 2], rest[len(rest) // 2:]
        for a in left:
            self.net.cut(a, right)
        return f"bridge {sorted(left)} <- {bridge} -> {sorted(right)}", self.net.heal

    def _partition_controller(self, rng):
        fallback = rng.choice(self.ids)
        controller = active_controller(self.cluster, self.paused)
        if controller is None:
            self.notes["partition-controller without a controller"] += 1
            controller = fallback
        self.net.cut(controller, [i for i in self.ids if i != controller])
        return f"isolate node {controller} (active controller)", self.net.heal

    # Packet loss.
    def _packet_loss(self, rng):
        every = rng.random() < 0.5
        targets = self.ids if every else [rng.choice(self.ids)]
        percent = rng.choice(LOSS_PERCENT)
        drop = f"numgen random mod 100 < {percent} drop"
        rules = (f"table inet jepsen_loss {{\n"
                 f"  chain input {{ type filter hook input priority 0; iifname \"eth0\" {drop}; }}\n"
                 f"  chain output {{ type filter hook output priority 0; oifname \"eth0\" {drop}; }}\n"
                 f"}}\n")
        for t in targets:
            run_command(["ip", "netns", "exec", self.net.ns(t), "nft", "-f", "-"], input=rules)
            self.lossy.add(t)
        return f"{percent}% packet loss at {'every node' if every else f'node {targets[0]}'}", self.heal_loss

    def heal_loss(self) -> None:
        for t in sorted(self.lossy):
            run_command(["ip", "netns", "exec", self.net.ns(t), "nft", "delete", "table", "inet", "jepsen_loss"])
        self.lossy.clear()

    # Full disks.
    def _disk_full(self, rng):
        node_id = rng.choice(self.ids)
        disk = self.disks[node_id]
        taken = disk.fill()
        return f"disk full at node {node_id} ({taken >> 20} MiB taken)", disk.free

    # Membership changes.
    def _membership(self, rng):
        bootstrap = self.live_bootstrap()
        before = topic_partitions(bootstrap)
        if len(self.ids) >= 4:
            broker = rng.choice(self.ids)
            out = sluice("reassign", "drain", "--broker", broker, "--no-wait", "--bootstrap-server", bootstrap,
                         timeout=60)
            if out.returncode != 0:
                self.notes["membership refused"] += 1
                return f"drain of broker {broker} refused: {out.stderr.strip()[:120]}", lambda: None
            return f"drain broker {broker}", lambda: self.move_back(before)
        topic = rng.choice([QUEUE, APPEND])
        partition = rng.randrange(QUEUE_PARTITIONS if topic == QUEUE else APPEND_PARTITIONS)
        replicas = before.get((topic, partition), (None, [], []))[1]
        if len(replicas) < 2:
            self.notes["membership without metadata"] += 1
            return f"no metadata for {topic}-{partition}", lambda: None
        dropped = rng.choice(replicas)
        smaller = [r for r in replicas if r != dropped]
        out = sluice("reassign", "move", topic, "--partition", partition, "--replicas", ",".join(map(str, smaller)),
                     "--no-wait", "--bootstrap-server", bootstrap, timeout=60)
        if out.returncode != 0:
            self.notes["membership refused"] += 1
            return f"shrink of {topic}-{partition} refused: {out.stderr.strip()[:120]}", lambda: None
        return (f"{topic}-{partition} replicas {replicas} -> {smaller}",
                lambda: self.move_back({(topic, partition): before[(topic, partition)]}))

    def move_back(self, before: dict) -> None:
        """Waits for the reassignment in progress, then gives every partition that changed its
        replicas of `before` back, and waits for that too."""
        self.await_reassignments()
        now = topic_partitions(self.live_bootstrap())
        for (topic, partition), (_, replicas, _) in sorted(before.items()):
            if (topic, partition) in now and now[(topic, partition)][1] != replicas:
                out = sluice("reassign", "move", topic, "--partition", partition, "--replicas",
                             ",".join(map(str, replicas)), "--no-wait", "--bootstrap-server", self.live_bootstrap(),
                             timeout=60)
                if out.returncode != 0:
                    self.notes["move back refused"] += 1
        self.await_reassignments()

    def await_reassignments(self) -> None:
        deadline = time.monotonic() + REASSIGN_S
        while not reassignments_done(self.live_bootstrap()):
            if time.monotonic() > deadline:
                self.notes["reassignment still in progress"] += 1
                return
            time.sleep(0.5)

    # After every heal.
    def recover(self) -> None:
        """Starts again any node that exited by itself (each a reported crash)."""
        for n in self.cluster.nodes:
            if n.proc is not None and n.proc.poll() is not None:
                self.crashes.append(f"node {n.node_id} exited with {n.proc.returncode}")
                self.restart(n)

    def heal_everything(self) -> None:
        for node_id in sorted(self.paused):
            os.kill(self.cluster.node(node_id).pid, signal.SIGCONT)
        self.paused.clear()
        self.net.heal()
        if self.lossy:
            self.heal_loss()
        for d in self.disks.values():
            if d.device is not None:
                d.free()


# ---- the final read ----------------------------------------------------------------------------


def final_read(bootstrap: str, topic: str, partitions: int) -> dict[int, list[tuple[int, str]]]:
    """Every record of every partition, from offset 0 to its high watermark, with `assign`."""
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": "jepsen-final-read-unused", "enable.auto.commit": False,
                  "auto.offset.reset": "error", "fetch.wait.max.ms": 100, "logger": CLIENT_LOG,
                  "log.connection.close": False})
    try:
        ends = {}
        for p in range(partitions):
            deadline = time.monotonic() + FINAL_READ_S
            while True:
                try:
                    ends[p] = c.get_watermark_offsets(TopicPartition(topic, p), timeout=10, cached=False)[1]
                    break
                except KafkaException:
                    if time.monotonic() > deadline:
                        raise
                    time.sleep(0.5)
        c.assign([TopicPartition(topic, p, 0) for p in range(partitions)])
        out: dict[int, list[tuple[int, str]]] = {p: [] for p in range(partitions)}
        pending = {p for p in range(partitions) if ends[p] > 0}
        deadline = time.monotonic() + FINAL_READ_S
        while pending:
            if time.monotonic() > deadline:
                raise AssertionError(f"the final read of {topic} timed out; still reading {sorted(pending)} "
                                     f"(ends {ends}, read {[len(out[p]) for p in range(partitions)]})")
            for m in c.consume(num_messages=10_000, timeout=0.5):
                if m.error() is not None:
                    continue
                p = m.partition()
                if m.offset() < ends[p]:
                    out[p].append((m.offset(), value_of(m.value())))
                if m.offset() >= ends[p] - 1:
                    pending.discard(p)
        return out
    finally:
        c.close()


# ---- the checker -------------------------------------------------------------------------------


def check(producers: list[ProducerHistory], consumers: list[ConsumerHistory],
          final: dict[str, dict[int, list[tuple[int, str]]]], examples_max: int = 10) -> dict:
    """Jepsen's Kafka checker over the histories and the final read (see the module's
    docstring for each count)."""
    examples: dict[str, list] = collections.defaultdict(list)

    def note(kind: str, example) -> None:
        if len(examples[kind]) < examples_max:
            examples[kind].append(example)

    # Every observation of (topic, partition, offset) -> value.
    at: dict[tuple, set] = collections.defaultdict(set)
    where: dict[str, set] = collections.defaultdict(set)

    def observe(topic, partition, offset, value):
        at[(topic, partition, offset)].add(value)
        where[value].add((topic, partition, offset))

    final_values: set[str] = set()
    final_offsets: dict[tuple[str, int], list[int]] = {}
    for topic, parts in final.items():
        for p, records in parts.items():
            final_offsets[(topic, p)] = [o for o, _ in records]
            for o, v in records:
                observe(topic, p, o, v)
                final_values.add(v)

    acked: dict[str, tuple] = {}
    workload_of_topic = {}
    attempted: set[str] = set()
    failed = 0
    acks_without_offset = 0
    nonmonotonic_sends = 0
    for h in producers:
        workload_of_topic[h.topic] = h.workload
        attempted |= h.attempted
        by_partition = collections.defaultdict(list)
        for session, n, value, partition, outcome in h.sends:
            if partition < 0:
                failed += 1
                continue
            acked[value] = (h.workload, h.topic, partition, outcome)
            if outcome < 0:
                acks_without_offset += 1
                note("acks_without_offset", f"{h.name} session {session} {value} on {h.topic}-{partition}")
                continue
            observe(h.topic, partition, outcome, value)
            by_partition[(session, partition)].append((n, outcome, value))
        for (session, partition), sends in by_partition.items():
            sends.sort()
            for (_, o1, v1), (_, o2, v2) in zip(sends, sends[1:]):
                if o2 <= o1:
                    nonmonotonic_sends += 1
                    note("nonmonotonic_sends", f"{h.name} session {session} {h.topic}-{partition}: "
                                               f"{v1}@{o1} then {v2}@{o2}")

    seen: dict[str, set] = collections.defaultdict(set)
    counts = collections.Counter()
    incompatible_orders = 0
    final_by_key = final_key_orders(final.get(APPEND, {}))
    for c in consumers:
        workload_of_topic.setdefault(c.topic, c.workload)
        last: dict[int, int] = {}
        previous: dict[int, int] = {}
        # The list-append reads, per assignment of a partition: key -> values in offset order.
        reads: dict[str, list] = collections.defaultdict(list)
        epoch_reads = []
        for kind, body in c.events:
            if kind != "poll":
                for p in body:
                    if p in last:
                        previous[p] = last.pop(p)
                if c.workload == "append" and kind == "assign":
                    epoch_reads.append(reads)
                    reads = collections.defaultdict(list)
                continue
            for p, o, v in body:
                observe(c.topic, p, o, v)
                seen[c.workload].add(v)
                if c.workload == "append":
                    reads[append_key(v)].append(v)
                before, rebalanced = (last[p], False) if p in last else (previous.get(p), True)
                if before is not None:
                    if o <= before:
                        kind_name = "nonmonotonic_polls_after_rebalance" if rebalanced else "nonmonotonic_polls"
                        counts[kind_name] += 1
                        note(kind_name, f"{c.name} {c.topic}-{p}: offset {before} then {o}")
                    elif o > before + 1:
                        offsets = final_offsets.get((c.topic, p), [])
                        i = bisect.bisect_right(offsets, before)
                        if i < len(offsets) and offsets[i] < o:
                            kind_name = "poll_skips_after_rebalance" if rebalanced else "poll_skips"
                            counts[kind_name] += 1
                            note(kind_name, f"{c.name} {c.topic}-{p}: offset {before} then {o}, "
                                            f"skipping {offsets[i]}")
                last[p] = o
                previous.pop(p, None)
        epoch_reads.append(reads)
        if c.workload == "append":
            for r in epoch_reads:
                for key, values in r.items():
                    order = final_by_key.get(key, [])
                    if values != order[: len(values)]:
                        incompatible_orders += 1
                        note("incompatible_orders", f"{c.name} key {key}: read {values[:3]}...({len(values)}), "
                                                    f"final {order[:3]}...({len(order)})")

    lost = [v for v in acked if v not in final_values]
    for v in sorted(lost)[:examples_max]:
        note("lost", f"{v} acknowledged at {acked[v][1]}-{acked[v][2]}@{acked[v][3]}")
    duplicated = [v for v, places in where.items() if len(places) > 1]
    failures = {value: error for h in producers for _, _, value, partition, error in h.sends if partition < 0}
    for v in sorted(duplicated)[:examples_max]:
        status = (f"acknowledged at {acked[v][3]}" if v in acked
                  else f"not acknowledged ({failures[v]})" if v in failures else "no outcome")
        note("duplicated", f"{v} at {sorted(where[v])}, {status}")
    inconsistent = [k for k, values in at.items() if len(values) > 1]
    for k in sorted(inconsistent)[:examples_max]:
        note("inconsistent_offsets", f"{k[0]}-{k[1]}@{k[2]}: {sorted(at[k])}")
    unexpected = [v for v in where if v not in attempted]
    for v in sorted(unexpected)[:examples_max]:
        note("unexpected", f"{v} at {sorted(where[v])}")
    unseen = [v for v, (workload, *_rest) in acked.items() if v not in seen[workload]]
    for v in sorted(unseen)[:examples_max]:
        note("unseen", f"{v} acknowledged at {acked[v][1]}-{acked[v][2]}@{acked[v][3]}")
    recovered = sum(1 for v in final_values if v in attempted and v not in acked)

    by_workload = {w: sum(1 for a in acked.values() if a[0] == w) for w in ("queue", "append")}
    result = {
        "acknowledged": len(acked),
        "acknowledged_by_workload": by_workload,
        "failed_sends": failed,
        "acks_without_offset": acks_without_offset,
        "recovered": recovered,
        "final_read_records": sum(len(r) for parts in final.values() for r in parts.values()),
        "lost": len(lost),
        "duplicated": len(duplicated),
        "duplicated_acknowledged": sum(1 for v in duplicated if v in acked),
        "duplicated_offsets": duplicated_offsets(where, duplicated),
        "inconsistent_offsets": len(inconsistent),
        "unexpected": len(unexpected),
        "unseen": len(unseen),
        "incompatible_orders": incompatible_orders,
        "nonmonotonic_sends": nonmonotonic_sends,
        "poll_skips": counts["poll_skips"],
        "nonmonotonic_polls": counts["nonmonotonic_polls"],
        "poll_skips_after_rebalance": counts["poll_skips_after_rebalance"],
        "nonmonotonic_polls_after_rebalance": counts["nonmonotonic_polls_after_rebalance"],
        "examples": dict(examples),
    }
    failing = ("lost", "duplicated", "inconsistent_offsets", "unexpected", "unseen", "incompatible_orders",
               "nonmonotonic_sends", "poll_skips", "nonmonotonic_polls")
    result["anomalies"] = [k for k in failing if result[k] > 0]
    if result["acknowledged"] == 0:
        result["anomalies"].append("nothing acknowledged")
    result["valid"] = not result["anomalies"]
    return result


def duplicated_offsets(where: dict, duplicated: list[str]) -> dict[str, list[int]]:
    """`topic-partition` -> [first, last] offset holding a duplicated value, for the dumps."""
    out: dict[str, list[int]] = {}
    for v in duplicated:
        for topic, partition, offset in where[v]:
            span = out.setdefault(f"{topic}-{partition}", [offset, offset])
            span[0], span[1] = min(span[0], offset), max(span[1], offset)
    return out


def record_producers(partition_dir: Path) -> dict[str, list[tuple[int, int, int, int]]]:
    """Each value in one replica's segment files (uncompressed batches, as these producers send)
    -> its copies as (offset, producer id, producer epoch, sequence)."""
    out: dict[str, list[tuple[int, int, int, int]]] = collections.defaultdict(list)
    for segment in sorted(partition_dir.glob("*.log")):
        data = segment.read_bytes()
        at = 0
        while at + 61 <= len(data):
            base, length = struct.unpack_from(">qi", data, at)
            if length <= 0 or at + 12 + length > len(data):
                break
            attributes, = struct.unpack_from(">h", data, at + 21)
            producer_id, producer_epoch, base_sequence, count = struct.unpack_from(">qhii", data, at + 43)
            i = at + 61
            for _ in range(count if attributes & 7 == 0 else 0):
                length_of, i = zigzag(data, i)
                end = i + length_of
                i += 1  # attributes
                _, i = zigzag(data, i)  # timestamp delta
                offset_delta, i = zigzag(data, i)
                key_length, i = zigzag(data, i)
                i += max(key_length, 0)
                value_length, i = zigzag(data, i)
                value = data[i:i + value_length].split(b"|", 1)[0].decode(errors="replace")
                out[value].append((base + offset_delta, producer_id, producer_epoch, base_sequence + offset_delta))
                i = end
            at += length + 12
    return out


def zigzag(data: bytes, i: int) -> tuple[int, int]:
    """A zigzag varint of a record (Kafka's record format) at `i`: (value, next position)."""
    shift = result = 0
    while True:
        byte = data[i]
        i += 1
        result |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return (result >> 1) ^ -(result & 1), i
        shift += 7


def attribute_duplicates(cluster: Cluster, duplicated_offsets: dict) -> dict[str, int]:
    """Splits the duplicated values by what their copies' batches say, on every replica: the
    same producer id, epoch and sequence twice (the broker appended a retry it should have
    answered with the first offsets), or a later copy under a newer epoch of the same producer
    (the client sent it again after bumping its epoch, which no broker can detect)."""
    same_sequence: set[str] = set()
    new_epoch: set[str] = set()
    for name in duplicated_offsets:
        for n in cluster.nodes:
            for value, copies in record_producers(n.data_dir / name).items():
                if len(copies) < 2:
                    continue
                keys = [(pid, epoch, seq) for _, pid, epoch, seq in copies]
                if len(set(keys)) < len(keys):
                    same_sequence.add(value)
                elif len({pid for pid, _, _ in keys}) == 1 and len({e for _, e, _ in keys}) == len(keys):
                    new_epoch.add(value)
    return {"duplicated_same_sequence": len(same_sequence),
            "duplicated_after_client_epoch_bump": len(new_epoch - same_sequence)}


def batch_headers(partition_dir: Path, first: int, last: int) -> list[str]:
    """The record batch headers (engine/FORMAT.md) of one replica's segment files that overlap
    offsets first..last: offsets, leader epoch, producer id, epoch and base sequence."""
    lines = []
    for segment in sorted(partition_dir.glob("*.log")):
        data = segment.read_bytes()
        at = 0
        while at + 61 <= len(data):
            base, length, leader_epoch = struct.unpack_from(">qii", data, at)
            if length <= 0:
                break  # the preallocated tail
            last_delta, = struct.unpack_from(">i", data, at + 23)
            producer_id, producer_epoch, base_sequence, count = struct.unpack_from(">qhii", data, at + 43)
            if base + last_delta >= first and base <= last:
                lines.append(f"{segment.name} offsets {base}..{base + last_delta} leader_epoch {leader_epoch} "
                             f"producer {producer_id} epoch {producer_epoch} sequence {base_sequence}.."
                             f"{base_sequence + count - 1}")
            at += length + 12
    return lines


def append_key(value: str) -> str:
    """The key of a list-append value `a<producer>-<key>-<n>`."""
    return value.split("-")[-2]


def final_key_orders(parts: dict[int, list[tuple[int, str]]]) -> dict[str, list[str]]:
    """Each list-append key's values in the final read, in offset order."""
    out: dict[str, list[str]] = collections.defaultdict(list)
    for _, records in sorted(parts.items()):
        for _, v in records:
            out[append_key(v)].append(v)
    return out


# ---- a run -------------------------------------------------------------------------------------

# What the nodes' logs say the faults did, counted over every node: evidence that they bite.
LOG_EVENTS = {
    "leaderships taken": "leading the partition",
    "ISR changes": "ISR changed",
    "divergent logs truncated": "follower log diverged",
    "quorum leader changes": "metadata quorum leader leader=Some",
    "starts": "===== start ",
    "writes refused by a full disk": "No space left on device",
}


def log_events(cluster: Cluster) -> dict[str, int]:
    counts = dict.fromkeys(LOG_EVENTS, 0)
    for n in cluster.nodes:
        for line in n.log_text().splitlines():
            for name, needle in LOG_EVENTS.items():
                if needle in line:
                    counts[name] += 1
    return counts



def create_topics(bootstrap: str) -> None:
    client = admin(bootstrap)
    config = {"min.insync.replicas": str(MIN_INSYNC_REPLICAS), "segment.bytes": str(SEGMENT_BYTES)}
    futures = client.create_topics(
        [NewTopic(QUEUE, num_partitions=QUEUE_PARTITIONS, replication_factor=REPLICATION_FACTOR, config=config),
         NewTopic(APPEND, num_partitions=APPEND_PARTITIONS, replication_factor=REPLICATION_FACTOR, config=config),
         NewTopic(SHARE, num_partitions=SHARE_PARTITIONS, replication_factor=REPLICATION_FACTOR, config=config)],
        operation_timeout=10, request_timeout=20)
    for f in futures.values():
        f.result(timeout=30)
    # The share group reads from the start of its topic.
    from confluent_kafka.admin import AlterConfigOpType, ConfigEntry, ConfigResource
    group = ConfigResource("GROUP", SHARE_GROUP, incremental_configs=[
        ConfigEntry("share.auto.offset.reset", "earliest", incremental_operation=AlterConfigOpType.SET)])
    client.incremental_alter_configs([group])[group].result(timeout=30)
    deadline = time.monotonic() + 60
    while True:
        parts = topic_partitions(bootstrap)
        ready = [k for k, (leader, _, isr) in parts.items() if k[0] in (QUEUE, APPEND, SHARE) and leader >= 0
                 and len(isr) == REPLICATION_FACTOR]
        if len(ready) == QUEUE_PARTITIONS + APPEND_PARTITIONS + SHARE_PARTITIONS:
            return
        assert time.monotonic() < deadline, f"the workload topics never had leaders and full ISRs: {parts}"
        time.sleep(0.2)


def committed_lag(bootstrap: str, ends: dict[int, int]) -> int | None:
    """The queue group's lag once its members stopped: each partition's end minus the group's
    committed offset (0 when nothing was committed); None when the group's offsets cannot be
    fetched."""
    from confluent_kafka import ConsumerGroupTopicPartitions

    client = admin(bootstrap)
    try:
        answer = client.list_consumer_group_offsets([ConsumerGroupTopicPartitions(GROUP)], request_timeout=15)
        offsets = answer[GROUP].result(timeout=30)
    except KafkaException:
        return None
    committed = {tp.partition: max(tp.offset, 0) for tp in offsets.topic_partitions if tp.topic == QUEUE}
    return sum(end - committed.get(p, 0) for p, end in ends.items())


def open_fds(cluster: Cluster) -> dict[int, int]:
    """Each running node's open file descriptors."""
    out = {}
    for n in cluster.nodes:
        if n.running():
            try:
                out[n.node_id] = len(os.listdir(f"/proc/{n.pid}/fd"))
            except OSError:
                pass
    return out


def await_full_isrs(bootstrap: str, timeout: float) -> list[str]:
    """Waits until every partition's ISR is all its replicas; returns those still short after
    `timeout`, as `topic-partition isr/replicas`."""
    deadline = time.monotonic() + timeout
    while True:
        parts = topic_partitions(bootstrap)
        short = [f"{t}-{p} {sorted(isr)}/{sorted(replicas)}" for (t, p), (_, replicas, isr) in sorted(parts.items())
                 if sorted(isr) != sorted(replicas)]
        if parts and not short:
            return []
        if time.monotonic() > deadline:
            return short or ["no metadata"]
        time.sleep(0.5)


def wait_until(what: str, check, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, f"timed out after {timeout} s waiting for {what}"
        time.sleep(0.2)


def run(cycles: int, seed: int, nodes: int = 3, out: Path | None = None, java: bool = True,
        faults=FAULTS, time_limit_s: float | None = None, keep: bool = False) -> dict:
    """One run: the cluster, the workloads, `cycles` faults (fewer if `time_limit_s` passes
    first), the final read and the checker's result (also written to `out`/result.json)."""
    assert 3 <= nodes <= 5, "three to five nodes"
    assert os.geteuid() == 0, "network namespaces and loop devices need root"
    out = Path(out or REPO / "target" / "jepsen" / f"seed-{seed}")
    out.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    say(f"jepsen: seed {seed}, {nodes} nodes, {cycles} cycles, faults {','.join(faults)}, "
        f"clients librdkafka{' and Java' if java else ''}; output in {out}")
    client_log = logging.FileHandler(out / "librdkafka.log")
    client_log.setFormatter(logging.Formatter("%(asctime)s %(threadName)s %(message)s"))
    # The tests share this logger: its settings are put back at the end.
    logger_was = (CLIENT_LOG.propagate, CLIENT_LOG.level)
    CLIENT_LOG.addHandler(client_log)
    CLIENT_LOG.propagate = False
    CLIENT_LOG.setLevel(logging.DEBUG if librdkafka_debug() else logging.INFO)

    net = Network(nodes)
    disks: dict[int, Disk] = {}

    def place(node) -> None:
        net.place(node)
        disk = Disk(node.root)
        disk.create()
        disks[node.node_id] = disk
        node.data_dir = disk.mount_point / "data"

    result: dict = {"seed": seed, "nodes": nodes, "cycles_planned": cycles,
                    "clients": ["librdkafka"] + (["java"] if java else [])}
    cluster = None
    nemesis = None
    clients: list[Client] = []
    java_client = None
    history = None
    failed = True
    net.create()
    net.enter_clients()
    try:
        TEST_DIR.mkdir(parents=True, exist_ok=True)
        toml = out / "node.toml"
        toml.write_text(NODE_TOML)
        cluster = Cluster(nodes, name="jepsen", place=place, extra_args=[*NODE_ARGS, "--config", toml])
        cluster.start()
        bootstrap = cluster.bootstrap
        wait_until("every broker registered", lambda: all(
            len(admin(n.bootstrap).list_topics(timeout=10).brokers) == nodes for n in cluster.nodes), 60)
        create_topics(bootstrap)
        nemesis = Nemesis(cluster, net, disks)

        observed = {"queue": Observed(), "append": Observed(), "share": Observed()}
        producers: list[ProducerHistory] = []
        consumers: list[ConsumerHistory] = []
        for i in range(2):
            h = ProducerHistory(f"qp{i}", "queue", QUEUE)
            producers.append(h)
            clients.append(LibrdkafkaProducer(h, observed["queue"], bootstrap, seed * 100 + i, PRODUCE_RATE))
        for i in range(2):
            h = ProducerHistory(f"ap{i}", "append", APPEND)
            producers.append(h)
            clients.append(LibrdkafkaProducer(h, observed["append"], bootstrap, seed * 100 + 10 + i, PRODUCE_RATE))
        share_producers = [ProducerHistory("sp0", "share", SHARE)]
        clients.append(LibrdkafkaProducer(share_producers[0], observed["share"], bootstrap, seed * 100 + 20,
                                          PRODUCE_RATE))
        share_members = [ShareMember(f"sm{i}", observed["share"], bootstrap) for i in range(SHARE_MEMBERS)]
        clients.extend(share_members)
        for i in range(QUEUE_CONSUMERS):
            h = ConsumerHistory(f"qc{i}", "queue", QUEUE)
            consumers.append(h)
            clients.append(GroupConsumer(h, observed["queue"], bootstrap))
        for i in range(APPEND_READERS):
            h = ConsumerHistory(f"ar{i}", "append", APPEND)
            consumers.append(h)
            clients.append(AppendReader(h, observed["append"], bootstrap))
        if java:
            java_client = JavaQueueClient("jq0", observed["queue"], bootstrap, PRODUCE_RATE, out)
            producers.append(java_client.producer)
            consumers.append(java_client.consumer)
            clients.append(java_client)
        for c in clients:
            c.start()
        wait_until("every producer's first acknowledgements",
                   lambda: all(h.acked > 0 for h in producers + share_producers) or any(c.error for c in clients),
                   START_S)
        setup_s = time.monotonic() - started
        say(f"jepsen: cluster up and every producer acknowledged after {setup_s:.1f} s")

        fds_max = [0]

        def progress() -> str:
            acked = {w: len(o.acked) for w, o in observed.items()}
            seen = {w: len(o.seen) for w, o in observed.items()}
            fds = open_fds(cluster)
            fds_max[0] = max([fds_max[0], *fds.values()])
            return (f"acked queue {acked['queue']} append {acked['append']} share {acked['share']}, "
                    f"seen queue {seen['queue']} append {seen['append']} share {seen['share']}, "
                    f"fds {max(fds.values(), default=0)}")

        plan = schedule(seed, cycles, faults)
        nemesis_errors: list[str] = []
        errors_in_a_row = 0
        cycles_done = 0
        cycles_started = time.monotonic()
        for i, (kind, hold, cycle_seed) in enumerate(plan, 1):
            if time_limit_s is not None and time.monotonic() - started > time_limit_s:
                say(f"jepsen: time limit of {time_limit_s} s reached after {cycles_done} cycles")
                break
            if STOP_REQUESTED.is_set():
                say(f"jepsen: stopping the faults after {cycles_done} cycles, as asked")
                break
            broken = [c for c in clients if c.error is not None]
            if broken:
                raise AssertionError(f"client {broken[0].name} failed: {broken[0].error!r}")
            t0 = time.monotonic()
            try:
                what, heal = nemesis.apply(kind, random.Random(cycle_seed))
                time.sleep(hold)
                heal()
                nemesis.recover()
            except Exception as e:  # noqa: BLE001 - the history is checked all the same
                # A fault that could not be applied or healed: reported, everything healed, and
                # the run goes on (three in a row end the faults).
                what = f"nemesis error {e!r}"[:300]
                nemesis_errors.append(f"cycle {i} {kind}: {what}")
                try:
                    nemesis.heal_everything()
                    nemesis.recover()
                except Exception as again:  # noqa: BLE001
                    nemesis_errors.append(f"cycle {i} healing: {again!r}"[:300])
                errors_in_a_row += 1
                if errors_in_a_row == 3:
                    say(f"cycle {i}/{cycles} {kind}: {what}; three nemesis errors in a row, no more faults")
                    cycles_done = i
                    break
            else:
                errors_in_a_row = 0
            took = time.monotonic() - t0
            time.sleep(PAUSE_S)
            cycles_done = i
            say(f"cycle {i}/{cycles} {kind}: {what}, held {hold:.1f} s, healed after {took:.1f} s | "
                f"{progress()} | {time.monotonic() - started:.0f} s")
        cycle_s = time.monotonic() - cycles_started

        # Healthy again: the producers stop (the Java client's member leaves the group with its
        # producer, the librdkafka members take its partitions over), and the consumers go on
        # until they have seen every acknowledged value.
        nemesis.heal_everything()
        nemesis.recover()
        under_replicated = await_full_isrs(nemesis.live_bootstrap(), HEALTHY_S)
        unseen_before_drain = {w: o.unseen() for w, o in observed.items()}
        for c in clients:
            if isinstance(c, LibrdkafkaProducer):
                c.stopping.set()
        if java_client is not None:
            java_client.stop()
        for c in clients:
            if isinstance(c, LibrdkafkaProducer):
                c.join(90)
        drain_started = time.monotonic()
        while time.monotonic() - drain_started < DRAIN_S and any(o.unseen() for o in observed.values()):
            time.sleep(0.5)
        drain_s = time.monotonic() - drain_started
        for c in clients:
            c.stopping.set()
        for c in clients:
            c.join(60)
        broken = [c for c in clients if c.error is not None]
        if broken:
            raise AssertionError(f"client {broken[0].name} failed: {broken[0].error!r}")

        say(f"jepsen: drained in {drain_s:.1f} s; reading every partition from offset 0")
        final = {QUEUE: final_read(bootstrap, QUEUE, QUEUE_PARTITIONS),
                 APPEND: final_read(bootstrap, APPEND, APPEND_PARTITIONS)}
        share_final = final_read(bootstrap, SHARE, SHARE_PARTITIONS)
        group_lag = committed_lag(bootstrap, {p: r[-1][0] + 1 if r else 0 for p, r in final[QUEUE].items()})
        result.update(check(producers, consumers, final))
        result.update(check_share(share_producers, share_members, share_final))
        result["anomalies"] += result["share_anomalies"]
        result["valid"] = not result["anomalies"]
        history = {"producers": {h.name: h.sends for h in producers + share_producers},
                   "consumers": {c.name: c.events for c in consumers},
                   "share_members": {m.name: {"deliveries": m.deliveries, "accepted": m.accepted}
                                     for m in share_members},
                   "final": {t: {str(p): r for p, r in parts.items()} for t, parts in final.items()}}
        result.update({
            "cycles": cycles_done,
            "fault_mix": dict(sorted(nemesis.counts.items())),
            "node_crashes": nemesis.crashes,
            "notes": dict(nemesis.notes),
            "nemesis_errors": nemesis_errors,
            "unseen_before_drain": unseen_before_drain,
            "under_replicated_at_end": under_replicated,
            "group_lag_at_end": group_lag,
            "node_open_fds_max": fds_max[0],
            "producer_sessions": {c.name: c.sessions for c in clients if isinstance(c, LibrdkafkaProducer)},
            "commit_failures": sum(getattr(c, "commit_failures", 0) for c in clients if not isinstance(c, ShareMember)),
            "java_finished": java_client.finished if java_client else None,
            "setup_s": round(setup_s, 1),
            "cycle_s_mean": round(cycle_s / max(cycles_done, 1), 2),
            "drain_s": round(drain_s, 1),
        })
        if java_client is not None and not java_client.finished:
            result["anomalies"].append("the Java client did not finish")
        failed = False
    finally:
        for c in clients:
            c.stopping.set()
        if java_client is not None and java_client.proc.poll() is None:
            java_client.stop(30)
        for c in clients:
            c.join(30)
        if nemesis is not None:
            try:
                nemesis.heal_everything()
            except AssertionError as e:
                say(f"jepsen: healing at the end: {e}")
        if cluster is not None:
            try:
                cluster.stop()
            except BrokerError as e:
                result.setdefault("stop_errors", []).append(str(e).splitlines()[0])
            panics = []
            for n in cluster.nodes:
                panics += [f"node {n.node_id}: {line}" for line in n.log_text().splitlines() if "panicked" in line]
                shutil.copy(n.log_path, out / f"node-{n.node_id}.log")
            result["panics"] = panics
            result["log_events"] = log_events(cluster)
        invalid = failed or bool(result.get("anomalies")) or bool(result.get("panics"))
        if cluster is not None and result.get("duplicated_offsets"):
            result.update(attribute_duplicates(cluster, result["duplicated_offsets"]))
            for name, (first, last) in result["duplicated_offsets"].items():
                for n in cluster.nodes:
                    lines = batch_headers(n.data_dir / name, first, last)
                    (out / f"batches-{name}-node-{n.node_id}.txt").write_text("\n".join(lines) + "\n")
        if invalid and history is not None:
            with gzip.open(out / "history.json.gz", "wt") as f:
                json.dump(history, f)
        problems = []
        for d in disks.values():
            problems += d.remove(keep_image=invalid)
        if invalid:
            result["kept"] = [str(d.image) for d in disks.values()]
        if problems:
            result["cleanup_problems"] = problems
        net.leave_clients()
        net.destroy()
        CLIENT_LOG.removeHandler(client_log)
        CLIENT_LOG.propagate, _ = logger_was
        CLIENT_LOG.setLevel(logger_was[1])
        client_log.close()
        if cluster is not None and not failed and not keep and not result.get("anomalies") and not result.get("panics"):
            for n in cluster.nodes:
                n.remove()
    if result.get("panics"):
        result["anomalies"].append("panics")
        result["valid"] = False
    result["elapsed_s"] = round(time.monotonic() - started, 1)
    (out / "result.json").write_text(json.dumps(result, indent=2) + "\n")
    return result


def summary(result: dict) -> str:
    keys = ("seed", "nodes", "cycles", "acknowledged", "lost", "duplicated", "inconsistent_offsets", "unexpected",
            "unseen", "incompatible_orders", "nonmonotonic_sends", "poll_skips", "nonmonotonic_polls",
            "poll_skips_after_rebalance", "nonmonotonic_polls_after_rebalance", "acks_without_offset", "recovered",
            "failed_sends", "group_lag_at_end", "share_acknowledged", "share_lost", "share_undelivered",
            "share_redelivered_after_acceptance", "share_redelivered", "share_never_accepted",
            "share_delivery_counts_repeated", "elapsed_s")
    return ", ".join(f"{k} {result.get(k)}" for k in keys)


def main() -> int:
    parser = argparse.ArgumentParser(description="Jepsen-style queue, list-append and share workloads against a Sluice "
                                                 "cluster under seeded faults (root).")
    parser.add_argument("--cycles", type=int, default=100)
    parser.add_argument("--seed", type=int, default=None, help="the fault schedule's seed (random when not given)")
    parser.add_argument("--nodes", type=int, default=3, choices=(3, 4, 5))
    parser.add_argument("--out", type=Path, default=None, help="where result.json and the logs go")
    parser.add_argument("--faults", default=",".join(FAULTS), help="comma-separated, of " + ",".join(FAULTS))
    parser.add_argument("--no-java", action="store_true", help="librdkafka clients only")
    parser.add_argument("--keep", action="store_true", help="keep the nodes' data directories")
    args = parser.parse_args()
    seed = args.seed if args.seed is not None else random.SystemRandom().randrange(1 << 31)
    faults = tuple(args.faults.split(","))
    unknown = [f for f in faults if f not in FAULTS]
    if unknown:
        parser.error(f"unknown faults: {', '.join(unknown)}")

    def stop(signum, frame):
        if STOP_REQUESTED.is_set():
            raise KeyboardInterrupt(f"signal {signum}")
        say(f"jepsen: signal {signum}: finishing the cycle, then checking what was done (again to abort)")
        STOP_REQUESTED.set()

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    result = run(args.cycles, seed, args.nodes, args.out, java=not args.no_java, faults=faults, keep=args.keep)
    say("jepsen: " + summary(result))
    say(f"jepsen: fault mix {json.dumps(result.get('fault_mix'))}")
    say(f"jepsen: node logs {json.dumps(result.get('log_events'))}")
    if result["valid"]:
        say("jepsen: valid")
        return 0
    say(f"jepsen: INVALID: {', '.join(result['anomalies'])}")
    for kind, examples in [*result.get("examples", {}).items(), *result.get("share_examples", {}).items()]:
        for e in examples:
            say(f"  {kind}: {e}")
    return 1


if __name__ == "__main__":
    sys.exit(main())
