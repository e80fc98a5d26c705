"""Group behaviours checked against Apache Kafka 4.x on the same client calls.

- Static membership (KIP-345): a member killed with SIGKILL and restarted with the same
  `group.instance.id` within its session timeout gets its previous partitions back; the other
  member is not revoked and the group does not rebalance.
- OffsetCommit for a topic, or a partition of a topic, that does not exist answers
  UNKNOWN_TOPIC_OR_PARTITION for it, and the rest of the commit lands.
- `group.min.session.timeout.ms` / `group.max.session.timeout.ms` bound what a member may ask.
- A `group.protocol=consumer` client that only assigns partitions (no subscription) commits
  again and again.
- Online migration (`group.consumer.migration.policy`, Kafka 4's default `bidirectional`): a
  classic group converts to a consumer group when a `group.protocol=consumer` member joins, the
  classic member keeps consuming beside it with no partition owned twice, and the group converts
  back when that member leaves; with the policy `disabled` the new member is refused.

Members are separate processes (this file run as a script) so they can be killed for real; each
prints a JSON line per assignment change.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from confluent_kafka import OFFSET_INVALID, Consumer, KafkaError, KafkaException, TopicPartition
from confluent_kafka.admin import ConfigResource, ResourceType

from kafka.protocol.consumer.group import HeartbeatRequest, OffsetCommitRequest

from harness import admin, create_topic
from wire import Pipeline, build

BROKER_ARGS = ["--group-initial-rebalance-delay-ms", "0"]
PARTITIONS = 4
SESSION_TIMEOUT_MS = 20_000


def member_main(bootstrap: str, group: str, topic: str, instance: str, out: str) -> None:
    """A static member: subscribes and logs every assignment change until killed."""
    log = open(out, "a", buffering=1)

    def emit(ev, parts):
        log.write(json.dumps({"t": time.monotonic(), "ev": ev, "parts": sorted(tp.partition for tp in parts)}) + "\n")

    c = Consumer({
        "bootstrap.servers": bootstrap, "group.id": group, "group.instance.id": instance,
        "session.timeout.ms": SESSION_TIMEOUT_MS, "heartbeat.interval.ms": 500,
        "partition.assignment.strategy": "range", "enable.auto.commit": False,
        "auto.offset.reset": "earliest",
    })
    c.subscribe([topic], on_assign=lambda _c, p: emit("assign", p), on_revoke=lambda _c, p: emit("revoke", p),
                on_lost=lambda _c, p: emit("lost", p))
    while True:
        c.poll(0.2)


class StaticMember:
    def __init__(self, bootstrap: str, group: str, topic: str, instance: str, out: Path):
        self.out = out
        self.proc = subprocess.Popen([sys.executable, __file__, bootstrap, group, topic, instance, str(out)],
                                     cwd=Path(__file__).parent)

    def events(self) -> list[dict]:
        if not self.out.exists():
            return []
        return [json.loads(line) for line in self.out.read_text().splitlines() if line.strip()]

    def owned(self) -> set[int] | None:
        """The partitions it owns by its own log, or None before its first assignment."""
        owned = None
        for e in self.events():
            if e["ev"] == "assign":
                owned = (owned or set()) | set(e["parts"])
            elif e["ev"] in ("revoke", "lost"):
                owned = (owned or set()) - set(e["parts"])
        return owned

    def kill(self) -> None:
        os.kill(self.proc.pid, signal.SIGKILL)
        self.proc.wait()


def wait_for(what, predicate, timeout=60.0):
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.2)


def broker_members(bootstrap: str, group: str) -> dict[str, tuple[str, set[int]]]:
    """instance id -> (member id, partitions) as the broker describes the group."""
    client = admin(bootstrap)
    (d,) = [f.result(timeout=15) for f in client.describe_consumer_groups([group]).values()]
    return {m.group_instance_id: (m.member_id, {tp.partition for tp in m.assignment.topic_partitions})
            for m in d.members}


def static_rejoin(bootstrap: str, tmp: Path, name: str):
    topic, group = f"static-{name}", f"static-group-{name}"
    create_topic(bootstrap, topic, PARTITIONS)
    a = StaticMember(bootstrap, group, topic, "a", tmp / f"{name}-a1.log")
    b = StaticMember(bootstrap, group, topic, "b", tmp / f"{name}-b.log")
    try:
        wait_for("both members assigned", lambda: a.owned() and b.owned()
                 and len(a.owned()) + len(b.owned()) == PARTITIONS)
        before = wait_for("the broker's view", lambda: (m := broker_members(bootstrap, group)) and len(m) == 2
                          and all(p for _, p in m.values()) and m)
        b_events = len(b.events())
        a_parts = a.owned()
        a.kill()
        time.sleep(1)
        a2 = StaticMember(bootstrap, group, topic, "a", tmp / f"{name}-a2.log")
        try:
            wait_for("the restarted member assigned", lambda: a2.owned())
            # Long enough for a rebalance to have reached b, had there been one.
            time.sleep(3)
            after = broker_members(bootstrap, group)
            # The killed instance's old member id, still naming instance "a", is a zombie now.
            pipe = Pipeline(bootstrap)
            pipe.send(build(HeartbeatRequest, 4, group_id=group, generation_id=1,
                            member_id=before["a"][0], group_instance_id="a"))
            (zombie,) = pipe.responses()
            pipe.close()
            return {
                "zombie_heartbeat": zombie["error_code"],
                "restarted_gets": sorted(a2.owned()), "had": sorted(a_parts),
                "b_events_after_restart": b.events()[b_events:],
                "b_keeps": sorted(b.owned()),
                "same_member_id_for_b": after["b"][0] == before["b"][0],
                "new_member_id_for_a": after["a"][0] != before["a"][0],
                "broker_assignment_same": {k: sorted(v[1]) for k, v in after.items()}
                == {k: sorted(v[1]) for k, v in before.items()},
            }
        finally:
            a2.kill()
    finally:
        for m in (a, b):
            if m.proc.poll() is None:
                m.kill()


def test_static_member_restarted_within_its_session_gets_its_partitions_back(broker, kafka_reference, tmp_path):
    got = {name: static_rejoin(b, tmp_path, name)
           for name, b in (("kafka", kafka_reference.bootstrap), ("sluice", broker.bootstrap))}
    for name, r in got.items():
        assert r["restarted_gets"] == r["had"], (name, r)
        assert r["b_events_after_restart"] == [], (name, r)
        assert r["same_member_id_for_b"] and r["new_member_id_for_a"], (name, r)
        assert r["broker_assignment_same"], (name, r)
        assert r["zombie_heartbeat"] == 82, (name, r)  # FENCED_INSTANCE_ID
    assert got["sluice"] == got["kafka"] | {"restarted_gets": got["sluice"]["restarted_gets"],
                                            "had": got["sluice"]["had"], "b_keeps": got["sluice"]["b_keeps"]}, got


def commit_errors(bootstrap: str, group: str, offsets: list[TopicPartition]) -> list[tuple]:
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": group, "enable.auto.commit": False})
    try:
        try:
            result = c.commit(offsets=offsets, asynchronous=False)
        except KafkaException as e:
            return [("request", e.args[0].code())]
        return sorted((tp.topic, tp.partition, tp.error.code() if tp.error else 0) for tp in result)
    finally:
        c.close()


def raw_commit_errors(bootstrap: str, group: str, offsets: list[tuple[str, int, int]]) -> list[tuple]:
    """One OffsetCommit v8 outside any generation (as `assign` consumers commit): every
    partition's own error code, as (topic, partition, error)."""
    topics: dict[str, list] = {}
    for topic, partition, offset in offsets:
        topics.setdefault(topic, []).append({"partition_index": partition, "committed_offset": offset,
                                             "committed_leader_epoch": -1, "committed_metadata": ""})
    pipe = Pipeline(bootstrap)
    pipe.send(build(OffsetCommitRequest, 8, group_id=group, generation_id_or_member_epoch=-1, member_id="",
                    group_instance_id=None, topics=[{"name": t, "partitions": ps} for t, ps in topics.items()]))
    (r,) = pipe.responses()
    pipe.close()
    return sorted((t["name"], p["partition_index"], p["error_code"]) for t in r["topics"] for p in t["partitions"])


def test_commit_for_a_missing_topic_is_refused_as_kafka_does(broker, kafka_reference):
    # A missing topic, and a missing partition of a topic that exists (it has 2).
    offsets = [("commit-known", 0, 5), ("commit-known", 99, 7), ("no-such-topic", 0, 5)]
    got, raw = {}, {}
    for name, b in (("kafka", kafka_reference.bootstrap), ("sluice", broker.bootstrap)):
        create_topic(b, "commit-known", 2)
        got[name] = commit_errors(b, "commit-missing", [TopicPartition(*o) for o in offsets])
        raw[name] = raw_commit_errors(b, "commit-missing-raw", [(t, p, o + 1) for t, p, o in offsets])
    assert got["kafka"] == got["sluice"], got
    assert ("no-such-topic", 0, KafkaError.UNKNOWN_TOPIC_OR_PART) in got["sluice"] or \
        got["sluice"] == [("request", KafkaError.UNKNOWN_TOPIC_OR_PART)], got
    assert raw["kafka"] == raw["sluice"] == [("commit-known", 0, 0),
                                             ("commit-known", 99, KafkaError.UNKNOWN_TOPIC_OR_PART),
                                             ("no-such-topic", 0, KafkaError.UNKNOWN_TOPIC_OR_PART)], raw
    # The partition of the existing topic is committed all the same, the missing one is not.
    for name, b in (("kafka", kafka_reference.bootstrap), ("sluice", broker.bootstrap)):
        for group, offset in (("commit-missing", 5), ("commit-missing-raw", 6)):
            c = Consumer({"bootstrap.servers": b, "group.id": group})
            committed = c.committed([TopicPartition("commit-known", 0), TopicPartition("commit-known", 99)],
                                    timeout=15)
            c.close()
            assert [(tp.offset, tp.error) for tp in committed] == [(offset, None), (OFFSET_INVALID, None)], \
                (name, group, committed)


def join_error(bootstrap: str, group: str, session_timeout_ms: int) -> int | None:
    """The error a subscribing consumer with this session timeout gets, or None once assigned."""
    errors = []
    assigned = []
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": group, "session.timeout.ms": session_timeout_ms,
                  "heartbeat.interval.ms": min(500, session_timeout_ms // 3),
                  "error_cb": lambda e: errors.append(e.code())})
    c.subscribe(["commit-known"], on_assign=lambda _c, p: assigned.append(p))
    try:
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline and not assigned:
            m = c.poll(0.2)
            if m is not None and m.error():
                errors.append(m.error().code())
            if KafkaError.INVALID_SESSION_TIMEOUT in errors:
                return KafkaError.INVALID_SESSION_TIMEOUT
        return None if assigned else (errors[-1] if errors else -1)
    finally:
        c.close()


def test_session_timeouts_outside_the_broker_bounds_are_refused(broker, kafka_reference):
    for name, b in (("kafka", kafka_reference.bootstrap), ("sluice", broker.bootstrap)):
        # Kafka's defaults: 6 s to 30 minutes.
        assert join_error(b, f"short-{name}", 3_000) == KafkaError.INVALID_SESSION_TIMEOUT, name
        assert join_error(b, f"ok-{name}", 6_000) is None, name
    client = admin(broker.bootstrap)
    resource = ConfigResource(ResourceType.BROKER, "1")
    described = client.describe_configs([resource])[resource].result(timeout=15)
    assert described["group.min.session.timeout.ms"].value == "6000"
    assert described["group.max.session.timeout.ms"].value == "1800000"


def test_the_session_timeout_bounds_are_broker_settings():
    from harness import Broker
    b = Broker(cores=1, name="session-bounds",
               extra_args=["--group-min-session-timeout-ms", "1000", "--group-max-session-timeout-ms", "4000",
                           "--group-initial-rebalance-delay-ms", "0"])
    try:
        b.start()
        create_topic(b.bootstrap, "commit-known", 2)
        assert join_error(b.bootstrap, "short-ok", 3_000) is None
        assert join_error(b.bootstrap, "too-long", 6_000) == KafkaError.INVALID_SESSION_TIMEOUT
        b.stop_cleanly()
    finally:
        if b.running():
            b.stop_cleanly()
        b.remove()


def test_an_assign_only_consumer_protocol_client_commits_again_and_again(broker, kafka_reference):
    for name, b in (("kafka", kafka_reference.bootstrap), ("sluice", broker.bootstrap)):
        create_topic(b, "assign-commits", 2)
        c = Consumer({"bootstrap.servers": b, "group.id": "assign-only", "group.protocol": "consumer",
                      "enable.auto.commit": False})
        try:
            c.assign([TopicPartition("assign-commits", 0, 0), TopicPartition("assign-commits", 1, 0)])
            for i in range(1, 6):
                result = c.commit(offsets=[TopicPartition("assign-commits", 0, i), TopicPartition("assign-commits", 1, 10 * i)],
                                  asynchronous=False)
                assert [tp.error for tp in result] == [None, None], (name, i, result)
            committed = c.committed([TopicPartition("assign-commits", 0), TopicPartition("assign-commits", 1)], timeout=15)
            assert [tp.offset for tp in committed] == [5, 50], (name, committed)
        finally:
            c.close()


def group_type(bootstrap: str, group: str) -> str | None:
    """The group's type by ListGroups; librdkafka reports types only when asked to filter."""
    from confluent_kafka import ConsumerGroupType

    client = admin(bootstrap)  # held: a client dropped early fails its requests
    for t in (ConsumerGroupType.CLASSIC, ConsumerGroupType.CONSUMER):
        listed = client.list_consumer_groups(request_timeout=15, types={t}).result(timeout=20)
        if any(g.group_id == group for g in listed.valid):
            return t.name.lower()
    return None


class Member:
    """An in-process consumer, polled by the test, recording what it owns and receives."""

    def __init__(self, bootstrap: str, group: str, topic: str, protocol: str, strategy: str = "range"):
        config = {"bootstrap.servers": bootstrap, "group.id": group, "group.protocol": protocol,
                  "enable.auto.commit": False, "auto.offset.reset": "earliest"}
        if protocol == "classic":
            config.update({"session.timeout.ms": 10_000, "heartbeat.interval.ms": 300,
                           "partition.assignment.strategy": strategy})
        self.c = Consumer(config)
        self.owned: set[int] = set()
        self.values: list[bytes] = []

        def assigned(_c, parts):
            self.owned |= {tp.partition for tp in parts}
            if strategy == "cooperative-sticky":
                self.c.incremental_assign(parts)

        def revoked(_c, parts):
            self.owned -= {tp.partition for tp in parts}
            if strategy == "cooperative-sticky":
                self.c.incremental_unassign(parts)

        self.c.subscribe([topic], on_assign=assigned, on_revoke=revoked, on_lost=revoked)

    def poll(self) -> None:
        for m in self.c.consume(100, 0.05):
            assert m.error() is None, m.error()
            self.values.append(m.value())


def poll_until(what, members, predicate, timeout=60.0):
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what}: " + \
            str([(sorted(m.owned), len(m.values)) for m in members])
        for m in members:
            m.poll()


def migrate(bootstrap: str, name: str, strategy: str) -> dict:
    """A classic member, then a consumer-protocol member beside it, then the classic one alone."""
    from harness import producer

    topic, group = f"migrate-{strategy}-{name}", f"migrate-group-{strategy}-{name}"
    create_topic(bootstrap, topic, PARTITIONS)
    p = producer(bootstrap)

    def produce(first: int, count: int) -> None:
        for i in range(first, first + count):
            p.produce(topic, value=b"%d" % i, partition=i % PARTITIONS)
        assert p.flush(30) == 0

    produce(0, 40)
    a = Member(bootstrap, group, topic, "classic", strategy)
    b = None
    try:
        poll_until("the classic member's records", [a], lambda: len(a.values) >= 40)
        a.c.commit(asynchronous=False)
        seen = {"alone": (group_type(bootstrap, group), sorted(a.owned))}
        b = Member(bootstrap, group, topic, "consumer")
        both = [a, b]
        poll_until("the partitions shared", both, lambda: a.owned and b.owned and not (a.owned & b.owned)
                   and len(a.owned | b.owned) == PARTITIONS)
        seen["shared"] = (group_type(bootstrap, group), sorted(len(m.owned) for m in both))
        # DescribeGroups (classic groups only) describes a consumer group as Kafka does.
        from kafka.protocol.admin import DescribeGroupsRequest
        pipe = Pipeline(bootstrap)
        pipe.send(build(DescribeGroupsRequest, 5, groups=[group], include_authorized_operations=False))
        pipe.send(build(DescribeGroupsRequest, 6, groups=[group], include_authorized_operations=False))
        (described, described6) = pipe.responses()
        pipe.close()
        (g,) = described["groups"]
        seen["described_shared"] = (g["error_code"], g["group_state"], g["protocol_type"], len(g["members"]))
        # Version 6 adds GROUP_ID_NOT_FOUND and a message saying why (KIP-1043).
        (g,) = described6["groups"]
        seen["described_shared_6"] = (g["error_code"], (g["error_message"] or "").replace(group, "<group>"),
                                      g["group_state"], len(g["members"]))
        # `sluice group describe` falls back to ConsumerGroupDescribe for it.
        import subprocess
        from harness import SLUICE_BIN
        out = subprocess.run([str(SLUICE_BIN), "group", "describe", group, "--bootstrap-server", bootstrap],
                             capture_output=True, text=True, timeout=60)
        assert out.returncode == 0, out.stderr
        fields = dict(line.split(": ", 1) for line in out.stdout.splitlines()
                      if line.startswith(("Protocol type:", "Members:")))
        seen["cli_shared"] = (fields.get("Protocol type"), fields.get("Members"))
        produce(40, 40)
        poll_until("the new records", both, lambda: len({v for m in both for v in m.values}) >= 80)
        b.c.close()
        b = None
        poll_until("the classic member alone again", [a], lambda: len(a.owned) == PARTITIONS)
        produce(80, 8)
        poll_until("the last records", [a], lambda: len(set(a.values) | set(both[1].values)) >= 88)
        seen["back"] = (group_type(bootstrap, group), sorted(a.owned))
        received = set(a.values) | set(both[1].values)
        seen["lost"] = sorted(set(b"%d" % i for i in range(88)) - received)
        return seen
    finally:
        for m in (a, b):
            if m is not None:
                m.c.close()


@pytest.mark.parametrize("strategy", ["range", "cooperative-sticky"])
def test_a_classic_group_converts_to_the_consumer_protocol_and_back(broker, kafka_reference, strategy):
    got = {name: migrate(b, name, strategy)
           for name, b in (("kafka", kafka_reference.bootstrap), ("sluice", broker.bootstrap))}
    assert got["sluice"] == got["kafka"], got
    assert got["sluice"]["cli_shared"] == ("consumer", "2"), got
    assert got["sluice"]["described_shared_6"][:2] == (69, "Group <group> is not a classic group."), got
    assert {k: v for k, v in got["sluice"].items()
            if k not in ("described_shared", "described_shared_6", "cli_shared")} == \
        {"alone": ("classic", [0, 1, 2, 3]), "shared": ("consumer", [2, 2]),
                             "back": ("classic", [0, 1, 2, 3]), "lost": []}, got


def test_with_migration_disabled_a_consumer_protocol_member_is_refused():
    from harness import Broker
    b = Broker(cores=1, name="migration-disabled",
               extra_args=BROKER_ARGS + ["--group-consumer-migration-policy", "disabled"])
    try:
        b.start()
        topic, group = "no-migration", "no-migration-group"
        create_topic(b.bootstrap, topic, PARTITIONS)
        a = Member(b.bootstrap, group, topic, "classic")
        poll_until("the classic member assigned", [a], lambda: len(a.owned) == PARTITIONS)
        errors = []
        c = Consumer({"bootstrap.servers": b.bootstrap, "group.id": group, "group.protocol": "consumer",
                      "error_cb": lambda e: errors.append(e.code())})
        c.subscribe([topic])
        deadline = time.monotonic() + 20
        refused = None
        while time.monotonic() < deadline and refused is None:
            a.poll()
            m = c.poll(0.1)
            if m is not None and m.error():
                refused = m.error()
        c.close()
        # librdkafka makes GROUP_ID_NOT_FOUND from ConsumerGroupHeartbeat a fatal error.
        assert refused is not None and refused.code() in (KafkaError.GROUP_ID_NOT_FOUND, KafkaError._FATAL), refused
        assert "group id does not exist" in refused.str(), refused
        assert group_type(b.bootstrap, group) == "classic"
        assert len(a.owned) == PARTITIONS
        a.c.close()
        b.stop_cleanly()
    finally:
        if b.running():
            b.stop_cleanly()
        b.remove()


if __name__ == "__main__":
    member_main(*sys.argv[1:6])
