"""Several Sluice processes as one cluster: three combined nodes on 127.0.0.1 (`--cores 1`
each) form a controller quorum from their flags, spread a topic's partitions over all three,
take 100,000 keyed messages with acks=all through librdkafka on the right leaders and read them
back complete and in order; the metadata survives a full restart and the loss of the active
controller; a node formatted for another cluster is refused."""

from __future__ import annotations

import collections
import json
import signal
import subprocess
import time
import uuid

import pytest
from confluent_kafka import Producer, TopicPartition
from confluent_kafka.admin import NewTopic

from cluster import Cluster, Node, format_storage
from harness import CLIENT_DEFAULTS, SLUICE_BIN, admin, consumer, read_to_end, watermarks
from reference import java

MESSAGES = 100_000
KEYS = 1_000
PARTITIONS = 12


@pytest.fixture(scope="module")
def cluster(request):
    c = Cluster(3, name="cluster")
    failed_before = request.session.testsfailed
    try:
        c.start()
    except BaseException:
        print(c.log_tails())
        c.stop()
        raise
    yield c
    failed = request.session.testsfailed > failed_before
    if failed:
        print(c.log_tails())
    c.stop()
    for n in c.nodes:
        panics = [line for line in n.log_text().splitlines() if "panicked" in line]
        assert not panics, f"node {n.node_id} panicked:\n" + "\n".join(panics)
        if not failed:
            n.remove()


def metadata(bootstrap: str, topic: str | None = None):
    return admin(bootstrap).list_topics(topic=topic, timeout=10)


def wait_for(what: str, check, timeout: float = 20.0):
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if value:
            return value
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.1)


def wait_healthy(cluster, timeout: float = 30.0) -> None:
    """Every node registered and unfenced since its latest start, listed by every node, and
    every partition with a leader: what the next test starts from."""

    def healthy():
        if not all("broker state changed fenced=false" in n.current_log() for n in cluster.nodes):
            return False
        for n in cluster.nodes:
            md = metadata(n.bootstrap)
            if set(md.brokers) != {m.node_id for m in cluster.nodes}:
                return False
            if any(p.leader < 0 for t in md.topics.values() for p in t.partitions.values()):
                return False
        return True

    wait_for("the cluster to be whole again", healthy, timeout)


def create(bootstrap: str, name: str, partitions: int) -> None:
    client = admin(bootstrap)  # kept alive until the answer is in
    futures = client.create_topics(
        [NewTopic(name, num_partitions=partitions, replication_factor=1)], operation_timeout=10, request_timeout=20
    )
    futures[name].result(timeout=30)


def active_controller(cluster, timeout: float = 20.0) -> int:
    """The quorum leader, from DescribeQuorum (`sluice cluster --bootstrap-controller`), once
    there is one (after a restart the nodes serve their replayed metadata before they elect)."""

    def leader():
        for n in cluster.nodes:
            if not n.running():
                continue
            out = subprocess.run([str(SLUICE_BIN), "cluster", "--bootstrap-controller", f"127.0.0.1:{n.controller_port}"],
                                 capture_output=True, text=True, timeout=30)
            for line in out.stdout.splitlines():
                if line.startswith("LeaderId: ") and int(line.split()[1]) >= 0:
                    return int(line.split()[1])
        return None

    return wait_for("a quorum leader", leader, timeout)


def test_three_nodes_form_one_cluster_from_their_flags(cluster):
    want = {n.node_id: ("127.0.0.1", n.port) for n in cluster.nodes}
    for node in cluster.nodes:
        md = wait_for(
            f"node {node.node_id} to list every broker",
            lambda: (m := metadata(node.bootstrap)) and len(m.brokers) == 3 and m,
        )
        assert {b.id: (b.host, b.port) for b in md.brokers.values()} == want
        assert md.cluster_id == cluster.cluster_id
        # Each broker names itself as the controller clients send admin requests to (it
        # forwards them to the active one). Asked of exactly this node: librdkafka may send a
        # Metadata request to any broker it has learnt of.
        shown = subprocess.run([str(SLUICE_BIN), "cluster", "--bootstrap-server", node.bootstrap],
                               capture_output=True, text=True, timeout=30)
        assert f"Controller: {node.node_id}\n" in shown.stdout, shown.stdout + shown.stderr
    assert active_controller(cluster) in want


def test_a_topic_spreads_over_the_brokers_and_reads_back_complete_and_in_order(cluster):
    # Created through a node that is not the active controller, so the request is forwarded.
    controller = active_controller(cluster)
    entry = next(n for n in cluster.nodes if n.node_id != controller)
    create(entry.bootstrap, "spread", PARTITIONS)
    leaders = {}
    for node in cluster.nodes:
        md = wait_for(
            f"node {node.node_id} to list the topic",
            lambda: (m := metadata(node.bootstrap, "spread")) and m.topics["spread"].error is None
            and len(m.topics["spread"].partitions) == PARTITIONS and m,
        )
        seen = {p: meta.leader for p, meta in md.topics["spread"].partitions.items()}
        for p, meta in md.topics["spread"].partitions.items():
            assert meta.replicas == [meta.leader] and meta.isrs == [meta.leader], meta
        if leaders:
            assert seen == leaders, "every node names the same leaders"
        leaders = seen
    assert collections.Counter(leaders.values()) == {1: 4, 2: 4, 3: 4}, leaders

    producer = Producer({"bootstrap.servers": cluster.bootstrap, "acks": "all", "linger.ms": 5,
                         "enable.idempotence": True, **CLIENT_DEFAULTS})
    acked = {}
    failures = []

    def report(err, msg):
        if err is not None:
            failures.append(err)
        else:
            acked[int(msg.value())] = (msg.partition(), msg.offset())

    for i in range(MESSAGES):
        while True:
            try:
                producer.produce("spread", key=f"key-{i % KEYS}", value=str(i), on_delivery=report)
                break
            except BufferError:
                producer.poll(0.05)
        if i % 10_000 == 0:
            producer.poll(0)
    assert producer.flush(60) == 0
    assert not failures, failures[:5]
    assert len(acked) == MESSAGES

    # Each leader holds exactly its partitions' data.
    for node in cluster.nodes:
        held = {p for p in range(PARTITIONS) if (node.data_dir / f"spread-{p}").exists()}
        assert held == {p for p, leader in leaders.items() if leader == node.node_id}, node.node_id

    c = consumer(cluster.bootstrap)
    try:
        ends = {("spread", p): hi for p, (lo, hi) in watermarks(c, "spread", PARTITIONS).items()}
        assert sum(ends.values()) == MESSAGES
        c.assign([TopicPartition("spread", p, 0) for p in range(PARTITIONS)])
        messages = read_to_end(c, ends, timeout=120)
    finally:
        c.close()
    assert len(messages) == MESSAGES
    partition_of_key = {}
    last_value = {}
    next_offset = collections.defaultdict(int)
    for m in messages:
        key, value, p = m.key().decode(), int(m.value()), m.partition()
        assert m.offset() == next_offset[p], f"partition {p} skipped from {next_offset[p]} to {m.offset()}"
        next_offset[p] += 1
        assert acked[value] == (p, m.offset()), f"message {value} read at {(p, m.offset())}, acknowledged at {acked[value]}"
        assert partition_of_key.setdefault(key, p) == p, f"{key} in two partitions"
        assert last_value.get(key, -1) < value, f"{key} out of order"
        last_value[key] = value


def test_a_replication_factor_above_the_broker_count_is_refused_as_kafka_refuses_it(cluster):
    a = admin(cluster.nodes[0].bootstrap)
    futures = a.create_topics([NewTopic("four-copies", num_partitions=2, replication_factor=4)])
    with pytest.raises(Exception) as refused:
        futures["four-copies"].result(timeout=30)
    error = refused.value.args[0]
    # INVALID_REPLICATION_FACTOR, with Kafka's message.
    assert error.code() == 38 and "only 3 broker(s) are registered" in error.str(), error
    assert "four-copies" not in a.list_topics(timeout=10).topics


def test_the_metadata_survives_a_restart_of_every_node(cluster):
    create(cluster.nodes[0].bootstrap, "kept", 3)
    before = metadata(cluster.nodes[0].bootstrap, "kept").topics["kept"]
    leaders = {p: m.leader for p, m in before.partitions.items()}
    for n in cluster.nodes:
        n.stop_cleanly()
    cluster.start()
    wait_healthy(cluster)
    for node in cluster.nodes:
        md = wait_for(
            f"node {node.node_id} to list the topics again",
            lambda: (m := metadata(node.bootstrap)) and len(m.brokers) == 3
            and "kept" in m.topics and "spread" in m.topics and m,
        )
        assert {p: m.leader for p, m in md.topics["kept"].partitions.items()} == leaders
        assert len(md.topics["spread"].partitions) == PARTITIONS
    c = consumer(cluster.bootstrap)
    try:
        total = sum(hi for lo, hi in watermarks(c, "spread", PARTITIONS).values())
    finally:
        c.close()
    assert total == MESSAGES


def test_losing_the_active_controller_elects_another_and_creation_works_again(cluster):
    controller = active_controller(cluster)
    victim = cluster.node(controller)
    victim.kill()
    survivors = [n for n in cluster.nodes if n is not victim]
    started = time.monotonic()
    # A new controller answers: topic creation works again within seconds.
    wait_for("a topic to be created without the old controller", lambda: _try_create(survivors[0].bootstrap, "after-failover"), 30)
    elapsed = time.monotonic() - started
    assert active_controller(cluster) in {n.node_id for n in survivors}
    assert "spread" in metadata(survivors[1].bootstrap).topics, "nothing already created is lost"
    assert elapsed < 10, f"creation took {elapsed:.1f} s to work again"
    print(f"creation worked again {elapsed:.1f} s after the controller was killed")
    victim.start(wait=False)
    victim.wait_ready(wait_for_partitions=False)
    wait_healthy(cluster)


def _try_create(bootstrap: str, name: str) -> bool:
    try:
        create(bootstrap, name, 2)
        return True
    except Exception as e:
        if "already exists" in str(e).lower() or "TOPIC_ALREADY_EXISTS" in str(e):
            return True
        return False


def test_a_node_formatted_for_another_cluster_is_refused(cluster):
    stranger = Node(4, "stranger")
    other = uuid.uuid4().hex[:22]
    assert format_storage(stranger.data_dir, other, 4).returncode == 0
    # It names itself and node 1 as the voters: its vote requests reach node 1, which refuses
    # them for their cluster id.
    one = cluster.node(1)
    stranger.extra_args = ["--node-id", "4", "--controller-quorum-voters",
                           f"4@127.0.0.1:{stranger.controller_port},1@127.0.0.1:{one.controller_port}"]
    stranger.start(wait=False)
    try:
        wait_for("node 1 to refuse the stranger", lambda: "a node of another cluster" in one.current_log(), 20)
        assert len(metadata(one.bootstrap).brokers) == 3
    finally:
        stranger.stop(signal.SIGKILL)
        stranger.remove()


def test_storage_is_formatted_once_and_a_node_checks_it():
    node = Node(7, "formatting")
    try:
        first = format_storage(node.data_dir, "cluster-A", 7)
        assert first.returncode == 0, first.stderr
        again = format_storage(node.data_dir, "cluster-B", 7)
        assert again.returncode != 0 and "already formatted" in again.stderr, again.stderr
        props = (node.data_dir / "meta.properties").read_text()
        assert "cluster.id=cluster-A" in props and "node.id=7" in props and "version=1" in props
        # Started as another node id: refused, with the reason.
        voters = f"8@127.0.0.1:{node.controller_port}"
        run = subprocess.run([str(SLUICE_BIN), "--node-id", "8", "--data-dir", str(node.data_dir),
                              "--listeners", node.listeners(), "--controller-quorum-voters", voters, "--cores", "1"],
                             capture_output=True, text=True, timeout=30)
        assert run.returncode != 0 and "belongs to node 7" in run.stderr, run.stderr
        # A cluster node on an unformatted directory: refused, saying how to format it.
        fresh = Node(9, "unformatted")
        run = subprocess.run([str(SLUICE_BIN), "--node-id", "9", "--data-dir", str(fresh.data_dir),
                              "--listeners", fresh.listeners(),
                              "--controller-quorum-voters", f"9@127.0.0.1:{fresh.controller_port}", "--cores", "1"],
                             capture_output=True, text=True, timeout=30)
        assert run.returncode != 0 and "sluice storage format" in run.stderr, run.stderr
        fresh.remove()
    finally:
        node.remove()


# ---- Kafka's Java client and tools against the cluster ------------------------------------------

def test_the_java_client_produces_keyed_messages_to_the_right_leaders(cluster):
    create(cluster.nodes[0].bootstrap, "java-spread", PARTITIONS)
    lines = "".join(f"key-{i % KEYS}:{i}\n" for i in range(MESSAGES))
    done = java("org.apache.kafka.tools.ConsoleProducer", "--bootstrap-server", cluster.bootstrap,
                "--topic", "java-spread", "--property", "parse.key=true", "--property", "key.separator=:",
                "--producer-property", "acks=all", "--producer-property", "linger.ms=5",
                "--producer-property", "batch.size=65536", stdin=lines)
    assert done.returncode == 0, done.stderr[-3000:]
    c = consumer(cluster.bootstrap)
    try:
        ends = {("java-spread", p): hi for p, (lo, hi) in watermarks(c, "java-spread", PARTITIONS).items()}
        assert sum(ends.values()) == MESSAGES, ends
        c.assign([TopicPartition("java-spread", p, 0) for p in range(PARTITIONS)])
        messages = read_to_end(c, ends, timeout=120)
    finally:
        c.close()
    values = sorted(int(m.value()) for m in messages)
    assert values == list(range(MESSAGES)), "every message once"
    partition_of_key, last = {}, {}
    for m in messages:
        key, value = m.key().decode(), int(m.value())
        assert partition_of_key.setdefault(key, m.partition()) == m.partition(), f"{key} in two partitions"
        assert last.get(key, -1) < value, f"{key} out of order"
        last[key] = value
    md = metadata(cluster.bootstrap, "java-spread")
    leaders = collections.Counter(p.leader for p in md.topics["java-spread"].partitions.values())
    assert leaders == {1: 4, 2: 4, 3: 4}, leaders


def test_kafkas_tools_describe_the_cluster(cluster):
    ids = {n.node_id for n in cluster.nodes}
    topics = java("org.apache.kafka.tools.TopicCommand", "--bootstrap-server", cluster.nodes[1].bootstrap,
                  "--describe", "--topic", "spread")
    assert topics.returncode == 0, topics.stderr[-2000:]
    rows = [line for line in topics.stdout.splitlines() if "\tPartition: " in line or line.strip().startswith("Topic: spread\tPartition")]
    assert len(rows) == PARTITIONS, topics.stdout
    assert "PartitionCount: 12" in topics.stdout, topics.stdout
    described_leaders = collections.Counter(int(r.split("Leader: ")[1].split()[0]) for r in rows)
    assert described_leaders == {1: 4, 2: 4, 3: 4}, topics.stdout

    cluster_id = java("org.apache.kafka.tools.ClusterTool", "cluster-id", "--bootstrap-server", cluster.nodes[2].bootstrap)
    assert cluster_id.returncode == 0 and f"Cluster ID: {cluster.cluster_id}" in cluster_id.stdout, cluster_id

    versions = java("org.apache.kafka.tools.BrokerApiVersionsCommand", "--bootstrap-server", cluster.bootstrap)
    assert versions.returncode == 0, versions.stderr[-2000:]
    for n in cluster.nodes:
        assert f"127.0.0.1:{n.port} (id: {n.node_id} rack: null" in versions.stdout, versions.stdout[:2000]

    controller = cluster.nodes[0]
    status = java("org.apache.kafka.tools.MetadataQuorumCommand", "--bootstrap-controller",
                  f"127.0.0.1:{controller.controller_port}", "describe", "--status")
    assert status.returncode == 0, status.stderr[-2000:]
    fields = {k.strip(): v.strip() for k, v in
              (line.split(":", 1) for line in status.stdout.splitlines() if ":" in line)}
    assert fields["ClusterId"] == cluster.cluster_id, status.stdout
    assert int(fields["LeaderId"]) in ids, status.stdout
    assert int(fields["LeaderEpoch"]) >= 1, status.stdout
    assert int(fields["HighWatermark"]) > 0, status.stdout
    voters = json.loads(fields["CurrentVoters"])
    assert sorted(v["id"] for v in voters) == sorted(ids), status.stdout
    for v in voters:
        assert v["endpoints"] == [f"CONTROLLER://127.0.0.1:{cluster.node(v['id']).controller_port}"], status.stdout
    assert fields["CurrentObservers"] == "[]", status.stdout
    replication = java("org.apache.kafka.tools.MetadataQuorumCommand", "--bootstrap-controller",
                       f"127.0.0.1:{controller.controller_port}", "describe", "--replication")
    assert replication.returncode == 0, replication.stderr[-2000:]
    rows = [line.split() for line in replication.stdout.splitlines() if line[:1].isdigit()]
    assert sorted(int(r[0]) for r in rows) == sorted(ids), replication.stdout
    assert [r[-1] for r in rows].count("Leader") == 1, replication.stdout
    assert all(r[-1] in ("Leader", "Follower") for r in rows), replication.stdout
    high_watermark = int(fields["HighWatermark"])
    assert all(int(r[2]) >= high_watermark - 1 for r in rows), replication.stdout
    # Through a broker's listener, which asks the quorum leader, as Kafka's brokers forward it
    # to the controller.
    for n in cluster.nodes:
        via = java("org.apache.kafka.tools.MetadataQuorumCommand", "--bootstrap-server", n.bootstrap,
                   "describe", "--status")
        assert via.returncode == 0, via.stderr[-2000:]
        got = {k.strip(): v.strip() for k, v in
               (line.split(":", 1) for line in via.stdout.splitlines() if ":" in line)}
        assert int(got["LeaderId"]) in ids, via.stdout
        assert sorted(v["id"] for v in json.loads(got["CurrentVoters"])) == sorted(ids), via.stdout
        assert int(got["HighWatermark"]) >= high_watermark, via.stdout


def test_sluice_cluster_shows_the_brokers_and_the_quorum(cluster):
    brokers = subprocess.run([str(SLUICE_BIN), "cluster", "--bootstrap-server", cluster.nodes[0].bootstrap],
                             capture_output=True, text=True, timeout=30)
    assert brokers.returncode == 0, brokers.stderr
    assert f"Cluster ID: {cluster.cluster_id}" in brokers.stdout
    assert "Brokers: 3" in brokers.stdout, brokers.stdout
    for n in cluster.nodes:
        assert f"  {n.node_id}\t127.0.0.1:{n.port}" in brokers.stdout, brokers.stdout
    quorum = subprocess.run([str(SLUICE_BIN), "cluster", "--bootstrap-controller",
                             f"127.0.0.1:{cluster.nodes[1].controller_port}"],
                            capture_output=True, text=True, timeout=30)
    assert quorum.returncode == 0, quorum.stderr
    lines = dict(line.split(": ", 1) for line in quorum.stdout.splitlines() if ": " in line)
    assert int(lines["LeaderId"]) in {1, 2, 3}, quorum.stdout
    assert int(lines["HighWatermark"]) > 0
    assert lines["CurrentVoters"] == "[1, 2, 3]", quorum.stdout
    rows = [line.split("\t") for line in quorum.stdout.splitlines() if line[:1].isdigit()]
    assert sorted(int(r[0]) for r in rows) == [1, 2, 3]
    assert [r[3] for r in rows].count("Leader") == 1, quorum.stdout
    through = subprocess.run([str(SLUICE_BIN), "cluster", "--quorum", "--bootstrap-server", cluster.nodes[2].bootstrap],
                             capture_output=True, text=True, timeout=30)
    assert through.returncode == 0, through.stderr
    got = dict(line.split(": ", 1) for line in through.stdout.splitlines() if ": " in line)
    assert got["CurrentVoters"] == "[1, 2, 3]" and int(got["LeaderId"]) in {1, 2, 3}, through.stdout


def test_without_a_majority_live_leaders_serve_and_creation_fails_clearly(cluster):
    """Two of the three nodes (and so two of the three controllers) stopped: the partitions the
    third one leads keep taking and serving records; CreateTopics fails within seconds with a
    retriable error rather than hanging; with the two back, creation works again."""
    from confluent_kafka import KafkaException

    survivor = cluster.node(1)
    md = metadata(survivor.bootstrap, "spread")
    own = sorted(p for p, m in md.topics["spread"].partitions.items() if m.leader == survivor.node_id)
    assert own, md.topics["spread"].partitions
    c = consumer(survivor.bootstrap)
    try:
        before = {p: hi for p, (lo, hi) in watermarks(c, "spread", PARTITIONS).items()}
    finally:
        c.close()
    stopped = [n for n in cluster.nodes if n is not survivor]
    for n in stopped:
        n.stop_cleanly()
    try:
        producer = Producer({"bootstrap.servers": survivor.bootstrap, "acks": "all", **CLIENT_DEFAULTS})
        acked = []
        for i in range(200):
            producer.produce("spread", partition=own[i % len(own)], value=f"alone-{i}",
                             on_delivery=lambda err, msg: acked.append(err is None))
        assert producer.flush(30) == 0
        assert acked.count(True) == 200, acked.count(False)
        c = consumer(survivor.bootstrap)
        try:
            ends = {("spread", p): before[p] + sum(1 for i in range(200) if own[i % len(own)] == p) for p in own}
            c.assign([TopicPartition("spread", p, before[p]) for p in own])
            fresh = read_to_end(c, ends, timeout=60)
        finally:
            c.close()
        assert sorted(m.value().decode() for m in fresh) == sorted(f"alone-{i}" for i in range(200))
        started = time.monotonic()
        client = admin(survivor.bootstrap)
        futures = client.create_topics(
            [NewTopic("no-quorum", num_partitions=1, replication_factor=1)], operation_timeout=5, request_timeout=30)
        with pytest.raises(KafkaException) as refused:
            futures["no-quorum"].result(timeout=60)
        elapsed = time.monotonic() - started
        error = refused.value.args[0]
        assert error.retriable() or "timed out" in error.str().lower(), error
        assert elapsed < 40, f"CreateTopics took {elapsed:.1f} s to fail"
    finally:
        for n in stopped:
            n.start(wait=False)
        for n in stopped:
            n.wait_ready(wait_for_partitions=False)
    wait_for("creation to work again", lambda: _try_create(survivor.bootstrap, "quorum-back"), 30)
    wait_healthy(cluster)


def test_a_broker_that_stops_heartbeating_is_fenced_and_registers_again_when_resumed(cluster):
    """SIGSTOP stops node 3's heartbeats: once its session (3 s here) is over the active
    controller fences it, Metadata stops listing it and its partitions (one replica each) have
    no leader; SIGCONT, and it is listed again and leads them again."""
    import os

    victim = cluster.node(3)
    observer = cluster.node(1)
    before = metadata(observer.bootstrap, "spread").topics["spread"].partitions
    its = sorted(p for p, m in before.items() if m.replicas == [victim.node_id])
    assert its, before
    os.kill(victim.pid, signal.SIGSTOP)
    try:
        started = time.monotonic()
        wait_for("the stopped broker to leave Metadata",
                 lambda: set(metadata(observer.bootstrap).brokers) == {1, 2}, 30)
        fenced_after = time.monotonic() - started
        md = metadata(observer.bootstrap, "spread").topics["spread"].partitions
        assert all(md[p].leader == -1 for p in its), {p: md[p].leader for p in its}
        assert all(md[p].leader == before[p].leader for p in md if p not in its)
    finally:
        os.kill(victim.pid, signal.SIGCONT)
    wait_for("the resumed broker to be listed again", lambda: set(metadata(observer.bootstrap).brokers) == {1, 2, 3}, 30)
    wait_for("it to lead its partitions again", lambda: all(
        metadata(observer.bootstrap, "spread").topics["spread"].partitions[p].leader == victim.node_id for p in its), 30)
    wait_healthy(cluster)
    print(f"fenced {fenced_after:.1f} s after SIGSTOP (broker.session.timeout.ms=3000)")


def test_requests_for_a_partition_led_elsewhere_name_its_leader(cluster):
    """KIP-951: Produce (v10+) and Fetch (v12+) for a partition another broker leads answer
    NOT_LEADER_OR_FOLLOWER with that leader and its epoch, and (Produce v10+, Fetch v16+) its
    endpoint, so clients move without a metadata round trip. Group requests sent to a broker
    that is not the group's coordinator answer NOT_COORDINATOR, as Kafka's do."""
    from kafka.protocol.consumer.fetch import FetchRequest
    from kafka.protocol.consumer.group import HeartbeatRequest
    from kafka.protocol.metadata.metadata import MetadataRequest
    from kafka.protocol.producer.produce import ProduceRequest
    from wire import Pipeline, batch, build

    asked = cluster.node(1)
    pipe = Pipeline(asked.bootstrap)
    pipe.send(build(MetadataRequest, 12, topics=[{"topic_id": None, "name": "spread"}],
                    allow_auto_topic_creation=False, include_topic_authorized_operations=False))
    (md,) = pipe.responses()
    (topic,) = md["topics"]
    elsewhere = sorted((p["partition_index"], p["leader_id"], p["leader_epoch"])
                       for p in topic["partitions"] if p["leader_id"] not in (-1, asked.node_id))
    assert elsewhere, topic["partitions"]
    partition, leader, epoch = elsewhere[0]
    port = cluster.node(leader).port
    pipe.send(build(ProduceRequest, 11, transactional_id=None, acks=-1, timeout_ms=10_000, topic_data=[{
        "name": "spread", "partition_data": [{"index": partition, "records": batch([b"misdirected"])}]}]))
    pipe.send(build(FetchRequest, 16, replica_id=-1, max_wait_ms=0, min_bytes=0, max_bytes=1 << 20,
                    isolation_level=0, session_id=0, session_epoch=-1, topics=[{
                        "topic_id": topic["topic_id"], "partitions": [{
                            "partition": partition, "current_leader_epoch": -1, "fetch_offset": 0,
                            "last_fetched_epoch": -1, "log_start_offset": -1,
                            "partition_max_bytes": 1 << 20}]}],
                    forgotten_topics_data=[], rack_id=""))
    produced, fetched = pipe.responses()
    (p,) = produced["responses"][0]["partition_responses"]
    assert p["error_code"] == 6, p
    assert (p["current_leader"]["leader_id"], p["current_leader"]["leader_epoch"]) == (leader, epoch), p
    assert [(e["node_id"], e["host"], e["port"]) for e in produced["node_endpoints"]] == [
        (leader, "127.0.0.1", port)], produced
    (f,) = fetched["responses"][0]["partitions"]
    assert f["error_code"] == 6, f
    assert (f["current_leader"]["leader_id"], f["current_leader"]["leader_epoch"]) == (leader, epoch), f
    assert [(e["node_id"], e["host"], e["port"]) for e in fetched["node_endpoints"]] == [
        (leader, "127.0.0.1", port)], fetched
    # A group whose offsets partition another broker leads: NOT_COORDINATOR (16).
    # The first FindCoordinator creates the offsets topic if no group has asked yet.
    from kafka.protocol.metadata.find_coordinator import FindCoordinatorRequest
    pipe.send(build(FindCoordinatorRequest, 4, key_type=0, coordinator_keys=["probe"]))
    pipe.responses()
    offsets = wait_for("the offsets topic with every partition led", lambda: (
        t := metadata(asked.bootstrap, "__consumer_offsets").topics["__consumer_offsets"]).error is None
        and t.partitions and all(p.leader >= 0 for p in t.partitions.values()) and t.partitions)
    pipe.close()
    # Failovers earlier in the module may have left one broker leading every offsets
    # partition (they have three replicas): ask a broker that does not lead the group's.
    group, other = next((g, n) for g in (f"group-{i}" for i in range(10_000)) for n in cluster.brokers
                        if offsets[_offsets_partition(g, len(offsets))].leader not in (-1, n.node_id))
    pipe = Pipeline(other.bootstrap)
    pipe.send(build(HeartbeatRequest, 4, group_id=group, generation_id=1, member_id="m", group_instance_id=None))
    (hb,) = pipe.responses()
    pipe.close()
    assert hb["error_code"] == 16, hb


def _offsets_partition(group: str, partitions: int) -> int:
    """Kafka's partition for a group: its Java String.hashCode, sign bit cleared, modulo the
    partitions (ASCII names: one UTF-16 unit per character)."""
    h = 0
    for ch in group:
        h = (31 * h + ord(ch)) & 0xFFFFFFFF
    return (h & 0x7FFFFFFF) % partitions
