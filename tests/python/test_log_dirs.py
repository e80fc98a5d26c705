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
   `log_dirs` and a 4 MB/s `--replica-alter-log-dirs-throttle` (the copy of 8 MB takes more
   than a second), while an idempotent producer keeps writing to it: `--verify` reports it done,
   every record (before, during and after the move) is read back once at its acknowledged
   offset, the replica is in the new directory only with no copy or old directory left, and the
   broker logs the swap's pause; after a restart it is all still there.
3. A disk that fails under a running broker (two loop-mounted ext4 file systems; one's loop
   device shrunk to nothing, so every write to it gets EIO): once the broker notices (the first
   write or sync that reaches the device), no produce to that disk's partitions is acknowledged
   (KAFKA_STORAGE_ERROR, then, once the controller has taken the lost replicas offline, no
   leader) while every one to the other disk's is; the broker logs once that the directory went
   offline, Metadata shows no leader for exactly the lost replicas' partitions and
   `kafka_controller_kafkacontroller_offlinepartitionscount` counts them, `kafka-log-dirs`
   reports it with a storage error, `/metrics` counts one offline directory, and the partitions
   on the healthy disk keep taking writes and serving reads, everything acknowledged read back;
   a new topic's replicas all go to the healthy disk; the broker stops cleanly on SIGTERM, and
   started again without the dead disk it serves every record the healthy one acknowledged.
   (Root and loop devices; skipped elsewhere.)
4. The same in a three-node cluster: the leaderships of the dead disk's partitions go to the
   other replicas while a producer keeps writing; nothing acknowledged is lost.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import threading
import time
import urllib.request
from pathlib import Path

import pytest
from confluent_kafka import KafkaError, TopicPartition
from confluent_kafka.admin import NewTopic

from harness import (admin, assert_all_delivered, consumer, create_topic, free_port, produce_all, producer,
                     read_to_end)
from cluster import Cluster, format_storage, wait_for
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


class KeepProducing(threading.Thread):
    """Produces the chunks `chunk(n)` makes (`n`: records sent so far) through `p` until
    `finish`, each flushed and its delivery reports kept: `sent[i]` has report `reports[i]`."""

    def __init__(self, p, topic: str, chunk, pause: float = 0.0):
        super().__init__()
        self.p, self.topic, self.chunk, self.pause = p, topic, chunk, pause
        self.sent: list[dict] = []
        self.reports: list = []
        self.stopping = threading.Event()
        self.failure: BaseException | None = None

    def run(self):
        try:
            while not self.stopping.is_set():
                chunk = self.chunk(len(self.sent))
                self.sent.extend(chunk)
                self.reports.extend(produce_all(self.p, self.topic, chunk))
                time.sleep(self.pause)
        except BaseException as e:  # noqa: BLE001 - raised again by `finish`
            self.failure = e

    def finish(self) -> None:
        self.stopping.set()
        self.join(timeout=180)
        assert not self.is_alive(), "the producer did not stop"
        if self.failure is not None:
            raise self.failure


def read_back(bootstrap: str, topic: str, partitions: int, sent: list[dict], reports) -> None:
    """Every acknowledged record is at its offset, and nothing else is there."""
    ends: dict[tuple[str, int], int] = {}
    expected = {}
    for m, r in zip(sent, reports):
        expected[(r.partition, r.offset)] = m
        ends[(topic, r.partition)] = max(ends.get((topic, r.partition), 0), r.offset + 1)
    c = consumer(bootstrap)
    c.assign([TopicPartition(topic, p, 0) for (_, p) in sorted(ends)])
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


def reassign(bootstrap: str, plan: Path, action: str, *extra: str) -> str:
    return kafka_tool("org.apache.kafka.tools.reassign.ReassignPartitionsCommand", "--bootstrap-server", bootstrap,
                      action, "--reassignment-json-file", str(plan), *extra)


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
    t = KeepProducing(p, topic, lambda n: [{"partition": 0, "key": f"d{n + j}".encode(),
                                             "value": f"during-{n + j}".encode()} for j in range(200)])
    t.start()
    try:
        time.sleep(1.0)
        plan = broker.root / "plan.json"
        plan.write_text(json.dumps({"version": 1, "partitions": [
            {"topic": topic, "partition": 0, "replicas": [1], "log_dirs": [str(dest)]}]}))
        # At most 4 MB/s for the copying (the broker's replica.alter.log.dirs.io.max.bytes.per.second):
        # the 8 MB already written takes more than a second to copy.
        reassign(broker.bootstrap, plan, "--execute", "--replica-alter-log-dirs-throttle", str(4_000_000))
        deadline = time.monotonic() + 60
        while True:
            out = reassign(broker.bootstrap, plan, "--verify")
            if f"Reassignment of replica {topic}-0-1 completed successfully" in out:
                break
            assert time.monotonic() < deadline, out
            time.sleep(0.5)
        time.sleep(1.0)
    finally:
        t.finish()
    during, during_reports = t.sent, t.reports
    assert_all_delivered(during_reports)
    assert len(during_reports) >= 200, len(during_reports)

    assert (dest / f"{topic}-0").is_dir() and not (source / f"{topic}-0").exists()
    leftovers = [e.name for d in (a, b) for e in d.iterdir() if e.name.endswith(("-future", "-delete"))]
    assert not leftovers, leftovers
    lines = [l for l in broker.log_text().splitlines() if "replica paused for the swap" in l]
    assert len(lines) == 1 and "pause_ms=" in lines[0], lines
    (moved,) = [l for l in broker.log_text().splitlines() if "moved a replica to another log directory" in l]
    copied, took = (int(re.search(rf"{k}=(\d+)", moved).group(1)) for k in ("bytes", "elapsed_ms"))
    assert copied > 8_000_000 and took > 1_000, moved
    # --verify cleared the throttle once the move was done.
    described = kafka_tool("org.apache.kafka.tools.ConfigCommand", "--bootstrap-server", broker.bootstrap,
                           "--entity-type", "brokers", "--entity-name", "1", "--describe")
    assert "replica.alter.log.dirs.io.max.bytes.per.second" not in described, described
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


# ---- a failing disk ------------------------------------------------------------------------------

DISK_BYTES = 256 << 20
# What a produce to a partition on a dead disk gets: the storage error, before the controller
# has heard of it; then (no leader) a timeout or a leadership error.
REFUSED = {KafkaError.KAFKA_STORAGE_ERROR, KafkaError._MSG_TIMED_OUT, KafkaError.NOT_LEADER_FOR_PARTITION,
           KafkaError.LEADER_NOT_AVAILABLE}


def _run(args: list[str]) -> str:
    r = subprocess.run(args, capture_output=True, text=True)
    assert r.returncode == 0, f"{' '.join(args)} exited with {r.returncode}: {r.stderr.strip()}"
    return r.stdout.strip()


@pytest.fixture
def two_disks(tmp_path):
    """Two fresh ext4 file systems, each on its own loop device over a sparse image, mounted
    under tmp_path. Yields [(image, device, mount point)]; teardown unmounts them and detaches
    those loop devices (and no others)."""
    if os.geteuid() != 0:
        pytest.skip("needs root to mount scratch file systems")
    missing = [t for t in ("mkfs.ext4", "losetup", "mount", "umount") if shutil.which(t) is None]
    if missing:
        pytest.skip(f"needs {missing}")
    disks = []
    try:
        for name in ("a", "b"):
            image, mount = tmp_path / f"disk-{name}.img", tmp_path / f"disk-{name}"
            with open(image, "wb") as f:
                f.truncate(DISK_BYTES)
            _run(["mkfs.ext4", "-q", "-F", "-m", "0", str(image)])
            device = _run(["losetup", "--find", "--show", str(image)])
            assert device.startswith("/dev/loop"), device
            disks.append((image, device, mount))
            mount.mkdir()
            _run(["mount", "-t", "ext4", device, str(mount)])
            size = int(_run(["blockdev", "--getsize64", device]))
            assert size == DISK_BYTES, (device, size)
        yield disks
    finally:
        for image, device, mount in disks:
            subprocess.run(["umount", str(mount)], capture_output=True)
            if subprocess.run(["mountpoint", "-q", str(mount)]).returncode == 0:
                subprocess.run(["umount", "-l", str(mount)], capture_output=True)
            subprocess.run(["losetup", "-d", device], capture_output=True)


def fail_disk(image: Path, device: str) -> None:
    """The disk dies: its loop device shrinks to nothing, so every read and write is EIO. (Shrunk
    to a few blocks, writes landing there would still succeed, and durably.) Writes through the
    device between the truncation and the capacity change grow the image again, so it is done
    until the device reports no bytes."""
    for _ in range(50):
        with open(image, "r+b") as f:
            f.truncate(0)
        _run(["losetup", "-c", device])
        if int(_run(["blockdev", "--getsize64", device])) == 0:
            return
    raise AssertionError(f"{device} kept a capacity above 0")


def scrape(port: int) -> str:
    return urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode()


def test_a_failing_disk_takes_only_its_directory_offline(two_disks, unstarted_broker):
    broker = unstarted_broker
    # The second disk fails: the first holds the metadata log, whose failure stops a node, as in
    # Kafka.
    (_, _, mnt_a), (img_b, dev_b, mnt_b) = two_disks
    metrics_port = free_port()
    broker.extra_args += ["--metrics-listener", f"127.0.0.1:{metrics_port}"]
    a, b = start_with_dirs(broker, [str(mnt_a / "data"), str(mnt_b / "data")])
    topic, partitions = "disks", 8
    create_topic(broker.bootstrap, topic, partitions, {"segment.bytes": str(1 << 20)})
    on_a = {int(n.rsplit("-", 1)[1]) for n in replicas_in(a) if n.startswith(f"{topic}-")}
    on_b = {int(n.rsplit("-", 1)[1]) for n in replicas_in(b) if n.startswith(f"{topic}-")}
    assert on_a and on_b and on_a | on_b == set(range(partitions)), (on_a, on_b)

    no_retry = {"retries": 0, "message.timeout.ms": 20_000, "request.timeout.ms": 15_000}
    first = [{"partition": i % partitions, "key": f"k{i}".encode(), "value": os.urandom(300)} for i in range(1600)]
    first_reports = produce_all(producer(broker.bootstrap, **no_retry), topic, first)
    assert_all_delivered(first_reports)

    lost = replicas_in(b)
    fail_disk(img_b, dev_b)
    # Produce until the broker notices (the first write or sync that reaches the dead device),
    # then once more: from then on nothing is acknowledged for the dead disk's partitions (they
    # have no leader once the controller hears of it: their only replica is lost), and every
    # produce to the healthy disk's is.
    second, second_reports = [], []
    short = {**no_retry, "message.timeout.ms": 3000}
    p2 = producer(broker.bootstrap, **short)
    for attempt in range(60):
        chunk = [{"partition": i % partitions, "key": f"s{attempt}-{i}".encode(), "value": os.urandom(300)}
                 for i in range(80)]
        reports = produce_all(p2, topic, chunk)
        second += chunk
        second_reports += reports
        for m, r in zip(chunk, reports):
            if m["partition"] in on_a:
                assert r.error is None, (m["partition"], r.error)
            elif r.error is not None:
                assert r.error.code() in REFUSED, (m["partition"], r.error)
        if "took the log directory offline" in broker.log_text():
            break
        time.sleep(0.1)
    else:
        raise AssertionError(f"the dead disk was never noticed\n{broker.log_tail()}")
    time.sleep(0.2)  # every shard's next check (every 50 ms) takes its replicas there offline
    last = [{"partition": i % partitions, "value": f"last-{i}".encode()} for i in range(80)]
    last_reports = produce_all(p2, topic, last)
    for m, r in zip(last, last_reports):
        if m["partition"] in on_b:
            assert r.error is not None and r.error.code() in REFUSED, (m["partition"], r.error)
        else:
            assert r.error is None, (m["partition"], r.error)
    second += last
    second_reports += last_reports
    lines = [l for l in broker.log_text().splitlines() if "took the log directory offline" in l]
    assert len(lines) == 1 and str(b) in lines[0], lines
    assert "kafka_log_logmanager_offlinelogdirectorycount 1" in scrape(metrics_port)
    # The controller heard of it: every replica the dead disk held is offline (no leader), and
    # Metadata and /metrics say so; the healthy disk's partitions keep their leader.
    deadline = time.monotonic() + 15
    while True:
        leaders = {p.id: p.leader for p in admin(broker.bootstrap).list_topics(topic, timeout=10).topics[topic].partitions.values()}
        offline = re.search(r"^kafka_controller_kafkacontroller_offlinepartitionscount (\d+)", scrape(metrics_port), re.M)
        if all(leaders[p] == -1 for p in on_b) and offline and int(offline.group(1)) == len(lost):
            break
        assert time.monotonic() < deadline, (leaders, offline and offline.group(0), broker.log_tail())
        time.sleep(0.2)
    assert all(leaders[p] == 1 for p in on_a), leaders
    assert "the controller took this broker's replicas in the offline log directory out" in broker.log_text()
    out = kafka_tool("org.apache.kafka.tools.LogDirsCommand", "--bootstrap-server", broker.bootstrap, "--describe",
                     "--topic-list", topic)
    (only,) = json.loads(out.strip().splitlines()[-1])["brokers"]
    by_dir = {d["logDir"]: d for d in only["logDirs"]}
    assert by_dir[str(b)]["error"] is not None and "Storage" in by_dir[str(b)]["error"], by_dir[str(b)]
    assert by_dir[str(a)]["error"] is None
    assert sorted(p["partition"] for p in by_dir[str(a)]["partitions"]) == sorted(f"{topic}-{p}" for p in on_a)

    # The healthy disk keeps serving: everything it acknowledged reads back, and it takes more.
    healthy = [(m, r) for m, r in zip(first + second, first_reports + second_reports) if m["partition"] in on_a]
    third = [{"partition": sorted(on_a)[i % len(on_a)], "value": f"after-{i}".encode()} for i in range(400)]
    third_reports = produce_all(producer(broker.bootstrap, **no_retry), topic, third)
    assert_all_delivered(third_reports)
    healthy += list(zip(third, third_reports))
    read_back(broker.bootstrap, topic, partitions, [m for m, _ in healthy], [r for _, r in healthy])
    create_topic(broker.bootstrap, "after-failure", 4)
    assert {n for n in replicas_in(a) if n.startswith("after-failure-")} == {f"after-failure-{i}" for i in range(4)}

    broker.stop_cleanly()
    # The operator takes the dead disk out of log.dirs; the healthy one serves all it acknowledged.
    start_with_dirs(broker, [str(a)])
    read_back(broker.bootstrap, topic, partitions, [m for m, _ in healthy], [r for _, r in healthy])


def test_a_failing_disk_hands_its_leaderships_over_in_a_cluster(two_disks, tmp_path):
    """Three nodes; node 1 keeps its logs on two loop-mounted disks and leads all six partitions
    of a replication-factor-3 topic. The second disk dies while an idempotent acks=all producer
    writes to every partition: node 1 reports the lost replicas (AssignReplicasToDirs, the LOST
    directory), the controller elects other leaders for the partitions on the dead disk and takes
    node 1 out of their ISRs, the partitions on the healthy disk keep node 1 as leader and in
    sync, every record is acknowledged and read back once, in order."""
    (_, _, mnt_a), (img_b, dev_b, mnt_b) = two_disks
    config = tmp_path / "sluice.toml"
    config.write_text(BROKER_TOML)
    c = Cluster(3, name="logdirs", extra_args=["--config", str(config)])
    n1 = c.node(1)
    a, b = mnt_a / "data", mnt_b / "data"
    n1.data_dir = f"{a},{b}"
    done = format_storage(n1.data_dir, c.cluster_id, 1)
    assert done.returncode == 0, done.stderr
    topic, partitions = "replicated", 6
    try:
        c.start()
        wait_for("three brokers", lambda: len(admin(c.bootstrap).list_topics(timeout=5).brokers) == 3)
        client = admin(c.bootstrap)
        fs = client.create_topics([NewTopic(topic, num_partitions=partitions, replica_assignment=[[1, 2, 3]] * partitions,
                                                        config={"min.insync.replicas": "2"})])
        fs[topic].result(timeout=30)
        wait_for("node 1 leading every partition", lambda: all(
            p.leader == 1 for p in admin(c.bootstrap).list_topics(topic, timeout=5).topics[topic].partitions.values()))
        on_b = {int(n.rsplit("-", 1)[1]) for n in replicas_in(b) if n.startswith(f"{topic}-")}
        on_a = set(range(partitions)) - on_b
        assert on_a and on_b, (on_a, on_b)

        p = producer(c.bootstrap, **{"enable.idempotence": True, "linger.ms": 5})
        t = KeepProducing(p, topic, lambda n: [{"partition": (n + j) % partitions, "key": f"k{n + j}".encode(),
                                                 "value": f"v{n + j}".encode()} for j in range(120)], pause=0.05)
        t.start()
        try:
            time.sleep(2.0)
            fail_disk(img_b, dev_b)
            wait_for("the lost replicas' leaderships handed over", lambda: all(
                pp.leader in (2, 3) and 1 not in pp.isrs
                for i, pp in admin(c.bootstrap).list_topics(topic, timeout=5).topics[topic].partitions.items()
                if i in on_b), timeout=30)
            time.sleep(3.0)
        finally:
            t.finish()
        sent, reports = t.sent, t.reports
        assert_all_delivered(reports)
        md = admin(c.bootstrap).list_topics(topic, timeout=5).topics[topic].partitions
        for i in on_a:
            assert md[i].leader == 1 and 1 in md[i].isrs, (i, md[i].leader, md[i].isrs)
        assert "took the log directory offline" in n1.log_text()
        assert "the controller took this broker's replicas in the offline log directory out" in n1.log_text()
        after = [r for r in reports if r.partition in on_b]
        assert after, "nothing written to the partitions on the dead disk"
        for part in range(partitions):
            offsets = sorted(r.offset for r in reports if r.partition == part)
            assert offsets == list(range(len(offsets))), f"partition {part}: acknowledged offsets have gaps or repeats"
        read_back(c.bootstrap, topic, partitions, sent, reports)
    except BaseException:
        print(c.log_tails())
        raise
    finally:
        c.stop()
