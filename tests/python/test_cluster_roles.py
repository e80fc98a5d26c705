"""Controllers and brokers as separate processes: three controller-only nodes (the quorum) and
two broker-only nodes (raft observers, added as learners when they register) on 127.0.0.1,
`--cores 1` each. Clients see only the brokers; the quorum lists the brokers as observers;
killing the active controller elects another and loses nothing; a broker stopped with SIGTERM
hands its leaderships over before it exits (controlled shutdown); a new broker joins the
running cluster under load and new topics are placed on it."""

from __future__ import annotations

import collections
import re
import subprocess
import threading
import time

import pytest
from confluent_kafka import Producer, TopicPartition

from cluster import Cluster
from harness import CLIENT_DEFAULTS, SLUICE_BIN, consumer, read_to_end
from test_cluster import create, metadata, wait_for

CONTROLLERS = 3
BROKERS = 2


@pytest.fixture(scope="module")
def cluster(request):
    c = Cluster(CONTROLLERS, name="roles", brokers=BROKERS)
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


def describe_quorum(port: int) -> dict:
    """`sluice cluster --bootstrap-controller`: its `Key: value` lines and its replica rows
    (node id -> (log end offset, lag, status))."""
    out = subprocess.run([str(SLUICE_BIN), "cluster", "--bootstrap-controller", f"127.0.0.1:{port}"],
                         capture_output=True, text=True, timeout=30)
    assert out.returncode == 0, out.stderr
    lines = dict(line.split(": ", 1) for line in out.stdout.splitlines() if ": " in line)
    rows = {}
    for line in out.stdout.splitlines():
        if line[:1].isdigit():
            node, leo, lag, status = line.split("\t")
            rows[int(node)] = (int(leo), lag, status)
    lines["rows"] = rows
    return lines


def active_controller(cluster) -> int:
    def leader():
        for n in cluster.controllers:
            if n.running():
                try:
                    leader = int(describe_quorum(n.controller_port)["LeaderId"])
                except (AssertionError, KeyError, subprocess.TimeoutExpired):
                    continue
                if leader >= 0:
                    return leader
        return None

    return wait_for("a quorum leader", leader, 30)


def broker_ids(cluster) -> set[int]:
    return {n.node_id for n in cluster.brokers if n.running()}


def wait_brokers_listed(cluster, want: set[int], timeout: float = 30.0) -> None:
    wait_for(f"every broker to list brokers {sorted(want)}", lambda: all(
        set(metadata(n.bootstrap).brokers) == want for n in cluster.brokers if n.running()), timeout)


def produce_keyed(bootstrap: str, topic: str, count: int, prefix: str) -> dict[int, list[str]]:
    """Produces `count` keyed messages with acks=all; returns what was acknowledged, per
    partition, in order."""
    acked = collections.defaultdict(list)
    errors = []

    def done(err, msg):
        if err is None:
            acked[msg.partition()].append(msg.value().decode())
        else:
            errors.append(err)

    p = Producer({"bootstrap.servers": bootstrap, "acks": "all", "linger.ms": 5, **CLIENT_DEFAULTS})
    for i in range(count):
        p.produce(topic, key=f"k{i % 97}", value=f"{prefix}-{i}", on_delivery=done)
        if i % 1000 == 0:
            p.poll(0)
    assert p.flush(60) == 0
    assert not errors, errors[:3]
    return acked


def read_back(bootstrap: str, topic: str, ends: dict[int, int]) -> dict[int, list[str]]:
    c = consumer(bootstrap)
    try:
        c.assign([TopicPartition(topic, p, 0) for p in ends])
        got = read_to_end(c, {(topic, p): end for p, end in ends.items()}, timeout=60)
    finally:
        c.close()
    out = collections.defaultdict(list)
    for m in got:
        out[m.partition()].append(m.value().decode())
    return out


def test_clients_see_only_the_brokers_and_the_quorum_lists_them_as_observers(cluster):
    brokers = {n.node_id: n for n in cluster.brokers}
    wait_brokers_listed(cluster, set(brokers))
    for n in cluster.brokers:
        md = metadata(n.bootstrap)
        assert {b.id: (b.host, b.port) for b in md.brokers.values()} == {
            i: ("127.0.0.1", b.port) for i, b in brokers.items()}
        assert md.cluster_id == cluster.cluster_id
    leader = active_controller(cluster)
    assert leader in {n.node_id for n in cluster.controllers}

    def observed():
        q = describe_quorum(cluster.node(leader).controller_port)
        return q if q["CurrentObservers"] == "[4, 5]" and all(
            q["rows"].get(i, (0, "", ""))[2] == "Observer" for i in brokers) else None

    q = wait_for("the brokers listed as observers", observed)
    assert q["CurrentVoters"] == "[1, 2, 3]", q
    # Observers replicate the log: their log end offsets reach the high watermark.
    hw = int(q["HighWatermark"])
    assert all(q["rows"][i][0] > 0 for i in brokers), q["rows"]
    wait_for("the observers to catch up", lambda: all(
        describe_quorum(cluster.node(leader).controller_port)["rows"][i][0] >= hw for i in brokers))
    # A controller-only node serves no Kafka clients.
    for n in cluster.controllers:
        assert "serving the Kafka protocol" not in n.log_text()


def test_topics_spread_over_the_brokers_only_and_read_back_in_order(cluster):
    create(cluster.brokers[0].bootstrap, "roles-spread", 6)
    md = wait_for("the topic on every broker", lambda: all(
        len(metadata(n.bootstrap, "roles-spread").topics["roles-spread"].partitions) == 6 for n in cluster.brokers)
        and metadata(cluster.brokers[1].bootstrap, "roles-spread"))
    leaders = collections.Counter(p.leader for p in md.topics["roles-spread"].partitions.values())
    assert leaders == {4: 3, 5: 3}, leaders
    acked = produce_keyed(cluster.bootstrap, "roles-spread", 20_000, "spread")
    assert sum(len(v) for v in acked.values()) == 20_000
    got = read_back(cluster.bootstrap, "roles-spread", {p: len(v) for p, v in acked.items()})
    assert got == acked


def test_killing_the_active_controller_elects_another_and_loses_nothing(cluster):
    victim = cluster.node(active_controller(cluster))
    before = metadata(cluster.brokers[0].bootstrap).topics
    victim.kill()
    started = time.monotonic()

    def created():
        try:
            create(cluster.brokers[1].bootstrap, "after-controller-loss", 2)
            return True
        except Exception as e:
            return "already exists" in str(e).lower()

    wait_for("creation to work without the old controller", created, 30)
    elapsed = time.monotonic() - started
    print(f"creation worked again {elapsed:.1f} s after the active controller was killed")
    assert elapsed < 15, f"creation took {elapsed:.1f} s to work again"
    new = active_controller(cluster)
    assert new != victim.node_id
    after = metadata(cluster.brokers[0].bootstrap).topics
    for name, t in before.items():
        assert name in after and len(after[name].partitions) == len(t.partitions), name
    # The brokers kept their sessions with the new controller.
    wait_brokers_listed(cluster, broker_ids(cluster))
    victim.start(wait=False)
    victim.wait_ready()
    wait_for("the restarted controller to follow", lambda: int(
        describe_quorum(victim.controller_port)["LeaderId"]) == new)


def test_sigterm_hands_a_brokers_leaderships_over_before_it_stops(cluster):
    """Controlled shutdown: the broker asks the controller to move its leaderships (here one
    replica each, so they have no leader until it returns) and fence it; Metadata shows that
    at once, not after the session timeout; restarted, it leads them again, data intact."""
    victim, other = cluster.node(5), cluster.node(4)
    parts = metadata(other.bootstrap, "roles-spread").topics["roles-spread"].partitions
    its = sorted(p for p, m in parts.items() if m.leader == victim.node_id)
    assert its, parts
    c = consumer(other.bootstrap)
    try:
        ends = {p: c.get_watermark_offsets(TopicPartition("roles-spread", p), timeout=10, cached=False)[1]
                for p in parts}
    finally:
        c.close()
    victim.stop_cleanly()
    log = victim.current_log()
    assert "controlled shutdown: leaderships handed over" in log, victim.log_tail()
    # Handed over before the process exited: the survivor lists it no more, right away.
    md = metadata(other.bootstrap, "roles-spread")
    assert set(md.brokers) == {other.node_id}, md.brokers
    assert all(md.topics["roles-spread"].partitions[p].leader == -1 for p in its)
    took = int(re.search(r"took_ms=(\d+)", log).group(1))
    print(f"controlled shutdown took {took} ms")
    victim.start()
    wait_brokers_listed(cluster, {4, 5})
    # It noted its broker epoch at the clean shutdown, so it registered again at once as the
    # same broker rather than waiting out its old session (DUPLICATE_BROKER_REGISTRATION).
    restarted = victim.current_log()
    previous = re.search(r"registered with the controller broker_epoch=\d+ previous_broker_epoch=(-?\d+)", restarted)
    assert previous and int(previous.group(1)) >= 0, victim.log_tail()
    assert "refused the registration" not in restarted, victim.log_tail()
    wait_for("it to lead its partitions again", lambda: all(
        metadata(other.bootstrap, "roles-spread").topics["roles-spread"].partitions[p].leader == victim.node_id
        for p in its))
    got = read_back(cluster.bootstrap, "roles-spread", ends)
    assert {p: len(v) for p, v in got.items() if v} == {p: e for p, e in ends.items() if e}


def test_a_new_broker_joins_the_running_cluster_under_load(cluster):
    """A sixth node, formatted for this cluster, starts while a producer writes to an existing
    topic: it registers, becomes an observer of the quorum, and new topics are placed on it;
    the producer's records all read back."""
    stop = threading.Event()
    acked = collections.defaultdict(list)
    failures = []

    def load():
        def done(err, msg):
            if err is None:
                acked[msg.partition()].append(msg.value().decode())
            else:
                failures.append(err)
        p = Producer({"bootstrap.servers": cluster.bootstrap, "acks": "all", "linger.ms": 5, **CLIENT_DEFAULTS})
        i = 0
        while not stop.is_set():
            p.produce("roles-spread", key=f"k{i % 97}", value=f"load-{i}", on_delivery=done)
            i += 1
            if i % 100 == 0:
                p.poll(0.01)
        p.flush(60)

    c = consumer(cluster.brokers[0].bootstrap)
    try:
        starts = {p: c.get_watermark_offsets(TopicPartition("roles-spread", p), timeout=10, cached=False)[1]
                  for p in range(6)}
    finally:
        c.close()
    loader = threading.Thread(target=load)
    loader.start()
    try:
        time.sleep(1)
        new = cluster.add_broker()
        new.start(wait=False)
        new.wait_ready(wait_for_partitions=False)
        wait_brokers_listed(cluster, {4, 5, new.node_id})
        leader = active_controller(cluster)
        wait_for("the new broker to be an observer", lambda: describe_quorum(
            cluster.node(leader).controller_port)["CurrentObservers"] == f"[4, 5, {new.node_id}]")
        create(new.bootstrap, "after-join", 6)
        md = wait_for("the new topic everywhere", lambda: all(
            len(metadata(n.bootstrap, "after-join").topics["after-join"].partitions) == 6 for n in cluster.brokers)
            and metadata(new.bootstrap, "after-join"))
        leaders = collections.Counter(p.leader for p in md.topics["after-join"].partitions.values())
        assert leaders == {4: 2, 5: 2, new.node_id: 2}, leaders
        time.sleep(1)
    finally:
        stop.set()
        loader.join(90)
    assert not failures, failures[:3]
    total = sum(len(v) for v in acked.values())
    assert total > 1000, total
    ends = {p: starts[p] + len(acked[p]) for p in range(6)}
    got = read_back(cluster.bootstrap, "roles-spread", ends)
    assert {p: v[starts[p]:] for p, v in got.items()} == {p: acked[p] for p in range(6)}
    print(f"{total} records produced while broker {new.node_id} joined")
    joined = produce_keyed(cluster.bootstrap, "after-join", 6_000, "joined")
    assert len(joined[next(p for p, m in md.topics["after-join"].partitions.items()
                           if m.leader == new.node_id)]) > 0
    assert read_back(new.bootstrap, "after-join", {p: len(v) for p, v in joined.items()}) == joined
