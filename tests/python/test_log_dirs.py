"""Several log directories (`log.dirs`, Kafka's JBOD) on one broker, with real clients and
Apache Kafka's own tools.

1. Two directories: each gets its own meta.properties (one cluster, one node, two directory
   ids); replicas spread evenly over them; 3,000 records of every shape written with acks=all
   are read back at their offsets; `kafka-log-dirs` (LogDirsCommand) lists both directories,
   each partition exactly once under the directory that holds it on disk; after a SIGKILL every
   record is read back and no replica changed directory; a third, empty directory added to
   `log.dirs` is formatted with a new id at the next start and takes every new replica until it
   holds as many as the others.
2. A replica moved to the other directory online by `kafka-reassign-partitions` with
   `log_dirs`, while an idempotent producer keeps writing to it: `--verify` reports it done,
   every record (before, during and after the move) is read back once at its acknowledged
   offset, the replica is in the new directory only with no copy or old directory left, and the
   broker logs the swap's pause; after a restart it is all still there.
"""

from __future__ import annotations

import json
import os
import re
import threading
import time
from pathlib import Path

from confluent_kafka import TopicPartition

from harness import assert_all_delivered, consumer, create_topic, produce_all, producer, read_to_end
from reference import kafka_tool

BROKER_TOML = '"offsets.topic.num.partitions" = 4\n'


def start_with_dirs(broker, names: list[str]) -> list[Path]:
    dirs = [broker.root / n for n in names]
    config = broker.root / "sluice.toml"
    config.write_text(BROKER_TOML)
    if "--config" not in broker.extra_args:
        broker.extra_args += ["--config", str(config)]
    broker.data_dir = ",".join(str(d) for d in dirs)
    broker.start()
    return dirs


def meta(d: Path) -> dict[str, str]:
    lines = (d / "meta.properties").read_text().splitlines()
    return dict(line.split("=", 1) for line in lines if "=" in line and not line.startswith("#"))


def replicas_in(d: Path) -> set[str]:
    return {e.name for e in d.iterdir() if e.is_dir() and re.fullmatch(r".+-\d+", e.name)
            and e.name != "__cluster_metadata-0"}


def log_dirs_described(bootstrap: str, topics: str) -> dict[str, list[dict]]:
    """LogDirsCommand's answer: log directory -> its partitions."""
    out = kafka_tool("org.apache.kafka.tools.LogDirsCommand", "--bootstrap-server", bootstrap, "--describe",
                     "--topic-list", topics)
    described = json.loads(out.strip().splitlines()[-1])
    (only,) = described["brokers"]
    for d in only["logDirs"]:
        assert d["error"] is None, d
    return {d["logDir"]: d["partitions"] for d in only["logDirs"]}


def shapes(n: int, partitions: int) -> list[dict]:
    """Records of the shapes clients send: keys, null keys, null values, headers."""
    out = []
    for i in range(n):
        m = {"partition": i % partitions, "value": f"value-{i}".encode() * (1 + i % 7)}
        if i % 5:
            m["key"] = f"key-{i}".encode()
        if i % 11 == 0:
            m["value"] = None
        if i % 3 == 0:
            m["headers"] = [("h", f"{i}".encode()), ("empty", None)]
        out.append(m)
    return out


def read_back(bootstrap: str, topic: str, partitions: int, sent: list[dict], reports) -> None:
    """Every acknowledged record is at its offset, and nothing else is there."""
    ends: dict[tuple[str, int], int] = {}
    expected = {}
    for m, r in zip(sent, reports):
        expected[(r.partition, r.offset)] = m
        ends[(topic, r.partition)] = max(ends.get((topic, r.partition), 0), r.offset + 1)
    c = consumer(bootstrap)
    c.assign([TopicPartition(topic, p, 0) for p in range(partitions)])
    got = read_to_end(c, ends)
    c.close()
    assert len(got) == len(expected), (len(got), len(expected))
    for msg in got:
        m = expected[(msg.partition(), msg.offset())]
        assert msg.value() == m["value"] and msg.key() == m.get("key"), (msg.partition(), msg.offset())
        assert (msg.headers() or None) == (m.get("headers") or None), (msg.partition(), msg.offset())


def test_replicas_spread_over_log_dirs_and_keep_their_place(unstarted_broker):
    broker = unstarted_broker
    a, b = start_with_dirs(broker, ["disk-a", "disk-b"])
    ma, mb = meta(a), meta(b)
    assert ma["cluster.id"] == mb["cluster.id"] and ma["node.id"] == mb["node.id"], (ma, mb)
    assert ma["directory.id"] != mb["directory.id"] and len(ma["directory.id"]) == 22, (ma, mb)
    assert (a / "__cluster_metadata-0").is_dir() and not (b / "__cluster_metadata-0").exists()

    create_topic(broker.bootstrap, "spread", 8, {"segment.bytes": str(256 << 10)})
    placed = {a: replicas_in(a), b: replicas_in(b)}
    assert not placed[a] & placed[b], placed
    # The offsets topic's 4 and the 8 new: 6 each.
    assert len(placed[a]) == len(placed[b]) == 6, placed
    assert {f"spread-{i}" for i in range(8)} <= placed[a] | placed[b]

    sent = shapes(3000, 8)
    reports = produce_all(producer(broker.bootstrap), "spread", sent)
    assert_all_delivered(reports)
    read_back(broker.bootstrap, "spread", 8, sent, reports)

    described = log_dirs_described(broker.bootstrap, "spread")
    assert set(described) == {str(a), str(b)}, described
    for d in (a, b):
        listed = [p["partition"] for p in described[str(d)]]
        assert sorted(listed) == sorted(r for r in placed[d] if r.startswith("spread-")), (d, listed)
        assert all(p["size"] > 0 and not p["isFuture"] for p in described[str(d)]), described[str(d)]

    broker.kill()
    broker.start()
    assert {a: replicas_in(a), b: replicas_in(b)} == placed
    assert meta(a) == ma and meta(b) == mb
    read_back(broker.bootstrap, "spread", 8, sent, reports)

    # A third disk, empty: formatted at start, it takes the new replicas until it is even.
    broker.stop_cleanly()
    a, b, c = start_with_dirs(broker, ["disk-a", "disk-b", "disk-c"])
    mc = meta(c)
    assert mc["cluster.id"] == ma["cluster.id"] and mc["directory.id"] not in (ma["directory.id"], mb["directory.id"])
    assert "formatted a new log directory" in broker.log_text()
    create_topic(broker.bootstrap, "more", 6)
    assert replicas_in(c) == {f"more-{i}" for i in range(6)}, replicas_in(c)
    assert {a: replicas_in(a), b: replicas_in(b)} == placed
    more = shapes(600, 6)
    more_reports = produce_all(producer(broker.bootstrap), "more", more)
    assert_all_delivered(more_reports)
    read_back(broker.bootstrap, "more", 6, more, more_reports)
    read_back(broker.bootstrap, "spread", 8, sent, reports)


def reassign(bootstrap: str, plan: Path, action: str) -> str:
    return kafka_tool("org.apache.kafka.tools.reassign.ReassignPartitionsCommand", "--bootstrap-server", bootstrap,
                      action, "--reassignment-json-file", str(plan))


def test_move_a_replica_between_log_dirs_online(unstarted_broker):
    broker = unstarted_broker
    a, b = start_with_dirs(broker, ["disk-a", "disk-b"])
    topic = "moving"
    create_topic(broker.bootstrap, topic, 2, {"segment.bytes": str(256 << 10)})
    (source,) = [d for d in (a, b) if (d / f"{topic}-0").is_dir()]
    (dest,) = [d for d in (a, b) if d != source]

    # About 8 MB before the move, so the copy has many segments to catch up on.
    before = [{"partition": 0, "key": f"k{i}".encode(), "value": os.urandom(800)} for i in range(10_000)]
    p = producer(broker.bootstrap, **{"enable.idempotence": True, "linger.ms": 5})
    reports = produce_all(p, topic, before)
    assert_all_delivered(reports)

    # An idempotent producer keeps writing while the replica moves.
    during: list[dict] = []
    during_reports: list = []
    stop = threading.Event()
    failures: list[BaseException] = []

    def keep_producing():
        try:
            i = 0
            while not stop.is_set():
                chunk = [{"partition": 0, "key": f"d{i + j}".encode(), "value": f"during-{i + j}".encode()}
                         for j in range(200)]
                during.extend(chunk)
                during_reports.extend(produce_all(p, topic, chunk))
                i += len(chunk)
        except BaseException as e:  # noqa: BLE001 - reported by the test thread
            failures.append(e)

    t = threading.Thread(target=keep_producing)
    t.start()
    try:
        time.sleep(1.0)
        plan = broker.root / "plan.json"
        plan.write_text(json.dumps({"version": 1, "partitions": [
            {"topic": topic, "partition": 0, "replicas": [1], "log_dirs": [str(dest)]}]}))
        reassign(broker.bootstrap, plan, "--execute")
        deadline = time.monotonic() + 60
        while True:
            out = reassign(broker.bootstrap, plan, "--verify")
            if f"Reassignment of replica {topic}-0-1 completed successfully" in out:
                break
            assert time.monotonic() < deadline, out
            time.sleep(0.5)
        time.sleep(1.0)
    finally:
        stop.set()
        t.join(timeout=120)
    assert not failures, failures
    assert_all_delivered(during_reports)
    assert len(during_reports) >= 200, len(during_reports)

    assert (dest / f"{topic}-0").is_dir() and not (source / f"{topic}-0").exists()
    leftovers = [e.name for d in (a, b) for e in d.iterdir() if e.name.endswith(("-future", "-delete"))]
    assert not leftovers, leftovers
    lines = [l for l in broker.log_text().splitlines() if "replica paused for the swap" in l]
    assert len(lines) == 1 and "pause_ms=" in lines[0], lines
    described = log_dirs_described(broker.bootstrap, topic)
    assert [x["partition"] for x in described[str(dest)]].count(f"{topic}-0") == 1, described
    assert f"{topic}-0" not in [x["partition"] for x in described[str(source)]], described

    sent, all_reports = before + during, reports + during_reports
    offsets = sorted(r.offset for r in all_reports)
    assert offsets == list(range(len(offsets))), "acknowledged offsets are not 0, 1, 2, ..."
    read_back(broker.bootstrap, topic, 1, sent, all_reports)
    broker.stop_cleanly()
    broker.start()
    read_back(broker.bootstrap, topic, 1, sent, all_reports)
