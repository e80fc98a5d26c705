"""The admin APIs a single node answers, and the versions ApiVersions advertises, against Apache
Kafka 4.x as the reference.

Each test sends the same requests (kafka-python's protocol classes, pipelined on one connection)
to Sluice and to a Kafka broker started beside it, on topics created alike on both, and compares
the answers field by field after taking out what differs by nature (topic ids, the log
directory's path, producer ids). Where Sluice answers differently on purpose (a feature it does
not have), the test says so and checks Sluice's own answer. Real clients (confluent-kafka's
AdminClient, kafka-python) check the APIs they use.
"""

from __future__ import annotations

import os
import time

import pytest
from confluent_kafka import KafkaException, TopicCollection, TopicPartition
from confluent_kafka.admin import (AclBinding, NewTopic, AclBindingFilter, AclOperation, AclPermissionType,
                                   OffsetSpec, ResourcePatternType, ResourceType, ScramMechanism)
from kafka.protocol.admin.acl import CreateAclsRequest, DeleteAclsRequest, DescribeAclsRequest
from kafka.protocol.admin.client_quotas import AlterClientQuotasRequest, DescribeClientQuotasRequest
from kafka.protocol.admin.cluster import AlterReplicaLogDirsRequest, DescribeLogDirsRequest
from kafka.protocol.admin.configs import ListConfigResourcesRequest
from kafka.protocol.admin.topics import DescribeTopicPartitionsRequest
from kafka.protocol.admin.transactions import DescribeProducersRequest
from kafka.protocol.admin.users import AlterUserScramCredentialsRequest, DescribeUserScramCredentialsRequest
from kafka.protocol.consumer.fetch import FetchRequest
from kafka.protocol.consumer.offsets import ListOffsetsRequest, OffsetForLeaderEpochRequest
from kafka.protocol.metadata.api_versions import ApiVersionsRequest
from kafka.protocol.metadata.metadata import MetadataRequest
from kafka.protocol.producer.produce import ProduceRequest
from kafka.record import MemoryRecords

from harness import admin, producer
from wire import Pipeline, batch, build

KAFKA_PROPS = {"auto.create.topics.enable": "false"}

# Every API and version range Sluice implements (api key: (min, max)); a change to the table in
# broker/src/handlers/mod.rs must come with a test of what it adds (ListGroups 5, its type filter:
# test_group_kafka.py; ElectLeaders: test_replication.py; Alter/ListPartitionReassignments:
# test_reassignment.py).
EXPECTED_APIS = {
    0: (3, 12), 1: (4, 18), 2: (1, 10), 3: (0, 13), 8: (2, 8), 9: (1, 8), 10: (0, 4), 11: (0, 9),
    12: (0, 4), 13: (0, 5), 14: (0, 5), 15: (0, 5), 16: (0, 5), 18: (0, 4), 19: (2, 7),
    20: (1, 6), 21: (0, 2), 22: (0, 4), 23: (2, 4), 29: (1, 3), 30: (1, 3), 31: (1, 3), 32: (1, 4),
    33: (0, 2), 34: (1, 2), 35: (1, 4), 37: (0, 3), 42: (0, 2), 43: (0, 2), 44: (0, 1), 45: (0, 1),
    46: (0, 0), 47: (0, 0), 48: (0, 1),
    49: (0, 1), 50: (0, 0), 51: (0, 0), 55: (0, 2), 60: (0, 1), 61: (0, 0), 68: (0, 1), 69: (0, 1),
    74: (0, 1), 75: (0, 0),
}
METADATA_VERSION_4_0 = 25
TOPIC_OPERATIONS_ALL = 3576

A, B = "admin-a", "admin-b"  # 3 and 2 partitions on both brokers
EPOCHS = "admin-epochs"
TS = 1_700_000_000_000


def create_and_wait(bootstrap: str, name: str, partitions: int) -> None:
    """Creates a topic and waits until Metadata lists all its partitions (Kafka's brokers learn
    of a new topic from the controller a moment after CreateTopics answers)."""
    client = admin(bootstrap)
    client.create_topics([NewTopic(name, num_partitions=partitions, replication_factor=1)])[name].result(timeout=30)
    deadline = time.monotonic() + 30
    while True:
        md = client.list_topics(topic=name, timeout=10).topics[name]
        if md.error is None and sorted(md.partitions) == list(range(partitions)):
            break
        assert time.monotonic() < deadline, md.error
        time.sleep(0.2)
    # Listed is not yet led: Kafka's broker may answer NOT_LEADER_OR_FOLLOWER a moment longer,
    # so wait until every partition answers ListOffsets.
    while True:
        futures = client.list_offsets({TopicPartition(name, p): OffsetSpec.latest() for p in range(partitions)},
                                      request_timeout=10)
        try:
            for f in futures.values():
                f.result(timeout=15)
            return
        except KafkaException as e:
            assert time.monotonic() < deadline, e
            time.sleep(0.2)


@pytest.fixture(scope="module")
def both(broker, kafka_reference):
    for bootstrap in (broker.bootstrap, kafka_reference.bootstrap):
        create_and_wait(bootstrap, A, 3)
        create_and_wait(bootstrap, B, 2)
    return broker, kafka_reference


def ask(bootstrap: str, *requests) -> list[dict]:
    p = Pipeline(bootstrap)
    try:
        for r in requests:
            p.send(r)
        return p.responses()
    finally:
        p.close()


def ask_both(both, *requests) -> tuple[list[dict], list[dict]]:
    sluice, kafka = both
    return ask(sluice.bootstrap, *requests), ask(kafka.bootstrap, *requests)


def produce(topic: str, partition: int, records: bytes, version: int = 9):
    return build(ProduceRequest, version, transactional_id=None, acks=-1, timeout_ms=30_000,
                 topic_data=[{"name": topic, "partition_data": [{"index": partition, "records": records}]}])


def log_dir_of(b) -> str:
    root = b.data_dir if hasattr(b, "data_dir") else b.root / "data"
    return os.path.abspath(root)


# -- ApiVersions ------------------------------------------------------------------------------

def test_api_versions_advertise_what_is_implemented_and_kafka_4_features(both):
    sluice, kafka = both
    v4, v3 = ask(sluice.bootstrap, build(ApiVersionsRequest, 4, client_software_name="t",
                                         client_software_version="1"),
                 build(ApiVersionsRequest, 3, client_software_name="t", client_software_version="1"))
    k4, k3 = ask(kafka.bootstrap, build(ApiVersionsRequest, 4, client_software_name="t",
                                        client_software_version="1"),
                 build(ApiVersionsRequest, 3, client_software_name="t", client_software_version="1"))
    table = {k["api_key"]: (k["min_version"], k["max_version"]) for k in v4["api_keys"]}
    assert table == EXPECTED_APIS
    kafka_table = {k["api_key"]: (k["min_version"], k["max_version"]) for k in k4["api_keys"]}
    for key, (lo, hi) in table.items():
        # Never past Kafka 4.x's versions; the minimum is Kafka's (Produce keeps 3, as Kafka
        # now refuses 0-2 though it still lists them for librdkafka's sake).
        assert key in kafka_table and hi <= kafka_table[key][1], (key, hi, kafka_table.get(key))
        assert lo == kafka_table[key][0] or (key == 0 and lo == 3), (key, lo, kafka_table[key])

    finalized = {f["name"]: (f["min_version_level"], f["max_version_level"]) for f in v4["finalized_features"]}
    assert finalized == {"metadata.version": (METADATA_VERSION_4_0, METADATA_VERSION_4_0),
                         "group.version": (1, 1)}
    kafka_finalized = {f["name"]: f["max_version_level"] for f in k4["finalized_features"]}
    assert kafka_finalized["metadata.version"] >= METADATA_VERSION_4_0
    assert kafka_finalized["group.version"] == 1
    assert v4["finalized_features_epoch"] >= 0 and k4["finalized_features_epoch"] >= 0
    supported = {f["name"]: (f["min_version"], f["max_version"]) for f in v4["supported_features"]}
    assert supported == {"metadata.version": (METADATA_VERSION_4_0, METADATA_VERSION_4_0),
                         "group.version": (0, 1)}
    # Version 3 leaves out supported ranges that start at 0 (KAFKA-17011), on both brokers;
    # finalized features are the same as in version 4.
    for r3, r4 in ((v3, v4), (k3, k4)):
        want = [f for f in r4["supported_features"] if f["min_version"] > 0]
        assert r3["supported_features"] == want
        assert r3["finalized_features"] == r4["finalized_features"]
        assert r3["api_keys"] == r4["api_keys"]


def test_clients_that_infer_the_version_see_kafka_4(both):
    from kafka import KafkaConsumer
    sluice, kafka = both
    for b in (sluice, kafka):
        c = KafkaConsumer(bootstrap_servers=b.bootstrap, group_id=None)
        try:
            assert c.config["api_version"] >= (4, 0), (b.bootstrap, c.config["api_version"])
        finally:
            c.close()


# -- DescribeTopicPartitions ---------------------------------------------------------------

def dtp(topics, limit=2000, cursor=None):
    return build(DescribeTopicPartitionsRequest, 0, topics=[{"name": t} for t in topics],
                 response_partition_limit=limit, cursor=cursor)


def strip_ids(r: dict) -> dict:
    for t in r["topics"]:
        t["topic_id"] = t["topic_id"] is not None and t["topic_id"].int != 0
    return r


def test_describe_topic_partitions_pages_like_kafka(both):
    sluice, kafka = both
    requests = [
        dtp([A, B, "admin-none"]),
        dtp([A, B, "admin-none"], limit=2),
        dtp([A, B], limit=2, cursor={"topic_name": A, "partition_index": 2}),
        dtp([A, B, "admin-zz"], limit=3),
        dtp([A, B, "admin-zz"], limit=5),
        dtp([B, A], limit=3, cursor={"topic_name": A, "partition_index": 7}),
        dtp([B], limit=0),
        dtp([A, A], limit=-3),
        dtp([A, "bad name!"]),
        dtp([B], cursor={"topic_name": A, "partition_index": 0}),
    ]
    ours, theirs = ask_both(both, *requests)
    for request, o, k in zip(requests, ours, theirs):
        assert strip_ids(o) == strip_ids(k), request
    assert [t["name"] for t in ours[0]["topics"]] == [A, B, "admin-none"]
    assert ours[0]["topics"][0]["partitions"][2]["leader_epoch"] == 0
    assert ours[0]["topics"][0]["topic_authorized_operations"] == TOPIC_OPERATIONS_ALL

    # Every topic (an empty list), one partition per page: each partition exactly once.
    seen, cursor = [], None
    while True:
        (page,) = ask(sluice.bootstrap, dtp([], limit=1, cursor=cursor))
        seen += [(t["name"], p["partition_index"]) for t in page["topics"] for p in t["partitions"]]
        cursor = page["next_cursor"]
        if cursor is None:
            break
    (whole,) = ask(sluice.bootstrap, dtp([]))
    assert seen == [(t["name"], p["partition_index"]) for t in whole["topics"] for p in t["partitions"]]
    assert {(A, 0), (A, 1), (A, 2), (B, 0), (B, 1)} <= set(seen)


def test_confluent_describe_topics_uses_describe_topic_partitions(both):
    sluice, _ = both
    client = admin(sluice.bootstrap)
    result = client.describe_topics(TopicCollection([A, B]), request_timeout=15)
    for name, count in ((A, 3), (B, 2)):
        d = result[name].result(timeout=20)
        assert d.name == name and not d.is_internal
        assert [p.id for p in d.partitions] == list(range(count))
        for p in d.partitions:
            assert p.leader.id == 1 and [n.id for n in p.replicas] == [1] and [n.id for n in p.isr] == [1]
    with pytest.raises(KafkaException) as e:
        client.describe_topics(TopicCollection(["admin-none"]))["admin-none"].result(timeout=20)
    assert e.value.args[0].code() == 3


# -- DescribeLogDirs and AlterReplicaLogDirs --------------------------------------------------

def test_describe_log_dirs_like_kafka(both):
    sluice, kafka = both
    records = batch([b"one", b"two", b"three"], timestamp_ms=TS)
    ask_both(both, produce(A, 1, records), produce(A, 1, records))
    requests = [
        build(DescribeLogDirsRequest, 4, topics=[{"topic": A, "partitions": [0, 1, 9]},
                                                 {"topic": "admin-none", "partitions": [0]}]),
        build(DescribeLogDirsRequest, 4, topics=[]),
        build(DescribeLogDirsRequest, 2, topics=[{"topic": B, "partitions": [1]}]),
    ]
    ours, theirs = ask_both(both, *requests)
    for b, response in ((sluice, ours), (kafka, theirs)):
        for r in response:
            (result,) = r["results"]
            assert result["error_code"] == 0
            assert os.path.realpath(result.pop("log_dir")) == os.path.realpath(log_dir_of(b))
            for t in result["topics"]:
                t["partitions"].sort(key=lambda p: p["partition_index"])
            result["topics"].sort(key=lambda t: t["name"])
            if "total_bytes" in result:
                st = os.statvfs(log_dir_of(b))
                assert result.pop("total_bytes") == st.f_blocks * st.f_frsize
                usable = result.pop("usable_bytes")
                assert abs(usable - st.f_bavail * st.f_frsize) < 64 << 20, usable
    assert ours == theirs
    # The same batch, appended alike, takes the same bytes on both.
    sizes = {p["partition_index"]: p["partition_size"] for p in ours[0]["results"][0]["topics"][0]["partitions"]}
    assert sizes == {0: 0, 1: 2 * len(records)}

    # Null topics: every partition, this module's topics among them.
    (everything,) = ask(sluice.bootstrap, build(DescribeLogDirsRequest, 1, topics=None))
    listed = {(t["name"], p["partition_index"]) for t in everything["results"][0]["topics"] for p in t["partitions"]}
    assert {(A, 0), (A, 1), (A, 2), (B, 0), (B, 1)} <= listed


def test_alter_replica_log_dirs_like_kafka(both):
    def requests(b):
        d = os.path.realpath(log_dir_of(b))
        return [
            build(AlterReplicaLogDirsRequest, 2, dirs=[{"path": d, "topics": [
                {"name": A, "partitions": [0, 9]}, {"name": "admin-none", "partitions": [0]}]}]),
            build(AlterReplicaLogDirsRequest, 1, dirs=[{"path": d + "/", "topics": [{"name": A, "partitions": [1]}]}]),
            build(AlterReplicaLogDirsRequest, 2, dirs=[
                {"path": d, "topics": [{"name": A, "partitions": [1]}]},
                {"path": "relative", "topics": [{"name": B, "partitions": [1]}]},
                {"path": "/elsewhere", "topics": [{"name": "admin-none", "partitions": [0]}]}]),
        ]

    def normal(rs):
        for r in rs:
            r["results"] = sorted((t["topic_name"], sorted((p["partition_index"], p["error_code"]) for p in t["partitions"]))
                                  for t in r["results"])
        return rs

    sluice, kafka = both
    ours = normal(ask(sluice.bootstrap, *requests(sluice)))
    theirs = normal(ask(kafka.bootstrap, *requests(kafka)))
    assert ours == theirs
    assert ours[0]["results"] == [(A, [(0, 0), (9, 3)]), ("admin-none", [(0, 3)])]


# -- ListConfigResources ----------------------------------------------------------------------

def test_list_config_resources_like_kafka(both):
    ours_topics = {A, B}

    def normal(r):
        r["config_resources"] = sorted((c["resource_type"], c["resource_name"]) for c in r["config_resources"]
                                       if c["resource_type"] != 2 or c["resource_name"] in ours_topics)
        return r

    requests = [build(ListConfigResourcesRequest, 1, resource_types=[2]),
                build(ListConfigResourcesRequest, 1, resource_types=[4]),
                build(ListConfigResourcesRequest, 1, resource_types=[2, 4, 99]),
                build(ListConfigResourcesRequest, 1, resource_types=[16]),
                build(ListConfigResourcesRequest, 0)]
    ours, theirs = ask_both(both, *requests)
    assert [normal(r) for r in ours] == [normal(r) for r in theirs]
    assert ours[0]["config_resources"] == [(2, A), (2, B)] and ours[1]["config_resources"] == [(4, "1")]
    assert ours[2]["error_code"] == 35
    # Every type: Kafka also lists its broker loggers (type 8), which DescribeConfigs here does
    # not describe; everything else is the same.
    (o_all,), (k_all,) = ask_both(both, build(ListConfigResourcesRequest, 1, resource_types=[]))
    k_all["config_resources"] = [c for c in k_all["config_resources"] if c["resource_type"] != 8]
    assert normal(o_all) == normal(k_all)


# -- DescribeProducers -------------------------------------------------------------------------

def describe_producers(topics):
    return build(DescribeProducersRequest, 0, topics=[{"name": t, "partition_indexes": ps} for t, ps in topics])


def test_describe_producers_like_kafka_and_across_a_restart(both):
    sluice, kafka = both
    for b in both:
        p = producer(b.bootstrap, **{"enable.idempotence": True})
        for i in range(5):
            p.produce(B, value=b"v%d" % i, partition=0, timestamp=TS + (3 if i == 2 else i))
        assert p.flush(30) == 0
    request = describe_producers([(B, [0, 1, 7]), ("admin-none", [0])])
    (ours,), (theirs,) = ask_both(both, request)
    ids = []
    for r in (ours, theirs):
        for p in r["topics"][0]["partitions"][0]["active_producers"]:
            ids.append(p.pop("producer_id"))
    assert ours == theirs
    (state,) = ours["topics"][0]["partitions"][0]["active_producers"]
    assert state == {"producer_epoch": 0, "last_sequence": 4, "last_timestamp": TS + 4,
                     "coordinator_epoch": -1, "current_txn_start_offset": -1}
    assert ids[0] >= 0

    # The state comes back from the producer-state snapshot written at shutdown.
    sluice.restart()
    (after,) = ask(sluice.bootstrap, describe_producers([(B, [0])]))
    (state,) = after["topics"][0]["partitions"][0]["active_producers"]
    assert state["producer_id"] == ids[0] and state["last_sequence"] == 4 and state["last_timestamp"] == TS + 4


# -- OffsetForLeaderEpoch ----------------------------------------------------------------------

def test_offset_for_leader_epoch_like_kafka(both):
    # A topic of its own: Sluice was restarted above (not Kafka), and a restart moves leader
    # epochs (its partitions leaderless, then led again), in Sluice as in Kafka.
    for b in both:
        create_and_wait(b.bootstrap, EPOCHS, 3)
    records = batch([b"x"] * 4, timestamp_ms=TS)
    for answers in ask_both(both, produce(EPOCHS, 0, records)):
        assert answers[0]["responses"][0]["partition_responses"][0]["error_code"] == 0, answers
    parts = [(0, -1, 0), (2, 0, 0), (2, 5, 0), (0, -1, 3), (0, -1, -1), (9, -1, 0)]
    requests = [build(OffsetForLeaderEpochRequest, v, replica_id=-1, topics=[
        {"topic": EPOCHS, "partitions": [{"partition": p, "current_leader_epoch": c, "leader_epoch": e}
                                         for p, c, e in parts]},
        {"topic": "admin-none", "partitions": [{"partition": 0, "current_leader_epoch": -1, "leader_epoch": 0}]}])
        for v in (2, 3, 4)]
    ours, theirs = ask_both(both, *requests)
    assert ours == theirs
    got = [(p["error_code"], p["leader_epoch"], p["end_offset"]) for p in ours[2]["topics"][0]["partitions"]]
    assert got == [(0, 0, 4), (0, 0, 0), (75, -1, -1), (0, -1, -1), (0, -1, -1), (3, -1, -1)]


# -- ACLs, client quotas, SCRAM credentials --------------------------------------------------

def test_acls_answer_security_disabled_like_kafka(both):
    any_filter = dict(resource_type_filter=1, resource_name_filter=None, pattern_type_filter=1,
                      principal_filter=None, host_filter=None, operation=1, permission_type=1)
    creation = dict(resource_type=2, resource_name=A, resource_pattern_type=3, principal="User:a",
                    host="*", operation=3, permission_type=3)
    requests = [build(DescribeAclsRequest, v, **any_filter) for v in (1, 3)] + [
        build(CreateAclsRequest, 3, creations=[creation, creation]),
        build(DeleteAclsRequest, 2, filters=[any_filter, any_filter])]
    ours, theirs = ask_both(both, *requests)
    assert ours == theirs
    assert ours[0]["error_code"] == 54 and [r["error_code"] for r in ours[2]["results"]] == [54, 54]

    # librdkafka: describe_acls gives an empty list for SECURITY_DISABLED, from Kafka as from
    # Sluice; create_acls raises it.
    binding = AclBinding(ResourceType.TOPIC, A, ResourcePatternType.LITERAL, "User:a", "*",
                         AclOperation.READ, AclPermissionType.ALLOW)
    for b in both:
        client = admin(b.bootstrap)
        found = client.describe_acls(AclBindingFilter(ResourceType.ANY, None, ResourcePatternType.ANY, None, None,
                                                      AclOperation.ANY, AclPermissionType.ANY)).result(timeout=20)
        assert found == []
        with pytest.raises(KafkaException) as e:
            client.create_acls([binding])[binding].result(timeout=20)
        assert e.value.args[0].code() == 54


def test_client_quotas_like_kafka_where_kafka_would_store_none(both):
    describes = [
        build(DescribeClientQuotasRequest, 1, components=[], strict=False),
        build(DescribeClientQuotasRequest, 0, components=[{"entity_type": "user", "match_type": 0, "match": "alice"}], strict=True),
        build(DescribeClientQuotasRequest, 1, components=[{"entity_type": "bogus", "match_type": 1, "match": None}], strict=False),
        build(DescribeClientQuotasRequest, 1, components=[{"entity_type": "user", "match_type": 0, "match": None}], strict=False),
        build(DescribeClientQuotasRequest, 1, components=[{"entity_type": "user", "match_type": 1, "match": "x"}], strict=False),
        build(DescribeClientQuotasRequest, 1, components=[{"entity_type": "user", "match_type": 5, "match": None}], strict=False),
        build(DescribeClientQuotasRequest, 1, components=[{"entity_type": "user", "match_type": 1, "match": None},
                                                          {"entity_type": "user", "match_type": 1, "match": None}], strict=False),
        build(DescribeClientQuotasRequest, 1, components=[{"entity_type": "ip", "match_type": 2, "match": None},
                                                          {"entity_type": "user", "match_type": 2, "match": None}], strict=False),
    ]

    def entry(entity, key, value):
        return {"entity": [{"entity_type": t, "entity_name": n} for t, n in entity],
                "ops": [{"key": key, "value": value, "remove": False}]}

    bad = [entry([("user", "carol")], "bogus_rate", 1.0), entry([("bogus", "x")], "producer_byte_rate", 1.0),
           {"entity": [], "ops": []}, entry([("ip", "1.2.3.4")], "producer_byte_rate", 1.0),
           entry([("ip", "1.2.3.4"), ("user", "u")], "connection_creation_rate", 1.0),
           entry([("client-id", None)], "request_percentage", -1.0), entry([("user", "w")], "consumer_byte_rate", 0.5)]
    alter = build(AlterClientQuotasRequest, 1, entries=bad, validate_only=True)
    ours, theirs = ask_both(both, *describes, alter)

    def entries(r):
        return sorted((tuple(sorted((e["entity_type"], e["entity_name"] or "") for e in x["entity"])),
                       x["error_code"], x["error_message"]) for x in r["entries"])

    assert ours[:-1] == theirs[:-1]
    assert entries(ours[-1]) == entries(theirs[-1])
    # A valid quota: Kafka stores it; Sluice stores and enforces none, and says so.
    (o,) = ask(both[0].bootstrap, build(AlterClientQuotasRequest, 1, validate_only=False,
                                        entries=[entry([("user", "alice")], "producer_byte_rate", 1024.0)]))
    (e,) = o["entries"]
    assert e["error_code"] == 42 and "not supported" in e["error_message"]
    (d,) = ask(both[0].bootstrap, describes[0])
    assert d["entries"] == [] and d["error_code"] == 0


def test_scram_credentials_like_kafka_without_credentials(both):
    requests = [
        build(DescribeUserScramCredentialsRequest, 0, users=None),
        build(DescribeUserScramCredentialsRequest, 0, users=[{"name": "alice"}, {"name": "zed"}, {"name": "zed"}]),
        build(AlterUserScramCredentialsRequest, 0, deletions=[{"name": "bob", "mechanism": 1}, {"name": "d", "mechanism": 0}],
              upsertions=[{"name": "e", "mechanism": 1, "iterations": 10, "salt": b"s", "salted_password": b"x"},
                          {"name": "", "mechanism": 2, "iterations": 8192, "salt": b"s", "salted_password": b"x"},
                          {"name": "f", "mechanism": 1, "iterations": 8192, "salt": b"s", "salted_password": b"x"},
                          {"name": "f", "mechanism": 2, "iterations": 8192, "salt": b"s", "salted_password": b"x"},
                          {"name": "g", "mechanism": 1, "iterations": 99999, "salt": b"s", "salted_password": b"x"}]),
    ]
    ours, theirs = ask_both(both, *requests)
    assert ours == theirs
    assert [r["error_code"] for r in ours[2]["results"]] == [93, 91, 33, 93, 92, 93]
    # A valid upsertion: Kafka stores the credential; Sluice, without SASL, keeps none.
    (o,) = ask(both[0].bootstrap, build(AlterUserScramCredentialsRequest, 0, deletions=[], upsertions=[
        {"name": "alice", "mechanism": 1, "iterations": 4096, "salt": b"salt", "salted_password": b"x" * 32}]))
    assert [(r["user"], r["error_code"]) for r in o["results"]] == [("alice", 33)]

    client = admin(both[0].bootstrap)
    assert client.describe_user_scram_credentials().result(timeout=20) == {}
    with pytest.raises(KafkaException) as e:
        client.describe_user_scram_credentials(["alice"])["alice"].result(timeout=20)
    assert e.value.args[0].code() == 91
    assert ScramMechanism.SCRAM_SHA_256.value == 1


# -- The versions raised: what each adds -------------------------------------------------------

def fetch(version, topic, partition, offset):
    return build(FetchRequest, version, replica_id=-1, max_wait_ms=0, min_bytes=0, max_bytes=1 << 20,
                 isolation_level=0, session_id=0, session_epoch=-1, topics=[{
                     "topic": topic, "partitions": [{"partition": partition, "current_leader_epoch": -1,
                                                     "fetch_offset": offset, "last_fetched_epoch": -1,
                                                     "log_start_offset": -1, "partition_max_bytes": 1 << 20}]}],
                 forgotten_topics_data=[], rack_id="")


def values_of(records: bytes) -> list[bytes]:
    out, m = [], MemoryRecords(records)
    while m.has_next():
        for r in m.next_batch():
            out.append(r.value)
    return out


def test_new_versions_of_produce_fetch_list_offsets_and_metadata(both):
    sluice, kafka = both
    # Produce 12 appends like 11; Fetch 15 to 18 (by topic name until 12, by id from 13) read it.
    (p11, p12) = ask(sluice.bootstrap, produce(A, 2, batch([b"p11"], timestamp_ms=TS), version=11),
                     produce(A, 2, batch([b"p12"], timestamp_ms=TS + 1), version=12))
    base = p11["responses"][0]["partition_responses"][0]["base_offset"]
    assert p12["responses"][0]["partition_responses"][0]["base_offset"] == base + 1
    assert p12["responses"][0]["partition_responses"][0]["error_code"] == 0
    (md,) = ask(sluice.bootstrap, build(MetadataRequest, 12, topics=[{"topic_id": None, "name": A}],
                                        allow_auto_topic_creation=False,
                                        include_topic_authorized_operations=False))
    topic_id = md["topics"][0]["topic_id"]
    for version in (15, 16, 17, 18):
        req = fetch(version, A, 2, base)
        if version >= 13:
            req.topics[0].topic_id = topic_id
        (f,) = ask(sluice.bootstrap, req)
        (part,) = f["responses"][0]["partitions"]
        assert part["error_code"] == 0 and part["high_watermark"] == base + 2, (version, part)
        assert values_of(part["records"]) == [b"p11", b"p12"], version

    # ListOffsets 9 and 10: LATEST_TIERED has no offset without tiered storage; 8 may not ask.
    def lo(version, ts):
        return build(ListOffsetsRequest, version, replica_id=-1, isolation_level=0, timeout_ms=1000, topics=[{
            "name": A, "partitions": [{"partition_index": 1, "current_leader_epoch": -1, "timestamp": ts}]}])

    requests = [lo(v, ts) for v in (8, 9, 10) for ts in (-1, -2, -3, -4, -5)] + [lo(6, -3), lo(7, -4)]
    ours, theirs = ask_both(both, *requests)
    assert ours == theirs
    assert ours[9]["topics"][0]["partitions"][0] == {"partition_index": 1, "error_code": 0, "timestamp": -1,
                                                     "offset": -1, "leader_epoch": -1}
    assert ours[4]["topics"][0]["partitions"][0]["error_code"] == 35

    # Metadata 13: the top-level error code, 0 on both.
    req = build(MetadataRequest, 13, topics=[{"topic_id": None, "name": A}], allow_auto_topic_creation=False,
                include_topic_authorized_operations=False)
    (o,), (k,) = ask_both(both, req)
    assert o["error_code"] == 0 == k["error_code"]
    assert [p["partition_index"] for p in o["topics"][0]["partitions"]] == [0, 1, 2]
