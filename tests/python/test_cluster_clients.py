"""What a cluster shows its clients, end to end: three combined nodes (`--cores 1` each) on two
racks, one of them advertising `localhost` instead of the address it listens on. Metadata and
DescribeCluster name every broker's rack and advertised host, and replicas land on distinct
racks; CreatePartitions, DeleteTopics and a `validate_only` CreateTopics sent to a node that is
not the active controller are forwarded and reach every node (and its data directory);
FindCoordinator names the leader of the group's `__consumer_offsets` partition, and a group
whose members entered through different brokers shares the partitions and its commits; producer
ids come in blocks no two brokers share; a node formatted for another cluster says so in its own
log; and `sluice dev-cluster` starts and stops a cluster of its own."""

from __future__ import annotations

import collections
import os
import random
import shutil
import signal
import socket
import subprocess
import tempfile
import time
import uuid

import pytest
from confluent_kafka import Consumer, KafkaError, TopicPartition
from confluent_kafka.admin import NewTopic, OffsetSpec

from kafka.protocol.admin.topics import CreatePartitionsRequest, CreateTopicsRequest, DeleteTopicsRequest
from kafka.protocol.metadata.find_coordinator import FindCoordinatorRequest
from kafka.protocol.metadata.metadata import MetadataRequest
from kafka.protocol.producer import InitProducerIdRequest

from cluster import Cluster, Node, format_storage, running, wait_for
from harness import (CLIENT_DEFAULTS, SLUICE_BIN, START_TIMEOUT_S, TEST_DIR, admin, assert_all_delivered, consumer,
                     produce_all, producer, read_to_end)
from wire import Pipeline, build

RACKS = {1: "rack-a", 2: "rack-b", 3: "rack-a"}
# The node whose advertised listener names `localhost` rather than the 127.0.0.1 it listens on.
ADVERTISED_NODE = 3
UNKNOWN_TOPIC_OR_PARTITION = 3
INVALID_REPLICATION_FACTOR = 38


@pytest.fixture(scope="module")
def cluster(request):
    c = Cluster(3, name="clients", extra_args=["--group-initial-rebalance-delay-ms", "200"])
    for n in c.nodes:
        n.extra_args += ["--broker-rack", RACKS[n.node_id]]
        if n.node_id == ADVERTISED_NODE:
            n.extra_args += ["--advertised-listeners", f"PLAINTEXT://localhost:{n.port}"]
    yield from running(request, c, "every node to list every broker",
                       lambda: all(len(raw_metadata(n.bootstrap)["brokers"]) == 3 for n in c.nodes), START_TIMEOUT_S)


def advertised(node: Node) -> tuple[str, int]:
    return ("localhost" if node.node_id == ADVERTISED_NODE else "127.0.0.1", node.port)


def exchange(bootstrap: str, *requests) -> list[dict]:
    """Sends `requests` on one connection to exactly this broker and returns their answers."""
    pipe = Pipeline(bootstrap)
    try:
        for r in requests:
            pipe.send(r)
        return pipe.responses()
    finally:
        pipe.close()


def raw_metadata(bootstrap: str, topics: list[str] | None = None) -> dict:
    (md,) = exchange(bootstrap, build(
        MetadataRequest, 12, topics=None if topics is None else [{"topic_id": None, "name": t} for t in topics],
        allow_auto_topic_creation=False, include_topic_authorized_operations=False))
    return md


def partitions_seen(bootstrap: str, topic: str) -> dict[int, dict] | None:
    """The topic's partitions in this broker's Metadata, or None when it does not list it."""
    (t,) = raw_metadata(bootstrap, [topic])["topics"]
    if t["error_code"] != 0:
        assert t["error_code"] == UNKNOWN_TOPIC_OR_PARTITION, t
        return None
    return {p["partition_index"]: p for p in t["partitions"]}


def partition_dirs(node: Node, topic: str) -> list[str]:
    """The topic's partition directories in the node's data directory, including any being deleted
    (`<topic>.<id>-delete`)."""
    return sorted(d.name for d in node.data_dir.iterdir()
                  if d.name.rsplit("-", 1)[0] == topic or d.name.startswith(f"{topic}."))


def active_controller(cluster) -> int:
    """The quorum leader, from DescribeQuorum (`sluice cluster --bootstrap-controller`)."""

    def leader():
        for n in cluster.nodes:
            out = subprocess.run([str(SLUICE_BIN), "cluster", "--bootstrap-controller", f"127.0.0.1:{n.controller_port}"],
                                 capture_output=True, text=True, timeout=30)
            for line in out.stdout.splitlines():
                if line.startswith("LeaderId: ") and int(line.split()[1]) >= 0:
                    return int(line.split()[1])
        return None

    return wait_for("a quorum leader", leader)


def not_the_controller(cluster) -> Node:
    controller = active_controller(cluster)
    return next(n for n in cluster.nodes if n.node_id != controller)


def create_topics_request(name: str, partitions: int, replication_factor: int, validate_only: bool = False):
    return build(CreateTopicsRequest, 7, topics=[{
        "name": name, "num_partitions": partitions, "replication_factor": replication_factor,
        "assignments": [], "configs": []}], timeout_ms=30_000, validate_only=validate_only)


def create_everywhere(cluster, entry: Node, name: str, partitions: int, replication_factor: int = 2) -> dict:
    """Creates the topic through `entry` and waits until every node lists it with every
    partition led; returns the partitions as the first node lists them."""
    (r,) = exchange(entry.bootstrap, create_topics_request(name, partitions, replication_factor))
    assert r["topics"][0]["error_code"] == 0, r
    for n in cluster.nodes:
        wait_for(f"node {n.node_id} to list {name}", lambda: (ps := partitions_seen(n.bootstrap, name))
                 and len(ps) == partitions and all(p["leader_id"] >= 0 for p in ps.values()))
    return partitions_seen(cluster.nodes[0].bootstrap, name)


def java_string_hash(s: str) -> int:
    """Java's String.hashCode (a signed 32-bit int) of an ASCII string."""
    h = 0
    for ch in s:
        h = (31 * h + ord(ch)) & 0xFFFFFFFF
    return h - (1 << 32) if h & 0x80000000 else h


def kafka_offsets_partition(group: str, partitions: int) -> int:
    """Kafka's `__consumer_offsets` partition of a group: Utils.abs(groupId.hashCode()) %
    partitions, where Utils.abs maps Integer.MIN_VALUE to 0."""
    h = java_string_hash(group)
    return (0 if h == -(1 << 31) else abs(h)) % partitions


# ---- dev-cluster (first: before the module's cluster starts, so the two do not share the cores) ----

def _free_port_block() -> int:
    """A base port P with P..P+2 and P+100..P+102 free on 127.0.0.1 (dev-cluster's client and
    controller ports for three nodes), below the kernel's ephemeral range so that no test's
    `free_port` takes one meanwhile."""
    rng = random.Random()
    for _ in range(200):
        base = rng.randrange(20_000, 32_000)
        socks = []
        try:
            for port in (*range(base, base + 3), *range(base + 100, base + 103)):
                s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
                socks.append(s)
                s.bind(("127.0.0.1", port))
            return base
        except OSError:
            continue
        finally:
            for s in socks:
                s.close()
    raise AssertionError("no free block of ports for dev-cluster")


def _children(pid: int) -> dict[int, str]:
    """The live child processes of `pid`, with their command lines."""
    out = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                stat = f.read()
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                cmdline = f.read().replace(b"\0", b" ").decode(errors="replace").strip()
        except OSError:
            continue
        # The fields after the command name (in parentheses, which may hold spaces): state, ppid.
        if int(stat.rsplit(")", 1)[1].split()[1]) == pid:
            out[int(entry)] = cmdline
    return out


def _alive_as(pid: int, cmdline: str) -> bool:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read().replace(b"\0", b" ").decode(errors="replace").strip() == cmdline
    except OSError:
        return False


def test_dev_cluster_starts_three_nodes_that_serve_and_sigint_stops_them_all():
    TEST_DIR.mkdir(parents=True, exist_ok=True)
    workdir = tempfile.mkdtemp(prefix="pytest-dev-cluster-", dir=TEST_DIR)
    base = _free_port_block()
    log_path = os.path.join(workdir, "dev-cluster.log")
    with open(log_path, "wb") as log:
        # Its data goes to ./dev-cluster, under the working directory.
        proc = subprocess.Popen([str(SLUICE_BIN), "dev-cluster", "--nodes", "3", "--port", str(base)],
                                cwd=workdir, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                                env={**os.environ, "RUST_LOG": "info"}, start_new_session=True)
    bootstrap = ",".join(f"127.0.0.1:{base + i}" for i in range(3))

    def log_text():
        with open(log_path, errors="replace") as f:
            return f.read()

    try:
        children = wait_for("three nodes started", lambda: len(c := _children(proc.pid)) == 3 and c)
        assert all("--node-id" in cmd for cmd in children.values()), children

        def three_brokers():
            assert proc.poll() is None, log_text()[-3000:]
            try:
                md = admin(bootstrap).list_topics(timeout=2)
            except Exception:
                return None
            return len(md.brokers) == 3 and md

        md = wait_for("dev-cluster to list three brokers", three_brokers, START_TIMEOUT_S)
        assert {b.id: (b.host, b.port) for b in md.brokers.values()} == {
            i: ("127.0.0.1", base + i - 1) for i in (1, 2, 3)}
        with open(os.path.join(workdir, "dev-cluster", "node-1", "meta.properties")) as f:
            props = dict(line.strip().split("=", 1) for line in f if "=" in line and not line.startswith("#"))
        assert md.cluster_id == props["cluster.id"]

        client = admin(bootstrap)
        client.create_topics([NewTopic("dev", num_partitions=3, replication_factor=3)],
                             operation_timeout=10, request_timeout=20)["dev"].result(timeout=30)
        wait_for("every partition led", lambda: (t := client.list_topics(topic="dev", timeout=10).topics["dev"])
                 .error is None and len(t.partitions) == 3 and all(p.leader >= 0 for p in t.partitions.values()))
        p = producer(bootstrap)
        reports = produce_all(p, "dev", [{"key": f"k{i % 7}", "value": f"v{i}"} for i in range(300)])
        assert_all_delivered(reports)
        c = consumer(bootstrap)
        try:
            ends = {("dev", q): c.get_watermark_offsets(TopicPartition("dev", q), timeout=10)[1] for q in range(3)}
            assert sum(ends.values()) == 300, ends
            c.assign([TopicPartition("dev", q, 0) for q in range(3)])
            got = read_to_end(c, ends)
        finally:
            c.close()
        assert sorted((m.partition(), m.offset(), m.value().decode()) for m in got) == sorted(
            (r.partition, r.offset, f"v{i}") for i, r in enumerate(reports))

        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=60) == 0, log_text()[-3000:]
        text = log_text()
        assert "dev-cluster: stopped" in text and "dev-cluster: node" not in text, text[-3000:]
        left = [pid for pid, cmd in children.items() if _alive_as(pid, cmd)]
        assert not left, f"nodes still running after SIGINT: {left}"
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                # Its own session: only the processes this test started.
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
    shutil.rmtree(workdir, ignore_errors=True)


# ---- racks and advertised listeners ------------------------------------------------------------

def test_metadata_and_describe_cluster_name_each_brokers_rack_and_advertised_host(cluster):
    want = {n.node_id: (*advertised(n), RACKS[n.node_id]) for n in cluster.nodes}
    for n in cluster.nodes:
        md = raw_metadata(n.bootstrap)
        assert {b["node_id"]: (b["host"], b["port"], b["rack"]) for b in md["brokers"]} == want, n.node_id
        assert md["cluster_id"] == cluster.cluster_id
    client = admin(cluster.nodes[1].bootstrap)  # kept alive until the answer is in
    described = client.describe_cluster(request_timeout=10).result(timeout=20)
    assert described.cluster_id == cluster.cluster_id
    assert {b.id: (b.host, b.port, b.rack) for b in described.nodes} == want
    listed = admin(cluster.nodes[0].bootstrap).list_topics(timeout=10)
    assert {b.id: (b.host, b.port) for b in listed.brokers.values()} == {i: w[:2] for i, w in want.items()}
    # DescribeConfigs shows each broker's rack as Kafka shows a broker.rack set at start.
    from confluent_kafka.admin import ConfigResource, ResourceType
    static_broker_config = 4
    for n in cluster.nodes:
        resource = ConfigResource(ResourceType.BROKER, str(n.node_id))
        client = admin(n.bootstrap)  # kept alive until the answer is in
        entries = client.describe_configs([resource])[resource].result(timeout=20)
        rack = entries["broker.rack"]
        source = int(getattr(rack.source, "value", rack.source))
        assert (rack.value, source) == (RACKS[n.node_id], static_broker_config), n.node_id


def test_replicas_of_each_partition_land_on_distinct_racks(cluster):
    """Three brokers on two racks (1 and 3 on rack-a, 2 on rack-b), replication factor 2: every
    partition has one replica on each rack, so broker 2 holds all of them, and leaders spread
    evenly, as Kafka's rack-aware assignment places them."""
    parts = create_everywhere(cluster, cluster.nodes[0], "racked", 6)
    for n in cluster.nodes[1:]:
        assert {i: (p["leader_id"], p["replica_nodes"]) for i, p in partitions_seen(n.bootstrap, "racked").items()} \
            == {i: (p["leader_id"], p["replica_nodes"]) for i, p in parts.items()}, "every node lists the same"
    for i, p in parts.items():
        assert len(p["replica_nodes"]) == 2, p
        assert sorted(RACKS[r] for r in p["replica_nodes"]) == ["rack-a", "rack-b"], (i, p["replica_nodes"])
        assert p["leader_id"] in p["replica_nodes"]
    assert collections.Counter(p["leader_id"] for p in parts.values()) == {1: 2, 2: 2, 3: 2}, parts


def test_a_client_bootstrapped_through_the_advertised_host_produces_and_consumes(cluster):
    node = cluster.node(ADVERTISED_NODE)
    host, port = advertised(node)
    bootstrap = f"{host}:{port}"
    parts = wait_for("the racked topic", lambda: partitions_seen(node.bootstrap, "racked"))
    assert any(p["leader_id"] == node.node_id for p in parts.values()), parts
    # IPv4 only: the broker listens on 127.0.0.1, and some hosts resolve localhost to ::1 first.
    family = {"broker.address.family": "v4"}
    c = consumer(bootstrap, **family)
    try:
        before = {q: c.get_watermark_offsets(TopicPartition("racked", q), timeout=10)[1] for q in range(6)}
        reports = produce_all(producer(bootstrap, **family), "racked",
                              [{"partition": i % 6, "value": f"adv-{i}"} for i in range(600)])
        assert_all_delivered(reports)
        c.assign([TopicPartition("racked", q, before[q]) for q in range(6)])
        got = read_to_end(c, {("racked", q): before[q] + 100 for q in range(6)})
    finally:
        c.close()
    assert sorted((m.partition(), m.offset(), m.value().decode()) for m in got) == sorted(
        (r.partition, r.offset, f"adv-{i}") for i, r in enumerate(reports))
    assert sorted((r.partition, r.offset) for r in reports) == sorted(
        (q, before[q] + o) for q in range(6) for o in range(100))


# ---- admin requests forwarded to the controller ------------------------------------------------

def test_create_partitions_and_delete_topics_through_a_node_that_is_not_the_controller(cluster):
    entry = not_the_controller(cluster)
    parts = create_everywhere(cluster, entry, "grown", 2)
    (r,) = exchange(entry.bootstrap, build(CreatePartitionsRequest, 3, topics=[{
        "name": "grown", "count": 5, "assignments": None}], timeout_ms=30_000, validate_only=False))
    assert [(x["name"], x["error_code"]) for x in r["results"]] == [("grown", 0)], r
    for n in cluster.nodes:
        wait_for(f"node {n.node_id} to list 5 partitions", lambda: (ps := partitions_seen(n.bootstrap, "grown"))
                 and sorted(ps) == [0, 1, 2, 3, 4] and all(p["leader_id"] >= 0 for p in ps.values()))
    parts = partitions_seen(cluster.nodes[0].bootstrap, "grown")
    for n in cluster.nodes[1:]:
        assert {i: p["replica_nodes"] for i, p in partitions_seen(n.bootstrap, "grown").items()} == \
            {i: p["replica_nodes"] for i, p in parts.items()}
    assert all(len(p["replica_nodes"]) == 2 for p in parts.values()), parts

    reports = produce_all(producer(cluster.bootstrap),
                          "grown", [{"partition": i % 5, "value": f"g{i}"} for i in range(100)])
    assert_all_delivered(reports)
    assert sorted((r.partition, r.offset) for r in reports) == sorted((q, o) for q in range(5) for o in range(20))
    c = consumer(cluster.bootstrap)
    try:
        c.assign([TopicPartition("grown", q, 0) for q in (2, 3, 4)])
        got = read_to_end(c, {("grown", q): 20 for q in (2, 3, 4)})
    finally:
        c.close()
    assert sorted((m.partition(), m.offset(), m.value().decode()) for m in got) == sorted(
        (r.partition, r.offset, f"g{i}") for i, r in enumerate(reports) if r.partition >= 2)
    for n in cluster.nodes:
        # Followers open their replicas once they learn of them; acks=all means they have.
        held = {q for q in range(5) if (n.data_dir / f"grown-{q}").is_dir()}
        assert held == {q for q, p in parts.items() if n.node_id in p["replica_nodes"]}, n.node_id

    entry = not_the_controller(cluster)
    (r,) = exchange(entry.bootstrap, build(DeleteTopicsRequest, 6, topics=[{"name": "grown", "topic_id": None}],
                                           timeout_ms=30_000))
    assert [(x["name"], x["error_code"]) for x in r["responses"]] == [("grown", 0)], r
    for n in cluster.nodes:
        wait_for(f"node {n.node_id} to forget the topic", lambda: partitions_seen(n.bootstrap, "grown") is None)
    # Only once every node has forgotten it: librdkafka sends list_topics' Metadata to any
    # broker it knows, not only to the one it bootstrapped from.
    for n in cluster.nodes:
        assert "grown" not in admin(n.bootstrap).list_topics(timeout=10).topics
    for n in cluster.nodes:
        wait_for(f"node {n.node_id} to delete the partition directories", lambda: not partition_dirs(n, "grown"))


def test_validate_only_create_topics_through_a_node_that_is_not_the_controller_creates_nothing(cluster):
    entry = not_the_controller(cluster)
    valid, too_many = exchange(entry.bootstrap,
                               create_topics_request("validated-only", 3, 2, validate_only=True),
                               create_topics_request("validated-rf4", 3, 4, validate_only=True))
    (t,) = valid["topics"]
    assert (t["name"], t["error_code"], t["num_partitions"], t["replication_factor"]) == ("validated-only", 0, 3, 2), t
    (t,) = too_many["topics"]
    assert (t["name"], t["error_code"]) == ("validated-rf4", INVALID_REPLICATION_FACTOR), t
    # A topic created after it through the same node: once every node lists that one, it has
    # applied every metadata change before it too.
    create_everywhere(cluster, entry, "after-validation", 1)
    for n in cluster.nodes:
        assert partitions_seen(n.bootstrap, "validated-only") is None, n.node_id
        assert partitions_seen(n.bootstrap, "validated-rf4") is None, n.node_id
        assert not partition_dirs(n, "validated-only") and not partition_dirs(n, "validated-rf4")


# ---- group coordinators ------------------------------------------------------------------------

def _offsets_partitions(cluster) -> dict[int, dict]:
    """`__consumer_offsets` as Metadata lists it, once it exists and every partition is led (the
    first FindCoordinator creates it)."""
    exchange(cluster.nodes[0].bootstrap, build(FindCoordinatorRequest, 4, key_type=0, coordinator_keys=["probe"]))
    led = wait_for("the offsets topic with every partition led", lambda: (
        ps := partitions_seen(cluster.nodes[0].bootstrap, "__consumer_offsets"))
        and all(p["leader_id"] >= 0 for p in ps.values()) and ps, 60)
    # Each partition's first coordinator writes one placement record (group/placement.rs) before
    # it serves; once every partition has it, only commits move the log ends.
    wait_for("every offsets partition's placement record",
             lambda: all(end > 0 for end in _offsets_ends(cluster.nodes[0].bootstrap, len(led)).values()), 60)
    return led


def _offsets_ends(bootstrap: str, partitions: int) -> dict[int, int]:
    client = admin(bootstrap)  # kept alive until the answers are in
    futures = client.list_offsets(
        {TopicPartition("__consumer_offsets", p): OffsetSpec.latest() for p in range(partitions)}, request_timeout=15)
    return {tp.partition: f.result(timeout=20).offset for tp, f in futures.items()}


def _check_group_placement(cluster, groups: list[str], offsets: dict[int, dict]) -> None:
    """Each group's coordinator, asked of every broker, is the leader of its offsets partition by
    Kafka's rule, and a commit of the group lands in that partition and nowhere else."""
    count = len(offsets)
    want = {g: kafka_offsets_partition(g, count) for g in groups}
    for n in cluster.nodes:
        batched, single = exchange(n.bootstrap,
                                   build(FindCoordinatorRequest, 4, key_type=0, coordinator_keys=groups),
                                   build(FindCoordinatorRequest, 3, key=groups[0], key_type=0))
        got = {c["key"]: (c["error_code"], c["node_id"], c["host"], c["port"]) for c in batched["coordinators"]}
        expected = {}
        for g, p in want.items():
            leader = offsets[p]["leader_id"]
            expected[g] = (0, leader, *advertised(cluster.node(leader)))
        assert got == expected, (n.node_id, want)
        assert (single["error_code"], single["node_id"], single["host"], single["port"]) == expected[groups[0]]
    for i, g in enumerate(groups):
        before = _offsets_ends(cluster.nodes[0].bootstrap, count)
        c = consumer(cluster.nodes[i % 3].bootstrap, **{"group.id": g})
        try:
            c.commit(offsets=[TopicPartition("racked", 0, 10 + i)], asynchronous=False)
        finally:
            c.close()
        after = _offsets_ends(cluster.nodes[0].bootstrap, count)
        grew = sorted(p for p in range(count) if after[p] != before[p])
        assert grew == [want[g]], f"{g}'s commit went to {grew}, Kafka's partition is {want[g]}"
        reader = consumer(cluster.nodes[(i + 1) % 3].bootstrap, **{"group.id": g})
        try:
            (committed,) = reader.committed([TopicPartition("racked", 0)], timeout=10)
        finally:
            reader.close()
        assert committed.offset == 10 + i, (g, committed)


def test_find_coordinator_names_the_leader_of_the_groups_offsets_partition(cluster):
    wait_for("the racked topic", lambda: partitions_seen(cluster.nodes[0].bootstrap, "racked"))
    offsets = _offsets_partitions(cluster)
    # Two groups coordinated by each broker, among names whose Java hash is not negative.
    groups = []
    for broker in (1, 2, 3):
        mine = (g for g in (f"orders-{i}" for i in range(10_000)) if java_string_hash(g) >= 0
                and offsets[kafka_offsets_partition(g, len(offsets))]["leader_id"] == broker)
        groups += [next(mine), next(mine)]
    _check_group_placement(cluster, groups, offsets)


def test_groups_with_a_negative_hash_are_placed_on_kafkas_partition(cluster):
    offsets = _offsets_partitions(cluster)
    count = len(offsets)
    # abs(h) + (h & 0x7fffffff) = 2^31: the two rules agree only where 2p = 2^31 mod count.
    groups = [g for g in (f"orders-{i}" for i in range(10_000)) if java_string_hash(g) < 0
              and (2 * kafka_offsets_partition(g, count) - (1 << 31)) % count != 0][:3]
    _check_group_placement(cluster, groups, offsets)


def test_a_group_whose_members_entered_through_different_brokers_shares_partitions_and_commits(cluster):
    create_everywhere(cluster, cluster.nodes[0], "shared", 4)
    members = [Consumer({"bootstrap.servers": n.bootstrap, "group.id": "across-brokers",
                         "auto.offset.reset": "earliest", "enable.auto.commit": False,
                         "heartbeat.interval.ms": 500, "session.timeout.ms": 6000,
                         "fetch.wait.max.ms": 100, **CLIENT_DEFAULTS})
               for n in cluster.nodes[:2]]
    received: list[list] = [[], []]
    try:
        for m in members:
            m.subscribe(["shared"])

        def poll_all():
            for i, m in enumerate(members):
                for msg in m.consume(num_messages=1000, timeout=0.1):
                    assert msg.error() is None or msg.error().code() == KafkaError._PARTITION_EOF, msg.error()
                    if msg.error() is None:
                        received[i].append(msg)

        def split():
            poll_all()
            owned = [{tp.partition for tp in m.assignment()} for m in members]
            return all(owned) and not owned[0] & owned[1] and owned[0] | owned[1] == {0, 1, 2, 3} and owned

        owned = wait_for("the two members to split the partitions", split, 60)
        reports = produce_all(producer(cluster.bootstrap), "shared",
                              [{"partition": i % 4, "value": str(i)} for i in range(400)])
        assert_all_delivered(reports)
        wait_for("every message consumed", lambda: poll_all() or sum(map(len, received)) >= 400, 60)
        assert [{tp.partition for tp in m.assignment()} for m in members] == owned, "no rebalance meanwhile"
        for i, m in enumerate(members):
            assert {msg.partition() for msg in received[i]} <= owned[i], i
            m.commit(asynchronous=False)
    finally:
        for m in members:
            m.close()
    values = sorted(int(msg.value()) for r in received for msg in r)
    assert values == list(range(400)), "every message once"
    ends = collections.Counter(r.partition for r in reports)
    # Read from the third broker, which neither member bootstrapped through.
    reader = consumer(cluster.nodes[2].bootstrap, **{"group.id": "across-brokers"})
    try:
        committed = reader.committed([TopicPartition("shared", p) for p in range(4)], timeout=10)
    finally:
        reader.close()
    assert {tp.partition: tp.offset for tp in committed} == {p: ends[p] for p in range(4)}


# ---- producer ids ------------------------------------------------------------------------------

def test_idempotent_producer_ids_from_every_broker_are_distinct_blocks(cluster):
    ids = {}
    for n in cluster.nodes:
        answers = exchange(n.bootstrap, *[build(InitProducerIdRequest, 4, transactional_id=None,
                                                transaction_timeout_ms=60_000, producer_id=-1, producer_epoch=-1)
                                          for _ in range(5)])
        assert all(a["error_code"] == 0 and a["producer_epoch"] == 0 for a in answers), answers
        ids[n.node_id] = [a["producer_id"] for a in answers]
        assert ids[n.node_id] == sorted(ids[n.node_id]) and all(i >= 0 for i in ids[n.node_id]), ids
    every = [i for per in ids.values() for i in per]
    assert len(set(every)) == 15, ids
    # Blocks: no broker hands out an id between two of another broker's.
    spans = sorted((min(per), max(per)) for per in ids.values())
    assert all(a[1] < b[0] for a, b in zip(spans, spans[1:])), ids


# ---- a node of another cluster -----------------------------------------------------------------

def test_a_node_formatted_for_another_cluster_logs_the_mismatch_itself(cluster):
    """A combined node and a broker-only node, each formatted with another cluster id and
    pointed at this cluster's controllers: each says in its own log that the controller belongs
    to another cluster, naming the cluster id it was formatted for, and neither is listed."""
    other = uuid.uuid4().hex[:22]
    combined = Node(4, "stranger")
    broker_only = Node(5, "stranger", roles="broker")
    for n in (combined, broker_only):
        assert format_storage(n.data_dir, other, n.node_id).returncode == 0
    combined.extra_args = ["--node-id", "4", "--controller-quorum-voters",
                           f"4@127.0.0.1:{combined.controller_port},{cluster.voters}",
                           "--broker-heartbeat-interval-ms", "500"]
    broker_only.extra_args = ["--node-id", "5", "--process-roles", "broker",
                              "--controller-quorum-voters", cluster.voters, "--broker-heartbeat-interval-ms", "500"]
    strangers = [combined, broker_only]
    try:
        for n in strangers:
            n.start(wait=False)
        for n in strangers:
            try:
                line = wait_for(f"node {n.node_id} to log the mismatch", lambda: next(
                    (x for x in n.current_log().splitlines() if "belongs to another cluster" in x), None), 30)
            except AssertionError as e:
                raise AssertionError(f"{e}\n{n.log_tail()}") from None
            assert f"cluster_id={other}" in line, line
        for n in cluster.nodes:
            assert sorted(b["node_id"] for b in raw_metadata(n.bootstrap)["brokers"]) == [1, 2, 3]
    finally:
        for n in strangers:
            if n.running():
                n.stop(signal.SIGKILL)
            n.remove()
