"""ACLs with Kafka's StandardAuthorizer rules (`authorizer.class.name`), stored in the metadata
log: Apache Kafka's `kafka-acls` adds, lists and removes them (literal, prefixed, deny over
allow), and librdkafka clients logged in over SASL get exactly what the ACLs give them:
TOPIC_AUTHORIZATION_FAILED, GROUP_AUTHORIZATION_FAILED and CLUSTER_AUTHORIZATION_FAILED where
they give nothing, and no topic names they may not describe."""

from __future__ import annotations

import socket
import struct
import tempfile
import time
import uuid
from pathlib import Path

import pytest
from confluent_kafka import Consumer, KafkaError, KafkaException, Producer, TopicPartition
from confluent_kafka.admin import AclBinding, AclBindingFilter, AclOperation, AclPermissionType, NewTopic, \
    ResourcePatternType, ResourceType

from harness import Broker, admin
from reference import java

ADMIN_PW = "admin-Pw-acl1"
ALICE_PW = "alice-Pw-acl2"
BOB_PW = "bob-Pw-acl3"
JAAS = ('org.apache.kafka.common.security.plain.PlainLoginModule required '
        f'user_admin="{ADMIN_PW}" user_alice="{ALICE_PW}" user_bob="{BOB_PW}";')
AUTHORIZER = "org.apache.kafka.metadata.authorizer.StandardAuthorizer"


def login(user: str, password: str, **extra) -> dict:
    return {"security.protocol": "SASL_PLAINTEXT", "sasl.mechanism": "PLAIN", "sasl.username": user,
            "sasl.password": password, **extra}


ADMIN = login("admin", ADMIN_PW)
ALICE = login("alice", ALICE_PW)
BOB = login("bob", BOB_PW)


@pytest.fixture(scope="module")
def broker():
    b = Broker(cores=2, num_partitions=2, name="acl", listener_name="CLIENT", client_config=ADMIN,
               extra_args=["--listener-security-protocol-map", "CLIENT:SASL_PLAINTEXT",
                           "--sasl-enabled-mechanisms", "PLAIN",
                           "--override", f"listener.name.client.plain.sasl.jaas.config={JAAS}",
                           "--override", f"authorizer.class.name={AUTHORIZER}",
                           "--override", "super.users=User:admin"])
    b.start()
    a = admin(b.bootstrap, **ADMIN)
    for f in a.create_topics([NewTopic(t, 2, 1) for t in ["orders", "orders-secret", "pay-in", "hidden"]]).values():
        f.result(15)
    yield b
    b.stop()
    b.remove()


def acls_tool(b: Broker, *args: str):
    props = Path(tempfile.mkstemp(prefix="admin-", suffix=".properties", dir=b.root)[1])
    props.write_text("security.protocol=SASL_PLAINTEXT\nsasl.mechanism=PLAIN\n"
                     "sasl.jaas.config=org.apache.kafka.common.security.plain.PlainLoginModule required "
                     f'username="admin" password="{ADMIN_PW}";\n')
    return java("org.apache.kafka.tools.AclCommand", "--bootstrap-server", b.bootstrap,
                "--command-config", str(props), *args)


def produce(b: Broker, config: dict, topic: str, n: int = 20) -> list:
    """Produces `n` records; the delivery errors, by name (empty when all were written)."""
    errors = []
    p = Producer({"bootstrap.servers": b.bootstrap, "acks": "all", "message.timeout.ms": 8000, **config})
    for i in range(n):
        try:
            p.produce(topic, value=b"v%d" % i, partition=i % 2,
                      on_delivery=lambda err, _m: err and errors.append(err.name()))
        except KafkaException as e:  # refused at once when the client already knows
            errors.append(e.args[0].name())
    p.flush(15)
    return errors


def consume(b: Broker, config: dict, topic: str, group: str, n: int) -> tuple[list, list]:
    """Reads up to `n` records in `group`: the values, and the errors reported."""
    values, errors = [], []
    c = Consumer({"bootstrap.servers": b.bootstrap, "group.id": group, "auto.offset.reset": "earliest",
                  "error_cb": lambda e: errors.append(e.name()), **config})
    c.subscribe([topic])
    try:
        for _ in range(40):
            m = c.poll(0.5)
            if m is None:
                continue
            if m.error():
                errors.append(m.error().name())
                if m.error().code() in (KafkaError.GROUP_AUTHORIZATION_FAILED, KafkaError.TOPIC_AUTHORIZATION_FAILED):
                    break
            else:
                values.append(m.value())
            if len(values) >= n:
                break
    finally:
        c.close()
    return values, errors


def topics_seen(b: Broker, config: dict) -> set:
    a = admin(b.bootstrap, **config)
    return {t for t in a.list_topics(timeout=10).topics if not t.startswith("__")}


def test_without_acls_only_the_super_user_gets_anything(broker):
    assert {"orders", "orders-secret", "pay-in", "hidden"} <= topics_seen(broker, ADMIN)
    assert topics_seen(broker, ALICE) == set()
    assert set(produce(broker, ALICE, "orders", n=4)) == {"TOPIC_AUTHORIZATION_FAILED"}
    # CreateAcls needs ALTER on the cluster.
    a = admin(broker.bootstrap, **ALICE)
    binding = AclBinding(ResourceType.TOPIC, "orders", ResourcePatternType.LITERAL, "User:alice", "*",
                         AclOperation.WRITE, AclPermissionType.ALLOW)
    with pytest.raises(KafkaException) as e:
        a.create_acls([binding])[binding].result(15)
    assert e.value.args[0].name() == "CLUSTER_AUTHORIZATION_FAILED"
    assert "denied" in broker.log_path.read_text()


def test_kafka_acls_grants_and_revokes_what_clients_may_do(broker):
    b = broker
    # alice: write and read "orders" in group "billing"; anything on topics prefixed "pay-";
    # reading "orders-secret" denied even though a prefixed allow covers it.
    for args in [
        ["--add", "--allow-principal", "User:alice", "--operation", "Write", "--operation", "Describe",
         "--topic", "orders"],
        ["--add", "--allow-principal", "User:alice", "--consumer", "--topic", "orders", "--group", "billing"],
        ["--add", "--allow-principal", "User:alice", "--operation", "All", "--topic", "pay-",
         "--resource-pattern-type", "prefixed"],
        ["--add", "--allow-principal", "User:alice", "--operation", "Read", "--operation", "Describe",
         "--topic", "orders-", "--resource-pattern-type", "prefixed"],
        ["--add", "--deny-principal", "User:alice", "--operation", "Read", "--topic", "orders-secret"],
    ]:
        done = acls_tool(b, *args, "--force")
        assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    listed = acls_tool(b, "--list", "--topic", "orders")
    assert listed.returncode == 0, listed.stderr[-2000:]
    assert "principal=User:alice, host=*, operation=WRITE, permissionType=ALLOW" in listed.stdout, listed.stdout
    prefixed = acls_tool(b, "--list", "--topic", "pay-", "--resource-pattern-type", "prefixed")
    assert "operation=ALL, permissionType=ALLOW" in prefixed.stdout, prefixed.stdout

    # What alice sees and may do now.
    assert topics_seen(b, ALICE) == {"orders", "orders-secret", "pay-in"}
    assert produce(b, ALICE, "orders") == []
    assert produce(b, ALICE, "pay-in") == []
    assert set(produce(b, ALICE, "hidden", n=4)) == {"TOPIC_AUTHORIZATION_FAILED"}
    values, errors = consume(b, ALICE, "orders", "billing", 20)
    assert sorted(values, key=lambda v: int(v[1:])) == [b"v%d" % i for i in range(20)], errors
    values, errors = consume(b, ALICE, "orders", "other-group", 20)
    assert values == [] and "GROUP_AUTHORIZATION_FAILED" in errors, errors
    # Deny wins over the prefixed allow: alice may describe orders-secret but not read it.
    values, errors = consume(b, ALICE, "orders-secret", "billing", 1)
    assert values == [] and "TOPIC_AUTHORIZATION_FAILED" in errors, errors
    # bob has nothing: no topic names, and his producer is refused.
    assert topics_seen(b, BOB) == set()
    assert set(produce(b, BOB, "orders", n=2)) == {"TOPIC_AUTHORIZATION_FAILED"}

    # Removed: alice loses write on orders.
    removed = acls_tool(b, "--remove", "--allow-principal", "User:alice", "--operation", "Write",
                        "--topic", "orders", "--force")
    assert removed.returncode == 0, removed.stderr[-2000:]
    assert set(produce(b, ALICE, "orders", n=2)) == {"TOPIC_AUTHORIZATION_FAILED"}
    assert "orders" in topics_seen(b, ALICE)  # still described: DESCRIBE and READ remain


def test_the_admin_client_describes_and_deletes_acls(broker):
    a = admin(broker.bootstrap, **ADMIN)
    binding = AclBinding(ResourceType.GROUP, "ops-", ResourcePatternType.PREFIXED, "User:bob", "*",
                         AclOperation.READ, AclPermissionType.ALLOW)
    a.create_acls([binding])[binding].result(15)
    match = AclBindingFilter(ResourceType.GROUP, "ops-team", ResourcePatternType.MATCH, None, None,
                             AclOperation.ANY, AclPermissionType.ANY)
    assert a.describe_acls(match).result(15) == [binding]
    any_bob = AclBindingFilter(ResourceType.ANY, None, ResourcePatternType.ANY, "User:bob", None,
                               AclOperation.ANY, AclPermissionType.ANY)
    deleted = a.delete_acls([any_bob])[any_bob].result(15)
    assert deleted == [binding]
    assert a.describe_acls(any_bob).result(15) == []
    # An invalid ACL is refused with Kafka's INVALID_REQUEST.
    bad = AclBinding(ResourceType.BROKER, "not-the-cluster", ResourcePatternType.LITERAL, "User:bob", "*",
                     AclOperation.ALTER, AclPermissionType.ALLOW)
    with pytest.raises(KafkaException) as e:
        a.create_acls([bad])[bad].result(15)
    assert e.value.args[0].name() == "INVALID_REQUEST" and "kafka-cluster" in str(e.value)


def test_acls_survive_a_restart(broker):
    a = admin(broker.bootstrap, **ADMIN)
    topic = f"restart-{uuid.uuid4().hex[:6]}"
    a.create_topics([NewTopic(topic, 2, 1)])[topic].result(15)
    binding = AclBinding(ResourceType.TOPIC, topic, ResourcePatternType.LITERAL, "User:bob", "*",
                         AclOperation.WRITE, AclPermissionType.ALLOW)
    a.create_acls([binding])[binding].result(15)
    broker.stop()
    broker.start()
    assert produce(broker, BOB, topic, n=6) == []
    assert topics_seen(broker, BOB) == {topic}


def test_transactions_configs_and_groups_follow_the_acls(broker):
    b = broker
    a = admin(b.bootstrap, **ADMIN)
    topic = f"tx-{uuid.uuid4().hex[:6]}"
    a.create_topics([NewTopic(topic, 2, 1)])[topic].result(15)

    def transactional(txn_id: str) -> Producer:
        return Producer({"bootstrap.servers": b.bootstrap, "transactional.id": txn_id,
                         "transaction.timeout.ms": 10000, **BOB})

    # Without WRITE on the transactional id: refused at InitProducerId.
    p = transactional("bob-tx")
    with pytest.raises(KafkaException) as e:
        p.init_transactions(15)
    assert e.value.args[0].name() == "TRANSACTIONAL_ID_AUTHORIZATION_FAILED", e.value
    # kafka-acls --producer --transactional-id: WRITE and DESCRIBE on both.
    done = acls_tool(b, "--add", "--allow-principal", "User:bob", "--producer", "--topic", topic,
                     "--transactional-id", "bob-tx", "--force")
    assert done.returncode == 0, done.stderr[-2000:]
    p = transactional("bob-tx")
    p.init_transactions(15)
    p.begin_transaction()
    for i in range(10):
        p.produce(topic, value=b"t%d" % i, partition=i % 2)
    p.commit_transaction(15)
    c = Consumer({"bootstrap.servers": b.bootstrap, "group.id": f"check-{topic}", "auto.offset.reset": "earliest",
                  "isolation.level": "read_committed", **ADMIN})
    c.assign([TopicPartition(topic, 0), TopicPartition(topic, 1)])
    got = []
    for _ in range(40):
        m = c.poll(0.5)
        if m is not None and not m.error():
            got.append(m.value())
        if len(got) >= 10:
            break
    c.close()
    assert sorted(got, key=lambda v: int(v[1:])) == [b"t%d" % i for i in range(10)]

    # DescribeConfigs needs DESCRIBE_CONFIGS on the topic.
    from confluent_kafka.admin import ConfigResource
    resource = ConfigResource(ConfigResource.Type.TOPIC, topic)
    bob_admin = admin(b.bootstrap, **BOB)
    with pytest.raises(KafkaException) as e:
        bob_admin.describe_configs([resource])[resource].result(15)
    assert e.value.args[0].name() == "TOPIC_AUTHORIZATION_FAILED", e.value
    configs = a.describe_configs([resource])[resource].result(15)
    assert "retention.ms" in configs

    # ListGroups shows bob only the groups he may describe: none; the super user sees them.
    listed = bob_admin.list_consumer_groups().result(15)
    assert listed.valid == []
    everyone = a.list_consumer_groups().result(15)
    assert f"check-{topic}" in {g.group_id for g in everyone.valid}

    # CreatePartitions needs ALTER on the topic.
    from confluent_kafka.admin import NewPartitions
    with pytest.raises(KafkaException) as e:
        bob_admin.create_partitions([NewPartitions(topic, 4)])[topic].result(15)
    assert e.value.args[0].name() == "TOPIC_AUTHORIZATION_FAILED", e.value
    # DeleteRecords needs DELETE on the topic: nothing is deleted.
    tp = TopicPartition(topic, 0, 5)
    with pytest.raises(KafkaException) as e:
        bob_admin.delete_records([tp])[tp].result(15)
    assert e.value.args[0].name() == "TOPIC_AUTHORIZATION_FAILED", e.value
    low, _ = Consumer({"bootstrap.servers": b.bootstrap, "group.id": "wm", **ADMIN}).get_watermark_offsets(
        TopicPartition(topic, 0), timeout=10)
    assert low == 0
    assert len(a.list_topics(topic, timeout=10).topics[topic].partitions) == 2
    # AlterReplicaLogDirs needs ALTER on the cluster: bob's partition is refused with
    # CLUSTER_AUTHORIZATION_FAILED (31), admin's reaches the broker.
    from test_sasl import authenticate, handshake, read_frames, request
    name = topic.encode()
    path = b"/nowhere"
    alter_dirs = request(34, 1, 3, struct.pack(">ih", 1, len(path)) + path
                         + struct.pack(">ih", 1, len(name)) + name + struct.pack(">ii", 1, 0))
    for user, password, refused in [("bob", BOB_PW, True), ("admin", ADMIN_PW, False)]:
        with socket.create_connection(("127.0.0.1", b.port), timeout=10) as s:
            s.sendall(handshake(1, "PLAIN") + authenticate(2, f"\0{user}\0{password}".encode()) + alter_dirs)
            frames = read_frames(s, 3)
            assert [struct.unpack(">i", f[:4])[0] for f in frames] == [1, 2, 3]
            body = frames[2][4:]
            # throttle, one topic named as asked, one partition: its index and error code.
            assert struct.unpack(">ii", body[:8])[1] == 1
            (n,) = struct.unpack(">h", body[8:10])
            assert body[10:10 + n] == name
            count, index, error = struct.unpack(">iih", body[10 + n:20 + n])
            assert (count, index) == (1, 0)
            assert (error == 31) == refused, error


def test_a_revoked_read_stops_a_consumer_already_in_a_fetch_session(broker):
    """Kafka checks READ on every partition of a fetch session at every fetch, not only those the
    request names: a consumer whose READ is taken away mid-session gets no more records.
    kafka-python keeps an incremental fetch session (KIP-227), as the Java client does."""
    import kafka
    import kafka.errors

    a = admin(broker.bootstrap, **ADMIN)
    topic = f"revoke-{uuid.uuid4().hex[:6]}"
    a.create_topics([NewTopic(topic, 2, 1)])[topic].result(15)
    read = AclBinding(ResourceType.TOPIC, topic, ResourcePatternType.LITERAL, "User:bob", "*",
                      AclOperation.READ, AclPermissionType.ALLOW)
    describe = AclBinding(ResourceType.TOPIC, topic, ResourcePatternType.LITERAL, "User:bob", "*",
                          AclOperation.DESCRIBE, AclPermissionType.ALLOW)
    for f in a.create_acls([read, describe]).values():
        f.result(15)
    assert produce(broker, ADMIN, topic, n=10) == []
    c = kafka.KafkaConsumer(bootstrap_servers=broker.bootstrap, security_protocol="SASL_PLAINTEXT",
                            sasl_mechanism="PLAIN", sasl_plain_username="bob", sasl_plain_password=BOB_PW,
                            enable_auto_commit=False, auto_offset_reset="earliest", fetch_max_wait_ms=100)
    c.assign([kafka.TopicPartition(topic, p) for p in range(2)])
    c.seek_to_beginning()

    def drain(rounds: int) -> tuple[list, list]:
        values, errors = [], []
        for _ in range(rounds):
            try:
                for records in c.poll(timeout_ms=300).values():
                    values.extend(r.value for r in records)
            except kafka.errors.KafkaError as e:
                errors.append(type(e).__name__)
        return values, errors

    try:
        values, errors = drain(20)
        assert sorted(values, key=lambda v: int(v[1:])) == [b"v%d" % i for i in range(10)], errors
        read_filter = AclBindingFilter(ResourceType.TOPIC, topic, ResourcePatternType.LITERAL, "User:bob",
                                       "*", AclOperation.READ, AclPermissionType.ALLOW)
        assert a.delete_acls([read_filter])[read_filter].result(15) == [read]
        # A fetch authorized before the change may still be waiting for data (as in Kafka): let
        # those finish empty before writing more.
        time.sleep(0.5)
        assert produce(broker, ADMIN, topic, n=10) == []
        late, errors = drain(15)
        assert late == [], late
        assert "TopicAuthorizationFailedError" in errors, errors
    finally:
        c.close()


def test_share_groups_follow_the_acls(broker):
    """A share consumer needs READ on its group and on the topic, as in Kafka: without the
    group it gets GROUP_AUTHORIZATION_FAILED, without the topic no records."""
    from confluent_kafka import ShareConsumer
    from confluent_kafka.admin import AlterConfigOpType, ConfigEntry, ConfigResource
    a = admin(broker.bootstrap, **ADMIN)
    a.create_topics([NewTopic("share-acl", 2, 1)])["share-acl"].result(15)
    assert produce(broker, ADMIN, "share-acl", n=10) == []
    for group in ("sq-ok", "sq-denied", "sq-no-topic"):
        r = ConfigResource("GROUP", group, incremental_configs=[
            ConfigEntry("share.auto.offset.reset", "earliest", incremental_operation=AlterConfigOpType.SET)])
        a.incremental_alter_configs([r])[r].result(15)
    grants = [AclBinding(ResourceType.TOPIC, "share-acl", ResourcePatternType.LITERAL, "User:bob", "*",
                         AclOperation.READ, AclPermissionType.ALLOW)] + [
        AclBinding(ResourceType.GROUP, g, ResourcePatternType.LITERAL, "User:bob", "*",
                   AclOperation.READ, AclPermissionType.ALLOW) for g in ("sq-ok", "sq-no-topic")]
    for f in a.create_acls(grants).values():
        f.result(15)
    time.sleep(1)

    def share_read(group: str, topic: str) -> tuple[list, list]:
        values, errors = [], []
        c = ShareConsumer({"bootstrap.servers": broker.bootstrap, "group.id": group,
                           "error_cb": lambda e: errors.append(e.name()), **BOB})
        c.subscribe([topic])
        try:
            deadline = time.monotonic() + 12
            while time.monotonic() < deadline and len(values) < 10:
                try:
                    messages = list(c.poll(0.5) or [])
                except KafkaException as e:
                    errors.append(e.args[0].name())
                    messages = []
                for m in messages:
                    if m.error():
                        errors.append(m.error().name())
                    else:
                        values.append(m.value())
                if errors and not values and time.monotonic() > deadline - 6:
                    break
        finally:
            c.close()
        return values, errors

    values, errors = share_read("sq-ok", "share-acl")
    assert sorted(values) == sorted(b"v%d" % i for i in range(10)), (values, errors)
    values, errors = share_read("sq-denied", "share-acl")
    assert values == [] and "GROUP_AUTHORIZATION_FAILED" in errors, errors
    assert produce(broker, ADMIN, "hidden", n=4) == []
    values, errors = share_read("sq-no-topic", "hidden")
    assert values == [] and "TOPIC_AUTHORIZATION_FAILED" in errors, (values, errors)

    # The share coordinator's own requests are for brokers only (CLUSTER_ACTION on the
    # cluster): ReadShareGroupState v0 for sq-ok's share partition share-acl-0, with no leader
    # epoch (no side effect). bob is refused with CLUSTER_AUTHORIZATION_FAILED (31); the super
    # user reaches the share coordinator and reads the state sq-ok left there.
    from confluent_kafka import TopicCollection
    from test_sasl import authenticate, handshake, read_frames, request
    tid = a.describe_topics(TopicCollection(["share-acl"]))["share-acl"].result(15).topic_id
    topic_id = struct.pack(">qq", tid.get_most_significant_bits(), tid.get_least_significant_bits())
    group = b"sq-ok"
    # Flexible header's tags, group id, one topic, one partition (index 0, leader epoch -1).
    read_state = request(84, 0, 3, b"\x00" + bytes([len(group) + 1]) + group + b"\x02" + topic_id
                         + b"\x02" + struct.pack(">ii", 0, -1) + b"\x00\x00\x00")
    for user, password, refused in [("bob", BOB_PW, True), ("admin", ADMIN_PW, False)]:
        with socket.create_connection(("127.0.0.1", broker.port), timeout=10) as s:
            s.sendall(handshake(1, "PLAIN") + authenticate(2, f"\0{user}\0{password}".encode()) + read_state)
            frames = read_frames(s, 3)
            assert [struct.unpack(">i", f[:4])[0] for f in frames] == [1, 2, 3], (user, broker.log_tail())
            f = frames[2]
            # correlation id, header tags, one result: its topic id, one partition: its index,
            # error code, error message (compact, nullable), state epoch, start offset.
            assert f[4:6] == b"\x00\x02" and f[6:22] == topic_id and f[22] == 2
            partition, error = struct.unpack(">ih", f[23:29])
            assert partition == 0
            if refused:
                assert error == 31, (user, error)
            else:
                assert error == 0 and f[29] == 0, (user, error)
                state_epoch, start_offset = struct.unpack(">iq", f[30:42])
                assert state_epoch >= 0 and 0 <= start_offset <= 10, (state_epoch, start_offset)
    assert "principal=User:bob" in broker.log_text()


def test_streams_groups_follow_the_acls(broker):
    """StreamsGroupHeartbeat needs READ on the group and StreamsGroupDescribe DESCRIBE on it, as
    in Kafka: bob, with neither on `st-acl`, is refused with GROUP_AUTHORIZATION_FAILED (30);
    the super user gets through to the coordinator, which refuses a join without a topology
    (INVALID_REQUEST, 42) and finds no such group (GROUP_ID_NOT_FOUND, 69)."""
    from test_sasl import authenticate, handshake, read_frames, request
    group = b"st-acl"
    compact = lambda s: bytes([len(s) + 1]) + s  # noqa: E731 (short strings only)
    # Flexible header's tags; group id, member id, member epoch 0, endpoint epoch -1, no
    # instance or rack id, rebalance timeout, no topology (-1), null task lists and process id,
    # no endpoint (-1), null tags and offsets, no shutdown, no tagged fields.
    heartbeat = request(88, 0, 3, b"\x00" + compact(group) + compact(b"m1") + struct.pack(">ii", 0, -1)
                        + b"\x00\x00" + struct.pack(">i", 30_000) + b"\xff" + b"\x00" * 4 + b"\xff"
                        + b"\x00" * 3 + b"\x00\x00")
    describe = request(89, 0, 4, b"\x00" + b"\x02" + compact(group) + b"\x00\x00")
    for user, password, (hb_error, describe_error) in [("bob", BOB_PW, (30, 30)), ("admin", ADMIN_PW, (42, 69))]:
        with socket.create_connection(("127.0.0.1", broker.port), timeout=10) as s:
            s.sendall(handshake(1, "PLAIN") + authenticate(2, f"\0{user}\0{password}".encode())
                      + heartbeat + describe)
            frames = read_frames(s, 4)
            assert [struct.unpack(">i", f[:4])[0] for f in frames] == [1, 2, 3, 4], (user, broker.log_tail())
            # correlation id, header tags, throttle time, error code.
            hb = frames[2]
            assert struct.unpack(">h", hb[9:11])[0] == hb_error, (user, hb)
            # correlation id, header tags, throttle time, one group: its error code, then its id.
            d = frames[3]
            assert d[9] == 2 and struct.unpack(">h", d[10:12])[0] == describe_error, (user, d)
            assert group in d
