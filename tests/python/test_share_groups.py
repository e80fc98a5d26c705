"""Share groups (KIP-932, "queues for Kafka") with librdkafka's share consumer
(confluent-kafka's `ShareConsumer`): ShareGroupHeartbeat, ShareFetch and ShareAcknowledge
against one broker.

Every check asserts on the records: which were delivered, to whom, how often and with which
delivery count. The broker's acquisition lock is 2 s here (`group.share.record.lock.duration.ms`,
its minimum lowered to 1 s) so that lock timeouts show within a test; groups read from the
earliest offset (`share.auto.offset.reset`, a group config set with IncrementalAlterConfigs as
`kafka-configs --entity-type groups` does).
"""

from __future__ import annotations

import signal
import subprocess
import sys
import threading
import time
import uuid
from collections import Counter

import pytest
from confluent_kafka import AcknowledgeType, KafkaException, Producer, ShareConsumer
from confluent_kafka.admin import (AdminClient, AlterConfigOpType, ConfigEntry, ConfigResource, NewTopic)

LOCK_MS = 2000
BROKER_ARGS = ["--override", f"group.share.record.lock.duration.ms={LOCK_MS}",
               "--override", "group.share.min.record.lock.duration.ms=1000",
               "--override", "group.share.session.timeout.ms=6000",
               "--override", "group.share.heartbeat.interval.ms=1000"]


def unique(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


def setup_topic(broker, partitions: int = 1, group_configs: dict | None = None) -> tuple[str, str]:
    """A new topic and a new share group reading it from the earliest offset."""
    topic, group = unique("share"), unique("sg")
    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    admin.create_topics([NewTopic(topic, partitions, 1)])[topic].result(20)
    configs = {"share.auto.offset.reset": "earliest", **(group_configs or {})}
    resource = ConfigResource("GROUP", group, incremental_configs=[
        ConfigEntry(k, v, incremental_operation=AlterConfigOpType.SET) for k, v in configs.items()])
    admin.incremental_alter_configs([resource])[resource].result(20)
    # What the group runs with is what DescribeConfigs says it set.
    described = admin.describe_configs([ConfigResource("GROUP", group)])
    entries = list(described.values())[0].result(20)
    for k, v in configs.items():
        assert entries[k].value == v, (k, entries[k].value)
    return topic, group


def produce(broker, topic: str, count: int, batch: int = 10, start: int = 0, **config) -> None:
    """`count` records valued `r-<n>`, in batches of about `batch` records."""
    p = Producer({"bootstrap.servers": broker.bootstrap, "linger.ms": 5, "batch.num.messages": batch, **config})
    for i in range(start, start + count):
        p.produce(topic, value=f"r-{i}".encode())
        if i % batch == batch - 1:
            p.flush(20)
    assert p.flush(20) == 0


def share_consumer(broker, group: str, topic: str, **config) -> ShareConsumer:
    c = ShareConsumer({"bootstrap.servers": broker.bootstrap, "group.id": group, **config})
    c.subscribe([topic])
    return c


def poll(c: ShareConsumer, timeout: float = 0.5) -> list:
    out = []
    for m in list(c.poll(timeout) or []):
        assert not m.error(), m.error()
        out.append(m)
    return out


def members_assigned(broker, group: str, topic: str) -> int:
    """How many of the share group's members `sluice group describe` shows assigned `topic`'s
    partition 0."""
    from harness import SLUICE_BIN
    described = subprocess.run([str(SLUICE_BIN), "group", "describe", group, "--bootstrap-server", broker.bootstrap],
                               capture_output=True, text=True, timeout=60)
    return sum(1 for line in described.stdout.splitlines() if line.split()[-1:] == [f"{topic}:0"])


def test_more_consumers_than_partitions_all_get_work_and_each_record_comes_once(broker):
    topic, group = setup_topic(broker)
    total = 2000
    got: dict[str, list[tuple[int, int]]] = {}
    lock = threading.Lock()
    quiet_since = [time.monotonic()]

    def member(n: int) -> None:
        c = share_consumer(broker, group, topic)
        deadline = time.monotonic() + 60
        try:
            while time.monotonic() < deadline:
                ms = poll(c)
                with lock:
                    if ms:
                        quiet_since[0] = time.monotonic()
                    for m in ms:
                        got.setdefault(m.value().decode(), []).append((n, m.delivery_count()))
                    if len(got) >= total and time.monotonic() - quiet_since[0] > 3:
                        break
                # Slow members, so that the others get batches too.
                time.sleep(0.02)
            # Implicit acknowledgement: what the last poll returned is accepted by the next.
            poll(c, 0.1)
            c.commit_sync(10)
        finally:
            c.close()

    threads = [threading.Thread(target=member, args=(n,)) for n in range(4)]
    for t in threads:
        t.start()
    # The records come once all four members hold the partition: produced before, the first
    # members to join could acquire all 2,000 (the partition's record-lock limit) before the
    # last one is assigned.
    deadline = time.monotonic() + 30
    while (assigned := members_assigned(broker, group, topic)) < 4 and time.monotonic() < deadline:
        time.sleep(0.2)
    assert assigned == 4, f"{assigned} of 4 share consumers were assigned the partition within 30 s"
    with lock:
        quiet_since[0] = time.monotonic()
    produce(broker, topic, total, batch=20)
    for t in threads:
        t.join()
    assert sorted(got) == sorted(f"r-{i}" for i in range(total)), f"{total - len(got)} records never delivered"
    twice = {v: d for v, d in got.items() if len(d) > 1}
    assert not twice, f"{len(twice)} records delivered more than once, e.g. {list(twice.items())[:3]}"
    assert all(d[0][1] == 1 for d in got.values()), "every record delivered once has delivery count 1"
    per_member = Counter(d[0][0] for d in got.values())
    assert len(per_member) >= 3, f"one partition, four members: the work spread over {dict(per_member)}"
    # `sluice group` lists the share group and describes it: empty now, every record done.
    from harness import SLUICE_BIN
    listed = subprocess.run([str(SLUICE_BIN), "group", "list", "--bootstrap-server", broker.bootstrap],
                            capture_output=True, text=True, timeout=60)
    assert any(line.split()[:3] == [group, "Empty", "share"] for line in listed.stdout.splitlines()), listed.stdout
    described = subprocess.run([str(SLUICE_BIN), "group", "describe", group, "--bootstrap-server", broker.bootstrap],
                               capture_output=True, text=True, timeout=60)
    assert described.returncode == 0, described.stderr
    assert "Type: share" in described.stdout and "State: Empty" in described.stdout, described.stdout
    rows = [line.split() for line in described.stdout.splitlines() if line.startswith(topic)]
    assert rows == [[topic, "0", str(total), str(total), "0"]], described.stdout


def test_release_redelivers_reject_archives_and_accept_never_comes_back(broker):
    topic, group = setup_topic(broker)
    produce(broker, topic, 30, batch=5)
    c = share_consumer(broker, group, topic, **{"share.acknowledgement.mode": "explicit"})
    deliveries: dict[int, list[int]] = {}
    deadline = time.monotonic() + 30
    try:
        while time.monotonic() < deadline:
            ms = poll(c)
            for m in ms:
                n = int(m.value().decode()[2:])
                deliveries.setdefault(n, []).append(m.delivery_count())
                if n % 3 == 0 and m.delivery_count() == 1:
                    c.acknowledge(m, AcknowledgeType.RELEASE)
                elif n % 3 == 1:
                    c.acknowledge(m, AcknowledgeType.REJECT)
                else:
                    c.acknowledge(m, AcknowledgeType.ACCEPT)
            if ms:
                result = c.commit_sync(10)
                assert all(v is None for v in result.values()), result
            done = all(n in deliveries for n in range(30)) and all(len(deliveries[n]) == 2 for n in range(0, 30, 3))
            if done and not ms:
                # Nothing more may come: wait out a lock duration to be sure.
                extra = []
                until = time.monotonic() + LOCK_MS / 1000 + 1
                while time.monotonic() < until:
                    extra += poll(c)
                assert not extra, f"delivered again: {[(m.value(), m.delivery_count()) for m in extra]}"
                break
    finally:
        c.close()
    assert sorted(deliveries) == list(range(30))
    for n, counts in deliveries.items():
        if n % 3 == 0:
            assert counts == [1, 2], (n, counts)
        else:
            assert counts == [1], (n, counts)


def test_the_delivery_limit_archives_a_poison_record(broker):
    topic, group = setup_topic(broker, group_configs={"share.delivery.count.limit": "3"})
    # One batch per record, so that releasing the poison one does not hold back the others.
    produce(broker, topic, 5, batch=1)
    c = share_consumer(broker, group, topic, **{"share.acknowledgement.mode": "explicit"})
    deliveries: dict[int, list[int]] = {}
    quiet = 0.0
    try:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and quiet < 3:
            ms = poll(c)
            quiet = 0.0 if ms else quiet + 0.5
            for m in ms:
                n = int(m.value().decode()[2:])
                deliveries.setdefault(n, []).append(m.delivery_count())
                c.acknowledge(m, AcknowledgeType.RELEASE if n == 2 else AcknowledgeType.ACCEPT)
            if ms:
                c.commit_sync(10)
    finally:
        c.close()
    assert deliveries[2] == [1, 2, 3], f"the poison record is delivered exactly 3 times: {deliveries[2]}"
    assert all(deliveries[n] == [1] for n in (0, 1, 3, 4)), deliveries


KILLED_MEMBER = """
import sys, time
from confluent_kafka import ShareConsumer
c = ShareConsumer({"bootstrap.servers": sys.argv[1], "group.id": sys.argv[2],
                   "share.acknowledgement.mode": "explicit"})
c.subscribe([sys.argv[3]])
deadline = time.monotonic() + 30
while time.monotonic() < deadline:
    ms = [m for m in list(c.poll(0.5) or []) if not m.error()]
    if ms:
        print(" ".join(str(m.offset()) for m in ms), flush=True)
        time.sleep(60)  # holds them, never acknowledging, until killed
"""


def test_records_of_a_member_killed_mid_batch_come_back_after_the_lock(broker):
    topic, group = setup_topic(broker)
    produce(broker, topic, 50, batch=50)
    member = subprocess.Popen([sys.executable, "-c", KILLED_MEMBER, broker.bootstrap, group, topic],
                              stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    try:
        held = [int(o) for o in member.stdout.readline().split()]
    finally:
        member.kill()
        member.wait(10)
    killed_at = time.monotonic()
    assert held, "the member acquired records before it was killed"
    c = share_consumer(broker, group, topic)
    got: dict[int, int] = {}
    first_at = None
    try:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and len(got) < 50:
            for m in poll(c):
                first_at = first_at or time.monotonic()
                got[m.offset()] = m.delivery_count()
        poll(c, 0.1)
        c.commit_sync(10)
    finally:
        c.close()
    assert sorted(got) == list(range(50)), "nothing lost"
    assert all(got[o] == 2 for o in held), "what the killed member held comes back a second time"
    assert all(got[o] == 1 for o in got if o not in held)
    # Back within the lock duration (2 s) and the time to poll them, well before the member's
    # session timeout (6 s) would have released them.
    assert first_at - killed_at < LOCK_MS / 1000 + 3.5, first_at - killed_at


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGKILL], ids=["sigterm", "sigkill"])
def test_share_state_survives_a_restart_acknowledged_never_again_held_ones_again(fresh_broker, sig):
    """The share partition's state is persisted through the share coordinator
    (`__share_group_state`): after a restart, what was accepted or rejected never comes back,
    what a member held comes back with its delivery count kept, and the rest comes once."""
    broker = fresh_broker
    topic, group = setup_topic(broker)
    total = 100
    produce(broker, topic, total, batch=10)
    c = share_consumer(broker, group, topic, **{"share.acknowledgement.mode": "explicit"})
    held: set[int] = set()
    accepted: set[int] = set()
    rejected: set[int] = set()
    try:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and len(accepted) + len(rejected) + len(held) < 60:
            ms = poll(c)
            for m in ms:
                assert m.delivery_count() == 1
                o = m.offset()
                if o >= 40:
                    held.add(o)  # acquired, never acknowledged
                elif o % 10 == 5:
                    c.acknowledge(m, AcknowledgeType.REJECT)
                    rejected.add(o)
                else:
                    c.acknowledge(m, AcknowledgeType.ACCEPT)
                    accepted.add(o)
            if ms:
                result = c.commit_sync(10)
                assert all(v is None for v in result.values()), result
        assert accepted | rejected == set(range(40)), sorted(set(range(40)) - accepted - rejected)
        assert held, "the member holds records past offset 40 when it leaves"
    finally:
        c.close()
    broker.restart(sig)
    got: dict[int, list[int]] = {}
    c = share_consumer(broker, group, topic)
    try:
        deadline = time.monotonic() + 40
        quiet_since = time.monotonic()
        while time.monotonic() < deadline:
            ms = poll(c)
            for m in ms:
                got.setdefault(m.offset(), []).append(m.delivery_count())
            if ms:
                quiet_since = time.monotonic()
            elif set(got) >= set(range(40, total)) and time.monotonic() - quiet_since > LOCK_MS / 1000 + 1:
                break
        poll(c, 0.1)
        c.commit_sync(10)
    finally:
        c.close()
    again = sorted(set(got) & (accepted | rejected))
    assert not again, f"acknowledged before the restart and delivered after it: {again}"
    assert sorted(got) == list(range(40, total)), f"missing {sorted(set(range(40, total)) - set(got))}"
    assert all(len(d) == 1 for d in got.values()), {o: d for o, d in got.items() if len(d) > 1}
    # The held records' acquisition was written with the acknowledgements after it; records
    # the client fetched ahead and released on close may carry one delivery too.
    wrong = {o: d for o, d in got.items() if d[0] != 2 and (o in held or d[0] != 1)}
    assert not wrong, f"delivery counts: held records come back as their 2nd delivery, the rest as 1st: {wrong}"
    log = broker.current_log()
    assert "share partition restored from its persisted state" in log


def test_read_committed_share_groups_skip_aborted_transactions(broker):
    topic, committed_group = setup_topic(broker, group_configs={"share.isolation.level": "read_committed"})
    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    uncommitted_group = unique("sg")
    resource = ConfigResource("GROUP", uncommitted_group, incremental_configs=[
        ConfigEntry("share.auto.offset.reset", "earliest", incremental_operation=AlterConfigOpType.SET)])
    admin.incremental_alter_configs([resource])[resource].result(20)
    p = Producer({"bootstrap.servers": broker.bootstrap, "transactional.id": unique("tx")})
    p.init_transactions(20)
    for outcome, start in (("commit", 0), ("abort", 100), ("commit", 200)):
        p.begin_transaction()
        for i in range(start, start + 10):
            p.produce(topic, value=f"r-{i}".encode())
        p.flush(20)
        (p.commit_transaction if outcome == "commit" else p.abort_transaction)(20)

    def read_all(group: str) -> list[str]:
        c = share_consumer(broker, group, topic)
        seen, quiet = [], 0.0
        try:
            deadline = time.monotonic() + 20
            while time.monotonic() < deadline and quiet < 2:
                ms = poll(c)
                quiet = 0.0 if ms else quiet + 0.5
                seen += [m.value().decode() for m in ms]
            poll(c, 0.1)
            c.commit_sync(10)
        finally:
            c.close()
        return seen

    committed = [f"r-{i}" for i in list(range(0, 10)) + list(range(200, 210))]
    assert sorted(read_all(committed_group)) == sorted(committed)
    assert sorted(read_all(uncommitted_group)) == sorted(committed + [f"r-{i}" for i in range(100, 110)])


def test_unknown_group_configs_and_bad_values_are_refused(broker):
    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    for key, value in (("share.no.such.config", "1"), ("share.auto.offset.reset", "oldest"),
                       ("share.isolation.level", "committed")):
        resource = ConfigResource("GROUP", unique("sg"), incremental_configs=[
            ConfigEntry(key, value, incremental_operation=AlterConfigOpType.SET)])
        with pytest.raises(KafkaException) as e:
            admin.incremental_alter_configs([resource])[resource].result(20)
        assert e.value.args[0].code() == 40, (key, e.value)  # INVALID_CONFIG


def test_a_share_group_id_is_not_a_consumer_group_id(broker):
    topic, group = setup_topic(broker)
    produce(broker, topic, 3, batch=3)
    c = share_consumer(broker, group, topic)
    try:
        deadline = time.monotonic() + 15
        got = []
        while time.monotonic() < deadline and len(got) < 3:
            got += poll(c)
        assert len(got) == 3
        # A classic consumer in the same group is refused while the share group is there.
        from confluent_kafka import Consumer
        classic = Consumer({"bootstrap.servers": broker.bootstrap, "group.id": group,
                            "auto.offset.reset": "earliest"})
        classic.subscribe([topic])
        errors = []
        try:
            until = time.monotonic() + 10
            while time.monotonic() < until and not errors:
                m = classic.poll(0.5)
                if m is not None and m.error():
                    errors.append(m.error().name())
                elif m is not None:
                    pytest.fail(f"a classic member of share group {group} read {m.value()!r}")
        finally:
            classic.close()
        assert "INCONSISTENT_GROUP_PROTOCOL" in errors, errors
    finally:
        c.close()
