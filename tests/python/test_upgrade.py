"""Data directories written by earlier releases open with everything in them.

- A single-node broker's directory from the release before the metadata log: its JSON metadata
  file is imported into `__cluster_metadata` on the first start, then retired. The directory is
  a real one (tests/fixtures/single-node-dir.tar.gz, made by that release's binary with
  tests/fixtures/make_single_node_dir.py): topics with configs, records from an idempotent
  producer (keys, null keys, headers), a dynamic broker config and a group's committed offsets.
- A three-node cluster's directories from the release that placed groups with a negative Java
  hash on another `__consumer_offsets` partition than Kafka (tests/fixtures/cluster-dirs.tar.gz,
  made with tests/fixtures/make_cluster_dirs.py): each group's coordinator is now Kafka's, and
  its commits (plain, committed with a transaction, one aborted transaction's left out) are
  there; a group deleted before the upgrade stays deleted; later commits win across restarts.
"""

from __future__ import annotations

import json
import shutil
import tarfile
import uuid
from pathlib import Path

from confluent_kafka import Consumer, TopicCollection, TopicPartition
from confluent_kafka.admin import ConfigResource, OffsetSpec

from cluster import Cluster
from harness import Broker, admin, producer
from kafka.protocol.metadata.find_coordinator import FindCoordinatorRequest
from kafka.protocol.producer import InitProducerIdRequest
from wire import Pipeline, build

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
EXPECTED = json.loads((FIXTURES / "single-node-dir.expected.json").read_text())
METADATA_FILE = ".sluice-metadata.json"


def prepare(broker: Broker) -> None:
    """Puts the old broker's data directory where `broker` starts from."""
    # The old broker ran with 3 offsets partitions (the group coordinator's partition of a group
    # follows `offsets.topic.num.partitions`).
    toml = broker.root / "sluice.toml"
    toml.write_text('"offsets.topic.num.partitions" = 3\n')
    broker.extra_args = [*broker.extra_args, "--config", str(toml)]
    with tarfile.open(FIXTURES / "single-node-dir.tar.gz") as tar:
        tar.extractall(broker.root, filter="data")
    assert (broker.data_dir / METADATA_FILE).exists()


def read_all(bootstrap: str, topic: str, partitions: int, per_partition: int):
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": f"reader-{topic}", "enable.auto.commit": False})
    c.assign([TopicPartition(topic, q, 0) for q in range(partitions)])
    got = {q: [] for q in range(partitions)}
    idle = 0
    while any(len(v) < per_partition for v in got.values()) and idle < 40:
        m = c.poll(0.5)
        if m is None:
            idle += 1
            continue
        assert m.error() is None, m.error()
        got[m.partition()].append((m.offset(), m.key(), m.value().decode(), dict(m.headers() or [])))
    c.close()
    return got


def topic_id(description) -> str:
    u = description.topic_id
    mask = (1 << 64) - 1
    return str(uuid.UUID(int=((u.get_most_significant_bits() & mask) << 64) | (u.get_least_significant_bits() & mask)))


def check_contents(broker: Broker) -> None:
    a = admin(broker.bootstrap)
    md = a.list_topics(timeout=10)
    futures = a.describe_topics(TopicCollection(list(EXPECTED["topics"])))
    described = {name: f.result() for name, f in futures.items()}
    for name, want in EXPECTED["topics"].items():
        assert name in md.topics, f"topic {name} is gone after the upgrade"
        assert len(md.topics[name].partitions) == want["partitions"], name
        assert topic_id(described[name]) == want["id"], f"{name} changed its topic id"
        for p in md.topics[name].partitions.values():
            assert (p.leader, p.replicas, p.isrs) == (1, [1], [1]), (name, p.id, p.leader, p.replicas)
    # Topic configs, as overrides of the topic.
    resources = [ConfigResource("TOPIC", n) for n in EXPECTED["topics"]]
    for res, f in a.describe_configs(resources).items():
        entries = f.result()
        for key, value in EXPECTED["topics"][res.name]["configs"].items():
            assert entries[key].value == value, (res.name, key, entries[key].value)
            assert entries[key].source == 1, (res.name, key, entries[key].source)  # DYNAMIC_TOPIC_CONFIG
    # The dynamic broker config.
    (entries,) = [f.result() for f in a.describe_configs([ConfigResource("BROKER", "1")]).values()]
    for key, value in EXPECTED["broker_configs"]["1"].items():
        assert entries[key].value == value, (key, entries[key].value)
        assert entries[key].source == 2, (key, entries[key].source)  # DYNAMIC_BROKER_CONFIG
    # Every record, at its offset, with its key and headers.
    n = EXPECTED["records_per_topic"]
    for topic in ("orders", "compacted"):
        partitions = EXPECTED["topics"][topic]["partitions"]
        got = read_all(broker.bootstrap, topic, partitions, n // partitions)
        for q in range(partitions):
            want = [(o, None if topic == "orders" and i % 7 == 0 else f"k{i % 50}".encode(), f"{topic}-{i}", {"i": str(i).encode()})
                    for o, i in enumerate(range(q, n, partitions))]
            assert got[q][:len(want)] == want, f"{topic}/{q}: {len(got[q])} records, first differences {[x for x in zip(got[q], want) if x[0] != x[1]][:3]}"
    # The group's committed offsets.
    c = Consumer({"bootstrap.servers": broker.bootstrap, "group.id": "upgraders"})
    committed = c.committed([TopicPartition("orders", q) for q in range(3)], timeout=10)
    c.close()
    assert {f"orders/{tp.partition}": tp.offset for tp in committed if tp.offset >= 0} == EXPECTED["groups"]["upgraders"]


def new_producer_id(bootstrap: str) -> int:
    pipe = Pipeline(bootstrap)
    pipe.send(build(InitProducerIdRequest, 0, transactional_id=None, transaction_timeout_ms=60000))
    (r,) = pipe.responses()
    pipe.close()
    assert r["error_code"] == 0, r
    return r["producer_id"]


def test_a_single_node_directory_from_before_the_metadata_log_opens_with_everything_in_it(unstarted_broker):
    broker = unstarted_broker
    prepare(broker)
    broker.start()
    log = broker.log_text()
    assert "imported the metadata file into the metadata log" in log, broker.log_tail()
    assert not (broker.data_dir / METADATA_FILE).exists(), "the metadata file was not retired"
    assert (broker.data_dir / (METADATA_FILE + ".migrated")).exists()
    assert (broker.data_dir / "__cluster_metadata-0").is_dir()
    check_contents(broker)
    # Producer ids continue after the ones the old broker handed out.
    assert new_producer_id(broker.bootstrap) >= EXPECTED["next_producer_id"]
    # New writes land after the old ones.
    p = producer(broker.bootstrap, **{"enable.idempotence": True})
    p.produce("orders", value=b"after-upgrade", partition=1)
    assert p.flush(30) == 0
    a = admin(broker.bootstrap)
    ends = {tp.partition: r.result().offset for tp, r in a.list_offsets({TopicPartition("orders", 1): OffsetSpec.latest()}).items()}
    assert ends == {1: 501}, ends

    # The next start reads the metadata log alone.
    broker.stop_cleanly()
    broker.start()
    assert broker.log_text().count("imported the metadata file into the metadata log") == 1
    check_contents(broker)

    # A crash after the import committed but before the file was retired leaves both: the
    # next start imports it again, which changes nothing.
    broker.stop_cleanly()
    shutil.copy(broker.data_dir / (METADATA_FILE + ".migrated"), broker.data_dir / METADATA_FILE)
    broker.start()
    assert broker.log_text().count("imported the metadata file into the metadata log") == 2
    assert "imported=0" in broker.log_text().rsplit("imported the metadata file", 1)[1].splitlines()[0]
    assert not (broker.data_dir / METADATA_FILE).exists()
    check_contents(broker)


CLUSTER_EXPECTED = json.loads((FIXTURES / "cluster-dirs.expected.json").read_text())


def java_hash(s: str) -> int:
    h = 0
    for ch in s:
        h = (31 * h + ord(ch)) & 0xFFFFFFFF
    return h - (1 << 32) if h & 0x80000000 else h


def kafka_partition(group: str, partitions: int) -> int:
    h = java_hash(group)
    return (0 if h == -(1 << 31) else abs(h)) % partitions


def committed_offsets(bootstrap: str, group: str) -> dict[str, int]:
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": group, "enable.auto.commit": False})
    try:
        got = c.committed([TopicPartition("orders", q) for q in range(3)], timeout=30)
    finally:
        c.close()
    return {str(tp.partition): tp.offset for tp in got if tp.offset >= 0}


def test_groups_an_earlier_release_placed_elsewhere_keep_their_commits_on_kafkas_partition(tmp_path):
    partitions = CLUSTER_EXPECTED["offsets_partitions"]
    toml = tmp_path / "sluice.toml"
    toml.write_text(f'"offsets.topic.num.partitions" = {partitions}\n')
    c = Cluster(3, name="upgrade", cluster_id=CLUSTER_EXPECTED["cluster_id"], extra_args=["--config", str(toml)])
    with tarfile.open(FIXTURES / "cluster-dirs.tar.gz") as tar:
        tar.extractall(tmp_path / "old", filter="data")
    for n in c.nodes:
        shutil.rmtree(n.data_dir)
        shutil.move(tmp_path / "old" / f"node-{n.node_id}", n.data_dir)
    failed = True
    try:
        c.start()
        groups = CLUSTER_EXPECTED["groups"]
        moved = [g for g in groups if java_hash(g) < 0 and groups[g]]
        assert len(moved) == 5, moved
        for g, want in groups.items():
            assert committed_offsets(c.bootstrap, g) == want, g
        # Each group's coordinator is the leader of Kafka's partition for it.
        md = admin(c.bootstrap).list_topics("__consumer_offsets", timeout=10).topics["__consumer_offsets"]
        pipe = Pipeline(c.nodes[0].bootstrap)
        pipe.send(build(FindCoordinatorRequest, 4, key_type=0, coordinator_keys=list(groups)))
        (answer,) = pipe.responses()
        pipe.close()
        got = {x["key"]: (x["error_code"], x["node_id"]) for x in answer["coordinators"]}
        assert got == {g: (0, md.partitions[kafka_partition(g, partitions)].leader) for g in groups}, got
        taken = sum(n.log_text().count("took over the commits of a group") for n in c.nodes)
        assert taken == len(moved), taken

        # A moved group's next commit lands on Kafka's partition and nowhere else, and wins over
        # the one taken over, across a restart of every node; the deleted group does not come
        # back from its old partition.
        def ends() -> dict[int, int]:
            a = admin(c.bootstrap)
            futures = a.list_offsets({TopicPartition("__consumer_offsets", p): OffsetSpec.latest()
                                      for p in range(partitions)}, request_timeout=15)
            return {tp.partition: f.result(timeout=20).offset for tp, f in futures.items()}

        for g in moved:
            before = ends()
            c2 = Consumer({"bootstrap.servers": c.bootstrap, "group.id": g, "enable.auto.commit": False})
            c2.commit(offsets=[TopicPartition("orders", 0, 99)], asynchronous=False)
            c2.close()
            after = ends()
            grew = [p for p in range(partitions) if after[p] != before[p]]
            assert grew == [kafka_partition(g, partitions)], (g, grew)
        c.stop()
        c.start()
        for g, want in groups.items():
            assert committed_offsets(c.bootstrap, g) == ({**want, "0": 99} if g in moved else want), g
        assert sum(n.log_text().count("took over the commits of a group") for n in c.nodes) == taken
        failed = False
    finally:
        if failed:
            print(c.log_tails())
        c.stop()
        if not failed:
            for n in c.nodes:
                n.remove()
