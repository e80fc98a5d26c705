"""A three-node cluster secured end to end, as Kafka's own security guide sets one up: clients on
a `SASL_SSL` listener (CLIENT), the brokers replicating over a second `SASL_SSL` listener
(INTERNAL, `inter.broker.listener.name`), the controller quorum on a `SASL_SSL` CONTROLLER
listener, each node logging in to the others with SASL PLAIN as `User:broker`, ACLs enforced.

What must hold: replication runs over the INTERNAL listener (every partition's ISR is whole),
clients are told the CLIENT listener's addresses and other brokers the INTERNAL ones, a leader
killed with SIGKILL loses nothing acknowledged, a node with the wrong inter-node password never
joins, and a principal without CLUSTER_ACTION cannot speak to the controllers."""

from __future__ import annotations

import collections
import tempfile
import time
from pathlib import Path

import pytest
from confluent_kafka import TopicPartition
from confluent_kafka.admin import NewTopic

import certs as certs_mod
from cluster import Cluster, running, wait_for
from harness import (TEST_DIR, admin, assert_all_delivered, consumer, free_port, produce_all,
                     producer, read_to_end)
from reference import java

AUTHORIZER = "org.apache.kafka.metadata.authorizer.StandardAuthorizer"
NODE_PW = "node-Pw-5e1f"
ADMIN_PW = "admin-Pw-c08a"
ALICE_PW = "alice-Pw-77d2"
TOPIC = "secured"
PARTITIONS = 3


def jaas(node_password: str = NODE_PW) -> str:
    """One PLAIN entry for every listener: the users this node accepts, and (`username`,
    `password`) its own login to the other nodes."""
    return ('org.apache.kafka.common.security.plain.PlainLoginModule required '
            f'username="broker" password="{node_password}" user_broker="{NODE_PW}" '
            f'user_admin="{ADMIN_PW}" user_alice="{ALICE_PW}";')


def node_args(certs, node_password: str = NODE_PW) -> list[str]:
    args = ["--listener-security-protocol-map", "CLIENT:SASL_SSL,INTERNAL:SASL_SSL,CONTROLLER:SASL_SSL",
            "--ssl-keystore-location", str(certs.broker_keystore),
            "--ssl-truststore-location", str(certs.ca),
            "--sasl-enabled-mechanisms", "PLAIN",
            "--connection-failed-authentication-delay-ms", "200",
            # Sessions of 4 s: the followers' links to their leaders are renewed while they
            # replicate (KIP-368), and the clients log in again on theirs.
            "--override", "connections.max.reauth.ms=4000",
            "--override", "inter.broker.listener.name=INTERNAL",
            "--override", "sasl.mechanism.inter.broker.protocol=PLAIN",
            "--override", "sasl.mechanism.controller.protocol=PLAIN",
            "--override", f"authorizer.class.name={AUTHORIZER}",
            "--override", "super.users=User:broker;User:admin"]
    for listener in ("client", "internal", "controller"):
        args += ["--override", f"listener.name.{listener}.plain.sasl.jaas.config={jaas(node_password)}"]
    return args


def client(certs, user: str = "admin", password: str = ADMIN_PW) -> dict:
    return {"security.protocol": "SASL_SSL", "ssl.ca.location": str(certs.ca),
            "sasl.mechanism": "PLAIN", "sasl.username": user, "sasl.password": password}


def secure(c: Cluster, certs) -> None:
    for n in c.nodes:
        n.listener_name = "CLIENT"
        n.client_config = client(certs)
        n.internal_port = free_port()


@pytest.fixture(scope="module")
def certs():
    return certs_mod.make(Path(tempfile.mkdtemp(prefix="pytest-cluster-certs-", dir=TEST_DIR)))


@pytest.fixture(scope="module")
def cluster(request, certs):
    c = Cluster(nodes=3, name="secured", extra_args=node_args(certs))
    secure(c, certs)

    def ready():
        md = admin(c.bootstrap, **client(certs)).list_topics(timeout=5)
        return len(md.brokers) == 3

    yield from running(request, c, "three brokers registered over SASL_SSL", ready, timeout=60)


def isr_sizes(a, topic: str) -> dict[int, int]:
    md = a.list_topics(topic, timeout=10).topics[topic]
    return {p: len(pm.isrs) for p, pm in md.partitions.items()}


def leaders(a, topic: str) -> dict[int, int]:
    md = a.list_topics(topic, timeout=10).topics[topic]
    return {p: pm.leader for p, pm in md.partitions.items()}


def test_clients_and_brokers_are_each_told_their_own_listener(cluster, certs):
    md = admin(cluster.bootstrap, **client(certs)).list_topics(timeout=10)
    assert sorted((b.host, b.port) for b in md.brokers.values()) == \
        sorted(("127.0.0.1", n.port) for n in cluster.nodes)
    # A client that comes in on the INTERNAL listener (as the other brokers do) is told the
    # INTERNAL addresses, as Kafka answers.
    internal = ",".join(f"127.0.0.1:{n.internal_port}" for n in cluster.nodes)
    md = admin(internal, **client(certs)).list_topics(timeout=10)
    assert sorted(b.port for b in md.brokers.values()) == sorted(n.internal_port for n in cluster.nodes)


def test_replication_over_sasl_ssl_loses_nothing_when_a_leader_is_killed(cluster, certs):
    a = admin(cluster.bootstrap, **client(certs))
    for f in a.create_topics([NewTopic(TOPIC, PARTITIONS, 3, config={"min.insync.replicas": "2"})]).values():
        f.result(30)
    # Followers fetch from their leaders over INTERNAL, logged in as User:broker: every ISR
    # holds all three replicas.
    wait_for("whole ISRs", lambda: set(isr_sizes(a, TOPIC).values()) == {3}, timeout=30)
    p = producer(cluster.bootstrap, **client(certs), **{"enable.idempotence": True})
    messages = [{"key": f"k{i}".encode(), "value": f"before-{i}".encode()} for i in range(300)]
    reports = produce_all(p, TOPIC, messages)
    assert_all_delivered(reports)

    victim = cluster.node(leaders(a, TOPIC)[0])
    victim.kill()
    survivors = [n for n in cluster.nodes if n is not victim]
    bootstrap = ",".join(n.bootstrap for n in survivors)
    a = admin(bootstrap, **client(certs))
    wait_for("new leaders", lambda: all(l not in (victim.node_id, -1) for l in leaders(a, TOPIC).values()),
             timeout=30)
    second = [{"key": f"k{i}".encode(), "value": f"after-{i}".encode()} for i in range(300)]
    reports += produce_all(p, TOPIC, second)
    messages += second
    assert_all_delivered(reports)

    acked = collections.defaultdict(list)
    for m, r in zip(messages, reports):
        acked[r.partition].append((r.offset, m["value"]))
    c = consumer(bootstrap, **client(certs))
    c.assign([TopicPartition(TOPIC, part, 0) for part in acked])
    ends = {(TOPIC, part): max(o for o, _ in rows) + 1 for part, rows in acked.items()}
    got = read_to_end(c, ends)
    c.close()
    read = collections.defaultdict(list)
    for m in got:
        read[m.partition()].append((m.offset(), m.value()))
    for part, rows in acked.items():
        assert sorted(rows) == read[part], f"partition {part}: acknowledged records lost or moved"
    assert sum(len(v) for v in read.values()) == 600

    # Back again, it catches up over INTERNAL and rejoins every ISR.
    victim.start(wait=False)
    victim.wait_ready(wait_for_partitions=False)
    a = admin(cluster.bootstrap, **client(certs))
    wait_for("the restarted node back in every ISR", lambda: set(isr_sizes(a, TOPIC).values()) == {3},
             timeout=60)
    # Every link outlived several 4 s sessions: renewed, never closed for an expired one.
    for n in cluster.nodes:
        assert "after the SASL session expired" not in n.log_path.read_text(errors="replace"), n.node_id


def test_a_node_with_the_wrong_inter_node_password_cannot_join(cluster, certs):
    intruder = cluster.add_broker()
    # The cluster's own settings, but for its login.
    intruder.extra_args = intruder.extra_args[:-len(cluster.extra_args)] + \
        node_args(certs, node_password="not-the-password")
    intruder.listener_name = "CLIENT"
    intruder.client_config = client(certs)
    intruder.internal_port = free_port()
    intruder.start(wait=False)
    try:
        a = admin(cluster.bootstrap, **client(certs))
        deadline = time.monotonic() + 8
        refused = False
        while time.monotonic() < deadline:
            ids = {b.id for b in a.list_topics(timeout=10).brokers.values()}
            assert intruder.node_id not in ids, "a node with the wrong password registered"
            logs = "".join(n.log_text() for n in cluster.controllers)
            refused = "failed SASL authentication on the CONTROLLER listener" in logs
            time.sleep(0.5)
        assert refused, "the controllers never refused the intruder's login"
        assert intruder.running(), "the intruder keeps trying, as a Kafka broker does"
        assert "another node refused this node's SASL login" in intruder.log_text(), intruder.log_tail()
        for n in cluster.nodes:
            assert "not-the-password" not in n.log_text(), "a password reached a log line"
    finally:
        intruder.kill()
        cluster.nodes.remove(intruder)
        intruder.remove()


def test_only_principals_with_cluster_action_speak_to_the_controllers(cluster, certs, tmp_path):
    def quorum(user: str, password: str):
        props = tmp_path / f"{user}.properties"
        props.write_text(
            "security.protocol=SASL_SSL\n"
            f"ssl.truststore.type=PEM\nssl.truststore.location={certs.ca}\n"
            "sasl.mechanism=PLAIN\n"
            "sasl.jaas.config=org.apache.kafka.common.security.plain.PlainLoginModule required "
            f'username="{user}" password="{password}";\n'
            "default.api.timeout.ms=8000\nrequest.timeout.ms=4000\n")
        controller = cluster.controllers[0]
        return java("org.apache.kafka.tools.MetadataQuorumCommand", "--bootstrap-controller",
                    f"127.0.0.1:{controller.controller_port}", "--command-config", str(props),
                    "describe", "--status", timeout=120)

    ok = quorum("admin", ADMIN_PW)
    assert ok.returncode == 0, ok.stderr[-2000:]
    assert f"ClusterId:              {cluster.cluster_id}" in ok.stdout or cluster.cluster_id in ok.stdout
    denied = quorum("alice", ALICE_PW)
    assert denied.returncode != 0, denied.stdout
    logs = "".join(n.log_text() for n in cluster.controllers)
    assert "principal=User:alice" in logs and "needs CLUSTER_ACTION on the cluster" in logs
    wrong = quorum("admin", "wrong-password")
    assert wrong.returncode != 0 and "Authentication failed" in wrong.stderr + wrong.stdout, wrong.stderr[-2000:]
