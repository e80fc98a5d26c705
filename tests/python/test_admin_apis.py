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
import socket
import struct
import time
import uuid

import pytest
from confluent_kafka import KafkaException, TopicCollection, TopicPartition
from confluent_kafka.admin import (AclBinding, NewTopic, AclBindingFilter, AclOperation, AclPermissionType,
                                   OffsetSpec, ResourcePatternType, ResourceType, ScramMechanism,
                                   UserScramCredentialDeletion)
from kafka.protocol.admin.acl import CreateAclsRequest, DeleteAclsRequest, DescribeAclsRequest
from kafka.protocol.admin.client_quotas import AlterClientQuotasRequest, DescribeClientQuotasRequest
from kafka.protocol.admin.cluster import AlterReplicaLogDirsRequest, DescribeClusterRequest, DescribeLogDirsRequest
from kafka.protocol.admin.configs import (AlterConfigsRequest, DescribeConfigsRequest, IncrementalAlterConfigsRequest,
                                         ListConfigResourcesRequest)
from kafka.protocol.admin.topics import (CreatePartitionsRequest, CreateTopicsRequest, DeleteRecordsRequest,
                                        DeleteTopicsRequest, DescribeTopicPartitionsRequest)
from kafka.protocol.admin.transactions import (DescribeProducersRequest, DescribeTransactionsRequest,
                                              ListTransactionsRequest)
from kafka.protocol.admin.users import AlterUserScramCredentialsRequest, DescribeUserScramCredentialsRequest
from kafka.protocol.consumer.fetch import FetchRequest
from kafka.protocol.consumer.offsets import ListOffsetsRequest, OffsetForLeaderEpochRequest
from kafka.protocol.metadata.api_versions import ApiVersionsRequest
from kafka.protocol.metadata.metadata import MetadataRequest
from kafka.protocol.producer import InitProducerIdRequest
from kafka.protocol.producer.produce import ProduceRequest
from kafka.record import MemoryRecords

from harness import admin, producer
from wire import Pipeline, batch, build

KAFKA_PROPS = {"auto.create.topics.enable": "false"}

# Every API and version range Sluice implements (api key: (min, max)); a change to the table in
# broker/src/codec/mod.rs must come with a test of what it adds (ListGroups 5, its type filter:
# test_group_kafka.py; ElectLeaders: test_replication.py; Alter/ListPartitionReassignments:
# test_reassignment.py; the transaction APIs: test_transactions.py; TxnOffsetCommit:
# test_exactly_once.py; the KIP-890 versions (InitProducerId 5, AddPartitionsToTxn 4-5,
# AddOffsetsToTxn 4, TxnOffsetCommit 5, EndTxn 5): broker/tests/transaction_version2.rs and the
# Java client's TxnTest at transaction version 2; DescribeTransactions and
# ListTransactions: test_describe_and_list_transactions_like_kafka here and
# test_transactions_admin.py; Produce 13, topics by id: broker/tests/produce_topic_ids.rs and the Java
# client, which sends it; ListOffsets 11, DescribeLogDirs 5 and UpdateFeatures:
# test_features_kafka.py; SaslHandshake and SaslAuthenticate: test_sasl.py).
EXPECTED_APIS = {
    0: (3, 13), 1: (4, 18), 2: (1, 11), 3: (0, 13), 8: (2, 10), 9: (1, 10), 10: (0, 6), 11: (0, 9),
    12: (0, 4), 13: (0, 5), 14: (0, 5), 15: (0, 6), 16: (0, 5), 17: (0, 1), 18: (0, 5), 19: (2, 7),
    20: (1, 6), 21: (0, 2), 22: (0, 5), 23: (2, 4), 24: (0, 5), 25: (0, 4), 26: (0, 5), 27: (1, 2), 28: (0, 6), 29: (1, 3), 30: (1, 3), 31: (1, 3), 32: (1, 4),
    33: (0, 2), 34: (1, 2), 35: (1, 5), 36: (0, 2), 37: (0, 3), 42: (0, 3), 43: (0, 2), 44: (0, 1), 45: (0, 1),
    46: (0, 0), 47: (0, 0), 48: (0, 1),
    49: (0, 1), 50: (0, 0), 51: (0, 0), 55: (0, 2), 57: (0, 2), 60: (0, 2), 61: (0, 0), 65: (0, 0), 66: (0, 2),
    68: (0, 1), 69: (0, 1),
    74: (0, 1), 75: (0, 0),
    # Share groups (KIP-932): ShareGroupHeartbeat, ShareGroupDescribe, ShareFetch, ShareAcknowledge,
    # DescribeShareGroupOffsets, AlterShareGroupOffsets, DeleteShareGroupOffsets.
    76: (1, 1), 77: (1, 1), 78: (1, 2), 79: (1, 2), 90: (0, 1), 91: (0, 0), 92: (0, 0),
    # The share coordinator's, which share partition leaders send: InitializeShareGroupState,
    # ReadShareGroupState, WriteShareGroupState, DeleteShareGroupState,
    # ReadShareGroupStateSummary.
    83: (0, 0), 84: (0, 0), 85: (0, 0), 86: (0, 0), 87: (0, 0),
    # Streams groups (KIP-1071): StreamsGroupHeartbeat, StreamsGroupDescribe.
    88: (0, 0), 89: (0, 0),
}
METADATA_VERSION_4_0 = 25
TOPIC_OPERATIONS_ALL = 3576

A, B = "admin-a", "admin-b"  # 3 and 2 partitions on both brokers
EPOCHS = "admin-epochs"
VERSIONS = "admin-versions"
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
        # Every API Sluice has at the newest version Kafka 4.4 has; the minimum is Kafka's
        # (Produce keeps 3, as Kafka now refuses 0-2 though it still lists them for librdkafka's
        # sake).
        # WriteShareGroupState and ReadShareGroupStateSummary 1 add a delivery-complete count
        # that only Kafka's own brokers send one another: Sluice's brokers speak 0. The streams
        # group APIs' version 1 adds the topology description (KIP-1331), not served yet.
        older = {85: 0, 87: 0, 88: 0, 89: 0}
        assert key in kafka_table and hi == older.get(key, kafka_table[key][1]), (key, hi, kafka_table.get(key))
        assert lo == kafka_table[key][0] or (key == 0 and lo == 3), (key, lo, kafka_table[key])

    finalized = {f["name"]: (f["min_version_level"], f["max_version_level"]) for f in v4["finalized_features"]}
    assert finalized == {"metadata.version": (METADATA_VERSION_4_0, METADATA_VERSION_4_0),
                         "eligible.leader.replicas.version": (1, 1), "group.version": (1, 1),
                         "transaction.version": (2, 2), "share.version": (1, 1),
                         "streams.version": (1, 1)}
    kafka_finalized = {f["name"]: f["max_version_level"] for f in k4["finalized_features"]}
    assert kafka_finalized["metadata.version"] >= METADATA_VERSION_4_0
    assert kafka_finalized["group.version"] == 1
    # A new Kafka 4 cluster runs transaction version 2, as Sluice does by default.
    assert kafka_finalized["transaction.version"] == 2
    assert v4["finalized_features_epoch"] >= 0 and k4["finalized_features_epoch"] >= 0
    supported = {f["name"]: (f["min_version"], f["max_version"]) for f in v4["supported_features"]}
    assert supported == {"metadata.version": (METADATA_VERSION_4_0, METADATA_VERSION_4_0),
                         "kraft.version": (0, 0), "eligible.leader.replicas.version": (1, 1),
                         "group.version": (1, 1), "transaction.version": (0, 2), "share.version": (0, 1),
                         "streams.version": (0, 1)}
    # Version 3 leaves out supported ranges that start at 0 (KAFKA-17011), on both brokers;
    # finalized features are the same as in version 4.
    for r3, r4 in ((v3, v4), (k3, k4)):
        want = [f for f in r4["supported_features"] if f["min_version"] > 0]
        assert r3["supported_features"] == want
        assert r3["finalized_features"] == r4["finalized_features"]
        assert r3["api_keys"] == r4["api_keys"]
    # Versions 0 to 2 (no features, no flexible fields) list the same APIs, on both brokers.
    old_versions = [build(ApiVersionsRequest, v) for v in (0, 1, 2)]
    for b, r4 in ((sluice, v4), (kafka, k4)):
        for r in ask(b.bootstrap, *old_versions):
            assert r["error_code"] == 0 and r["api_keys"] == r4["api_keys"], b.bootstrap


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
        # 3 adds the top-level error code (4 the volume's sizes).
        build(DescribeLogDirsRequest, 3, topics=[{"topic": B, "partitions": [1]}, {"topic": A, "partitions": [1, 5]}]),
    ]
    # Other tests write and delete beside this one (over 100 MB in a second under CI), so the free
    # space each broker reports is checked against readings taken before and after it answered.
    def usable_now(b):
        st = os.statvfs(log_dir_of(b))
        return st.f_bavail * st.f_frsize
    before = {id(b): usable_now(b) for b in both}
    ours, theirs = ask_both(both, *requests)
    after = {id(b): usable_now(b) for b in both}
    assert [r.get("error_code") for r in ours] == [0, 0, None, 0]
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
                low, high = sorted((before[id(b)], after[id(b)]))
                assert low - (64 << 20) < usable < high + (64 << 20), (usable, low, high)
    assert ours == theirs
    # The same batch, appended alike, takes the same bytes on both.
    sizes = {p["partition_index"]: p["partition_size"] for p in ours[0]["results"][0]["topics"][0]["partitions"]}
    assert sizes == {0: 0, 1: 2 * len(records)}
    v3 = {(t["name"], p["partition_index"]): p["partition_size"] for t in ours[3]["results"][0]["topics"]
          for p in t["partitions"]}
    assert v3 == {(A, 1): 2 * len(records), (B, 1): 0}

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


# -- DescribeTransactions, ListTransactions ------------------------------------------------------

def test_describe_and_list_transactions_like_kafka(both):
    """An open transaction (librdkafka's transactional producer, the same transactional id on both
    brokers) described and listed with every filter at every version: the answers are equal but
    for the producer id and the start time, which each broker chooses."""
    tid = f"admin-txn-{uuid.uuid4().hex[:6]}"
    producers = []
    for b in both:
        p = producer(b.bootstrap, **{"transactional.id": tid, "enable.idempotence": True,
                                    "transaction.timeout.ms": 600_000})
        p.init_transactions(30)
        p.begin_transaction()
        p.produce(B, value=b"t0", partition=1)
        p.produce(B, value=b"t1", partition=0)
        assert p.flush(30) == 0
        producers.append(p)

    (ours,), (theirs,) = ask_both(both, build(DescribeTransactionsRequest, 0,
                                              transactional_ids=[tid, "admin-no-such-txn"]))
    pids = []
    for r in (ours, theirs):
        found, missing = r["transaction_states"]
        pids.append(found.pop("producer_id"))
        assert abs(found.pop("transaction_start_time_ms") - time.time() * 1000) < 120_000
        found["topics"] = sorted((t["topic"], sorted(t["partitions"])) for t in found["topics"])
        r.pop("throttle_time_ms")
    assert ours == theirs
    found, missing = ours["transaction_states"]
    assert found == {"error_code": 0, "transactional_id": tid, "transaction_state": "Ongoing",
                     "transaction_timeout_ms": 600_000, "producer_epoch": 0, "topics": [(B, [0, 1])]}
    assert missing["error_code"] == 105  # TRANSACTIONAL_ID_NOT_FOUND

    for version, extra in ((0, {}), (1, {"duration_filter": -1}), (2, {"duration_filter": -1, "transactional_id_pattern": None})):
        for states, pid_filter, more in (
                (["Ongoing"], None, {}), (["CompleteCommit", "Bogus"], None, {}), ([], "own", {}),
                ([], None, {"duration_filter": 3_600_000}), ([], None, {"transactional_id_pattern": "admin-txn-.*"}),
                ([], None, {"transactional_id_pattern": "dmin-txn-.*"})):
            if any(k not in extra for k in more):
                continue
            answers = []
            for b, pid in zip(both, pids):
                (r,) = ask(b.bootstrap, build(ListTransactionsRequest, version, state_filters=states,
                                              producer_id_filters=[pid] if pid_filter else [], **{**extra, **more}))
                r.pop("throttle_time_ms")
                # Only this test's transaction: other tests of the module may leave theirs.
                r["transaction_states"] = [t for t in r["transaction_states"] if t["transactional_id"] == tid]
                for t in r["transaction_states"]:
                    assert t.pop("producer_id") == pid
                answers.append(r)
            assert answers[0] == answers[1], (version, states, pid_filter, more)
    for p in producers:
        p.abort_transaction(30)


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
    # Every advertised version of each: 2 is the first flexible one, 3 adds the USER resource type
    # (sent in the last request of each).
    user_filter = dict(any_filter, resource_type_filter=7, resource_name_filter="alice")
    user_creation = dict(creation, resource_type=7, resource_name="alice")
    requests = ([build(DescribeAclsRequest, v, **any_filter) for v in (1, 2, 3)]
                + [build(DescribeAclsRequest, 3, **user_filter)]
                + [build(CreateAclsRequest, v, creations=[creation, creation]) for v in (1, 2, 3)]
                + [build(CreateAclsRequest, 3, creations=[user_creation])]
                + [build(DeleteAclsRequest, v, filters=[any_filter, any_filter]) for v in (1, 2, 3)]
                + [build(DeleteAclsRequest, 3, filters=[user_filter])])
    ours, theirs = ask_both(both, *requests)
    assert ours == theirs
    describes, creates, deletes = ours[0:4], ours[4:8], ours[8:12]
    assert [r["error_code"] for r in describes] == [54] * 4
    assert [[r["error_code"] for r in c["results"]] for c in creates] == [[54, 54]] * 3 + [[54]]
    assert [[(r["error_code"], r["matching_acls"]) for r in d["filter_results"]] for d in deletes] == \
        [[(54, [])] * 2] * 3 + [[(54, [])]]

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


def test_client_quotas_like_kafka(both):
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
    # Both versions of AlterClientQuotas (1 is 0, flexible).
    alters = [build(AlterClientQuotasRequest, v, entries=bad, validate_only=True) for v in (0, 1)]
    ours, theirs = ask_both(both, *describes, *alters)

    def entries(r):
        return sorted((tuple(sorted((e["entity_type"], e["entity_name"] or "") for e in x["entity"])),
                       x["error_code"], x["error_message"]) for x in r["entries"])

    n = len(describes)
    assert ours[:n] == theirs[:n]
    for o, k in zip(ours[n:], theirs[n:]):
        assert entries(o) == entries(k)
        assert len(o["entries"]) == len(bad) and {x["error_code"] for x in o["entries"]} == {42}
    assert entries(ours[n]) == entries(ours[n + 1])
    # Valid quotas: validated only, then stored, by both alike (and removed after, since both
    # brokers serve the module's other tests and would hold their clients to them).
    valid = [entry([("user", "alice")], "producer_byte_rate", 1024.0),
             entry([("user", None)], "consumer_byte_rate", 2048.0),
             entry([("user", "alice"), ("client-id", "c1")], "request_percentage", 12.5),
             entry([("client-id", None), ("user", None)], "producer_byte_rate", 8192.0),
             entry([("client-id", None)], "producer_byte_rate", 4096.0),
             entry([("ip", "10.1.2.3")], "connection_creation_rate", 7.0)]
    removals = [{"entity": e["entity"], "ops": [dict(op, remove=True) for op in e["ops"]]} for e in valid]
    try:
        quotas_like_kafka(both, valid, entries, describes)
    finally:
        ask_both(both, build(AlterClientQuotasRequest, 1, validate_only=False, entries=removals))


def quotas_like_kafka(both, valid, entries, describes):
    for validate_only in (True, False):
        ours, theirs = ask_both(both, build(AlterClientQuotasRequest, 1, validate_only=validate_only, entries=valid))
        assert entries(ours[0]) == entries(theirs[0])
        assert [x["error_code"] for x in ours[0]["entries"]] == [0] * len(valid)
        if validate_only:
            (d,) = ask(both[0].bootstrap, describes[0])
            assert d["entries"] == [], "validate_only stores nothing"

    def described(r):
        assert r["error_code"] == 0, r
        # A default entity (a null name) shown as "<default>", as kafka-configs shows it.
        return sorted((tuple(sorted((e["entity_type"], e["entity_name"] or "<default>") for e in x["entity"])),
                       tuple(sorted((v["key"], v["value"]) for v in x["values"])))
                      for x in r["entries"])

    component = lambda t, m, name=None: {"entity_type": t, "match_type": m, "match": name}
    filters = [
        build(DescribeClientQuotasRequest, 1, components=[], strict=False),
        build(DescribeClientQuotasRequest, 1, components=[component("user", 0, "alice")], strict=False),
        build(DescribeClientQuotasRequest, 1, components=[component("user", 0, "alice")], strict=True),
        build(DescribeClientQuotasRequest, 1, components=[component("user", 1)], strict=False),
        build(DescribeClientQuotasRequest, 1, components=[component("user", 2)], strict=False),
        build(DescribeClientQuotasRequest, 1, components=[component("client-id", 1)], strict=True),
        build(DescribeClientQuotasRequest, 1, components=[component("user", 1), component("client-id", 1)], strict=True),
        build(DescribeClientQuotasRequest, 0, components=[component("ip", 2)], strict=False),
        build(DescribeClientQuotasRequest, 1, components=[component("user", 0, "nobody")], strict=False),
    ]
    # Kafka's broker may take a moment to see what its controller committed.
    deadline = time.time() + 20
    while True:
        ours, theirs = ask_both(both, *filters)
        if len(theirs[0]["entries"]) == len(valid) or time.time() > deadline:
            break
        time.sleep(0.2)
    assert [described(r) for r in ours] == [described(r) for r in theirs]
    assert len(described(ours[0])) == len(valid)
    assert described(ours[2]) == [((("user", "alice"),), (("producer_byte_rate", 1024.0),))]
    assert described(ours[6]) == [((("client-id", "<default>"), ("user", "<default>")), (("producer_byte_rate", 8192.0),))]
    # Removing a key; an entity left without keys is gone.
    remove = {"entity": [{"entity_type": "user", "entity_name": "alice"}],
              "ops": [{"key": "producer_byte_rate", "value": 0.0, "remove": True}]}
    ours, theirs = ask_both(both, build(AlterClientQuotasRequest, 1, validate_only=False, entries=[remove]))
    assert entries(ours[0]) == entries(theirs[0]) and ours[0]["entries"][0]["error_code"] == 0
    deadline = time.time() + 20
    while True:
        ours, theirs = ask_both(both, filters[2])
        if theirs[0]["entries"] == [] or time.time() > deadline:
            break
        time.sleep(0.2)
    assert ours[0]["entries"] == theirs[0]["entries"] == []


def test_scram_credentials_like_kafka(both):
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
    # A valid upsertion: both store the credential, SASL listener or not, and describe it.
    upsert = build(AlterUserScramCredentialsRequest, 0, deletions=[], upsertions=[
        {"name": "alice", "mechanism": 1, "iterations": 4096, "salt": b"salt", "salted_password": b"x" * 32}])
    ours, theirs = ask_both(both, upsert)
    assert ours == theirs
    assert [(r["user"], r["error_code"]) for r in ours[0]["results"]] == [("alice", 0)]
    # Kafka's broker may take a moment to see what its controller committed.
    deadline = time.time() + 20
    while True:
        ours, theirs = ask_both(both, *requests[:2])
        if theirs[0]["results"] or time.time() > deadline:
            break
        time.sleep(0.2)
    assert ours == theirs
    assert [(r["user"], r["error_code"]) for r in ours[1]["results"]] == [("zed", 92), ("alice", 0)]
    assert ours[1]["results"][1]["credential_infos"] == [{"mechanism": 1, "iterations": 4096}]

    client = admin(both[0].bootstrap)
    described = client.describe_user_scram_credentials().result(timeout=20)
    assert [(i.mechanism.value, i.iterations) for i in described["alice"].scram_credential_infos] == [(1, 4096)]
    deleted = client.alter_user_scram_credentials([UserScramCredentialDeletion("alice", ScramMechanism.SCRAM_SHA_256)])
    deleted["alice"].result(timeout=20)
    with pytest.raises(KafkaException) as e:
        client.describe_user_scram_credentials(["alice"])["alice"].result(timeout=20)
    assert e.value.args[0].code() == 91
    assert ScramMechanism.SCRAM_SHA_256.value == 1


# -- The versions raised: what each adds -------------------------------------------------------

def fetch(version, topic, partition, offset, isolation_level=0, more=()):
    """A Fetch of `partition` from `offset`, and of each (partition, offset) in `more`."""
    return build(FetchRequest, version, replica_id=-1, max_wait_ms=0, min_bytes=0, max_bytes=1 << 20,
                 isolation_level=isolation_level, session_id=0, session_epoch=-1, topics=[{
                     "topic": topic, "partitions": [{"partition": p, "current_leader_epoch": -1,
                                                     "fetch_offset": o, "last_fetched_epoch": -1,
                                                     "log_start_offset": -1, "partition_max_bytes": 1 << 20}
                                                    for p, o in [(partition, offset), *more]]}],
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


# -- Every advertised version, not only the newest ----------------------------------------------

def broker_fields(b, r: dict, brokers_key: str, id_key: str) -> None:
    """Checks that a response's broker list names `b` alone, at its own port, and takes the list out
    (each broker has its own port)."""
    (node,) = r.pop(brokers_key)
    assert (node[id_key], node["host"], node["port"]) == (1, "127.0.0.1", b.port), node
    assert node.get("rack") is None, node


def test_every_version_of_produce_fetch_list_offsets_metadata_and_more_like_kafka(both):
    # A topic of its own, made after Sluice's restart above, so leader epochs are alike (0).
    sluice, kafka = both
    for b in both:
        create_and_wait(b.bootstrap, VERSIONS, 1)

    # Produce 3 to 12, a batch each: the same offsets, log start and errors on both.
    values = [b"v%d" % v for v in range(3, 13)]
    produces = [produce(VERSIONS, 0, batch([b"v%d" % v], timestamp_ms=TS + v), version=v) for v in range(3, 13)]
    ours, theirs = ask_both(both, *produces)
    for b, rs in ((sluice, ours), (kafka, theirs)):
        for r in rs:
            for p in r["responses"][0]["partition_responses"]:
                if p.get("node_endpoints"):
                    broker_fields(b, p, "node_endpoints", "node_id")
    assert ours == theirs
    assert [r["responses"][0]["partition_responses"][0]["base_offset"] for r in ours] == list(range(10))
    assert {r["responses"][0]["partition_responses"][0]["error_code"] for r in ours} == {0}

    # Fetch 4 to 18 (by topic id from 13), each version three times: every record and a
    # partition that does not exist (read uncommitted), every record read committed, and an
    # offset past the end. The same answers, batch bytes included.
    def fetches(b):
        (md,) = ask(b.bootstrap, build(MetadataRequest, 12, topics=[{"topic_id": None, "name": VERSIONS}],
                                       allow_auto_topic_creation=False, include_topic_authorized_operations=False))
        topic_id = md["topics"][0]["topic_id"]
        requests = []
        for version in range(4, 19):
            for req in (fetch(version, VERSIONS, 0, 0, more=[(9, 0)]), fetch(version, VERSIONS, 0, 0, isolation_level=1),
                        fetch(version, VERSIONS, 0, 99)):
                if version >= 13:
                    req.topics[0].topic_id = topic_id
                requests.append(req)
        return requests

    ours, theirs = ask(sluice.bootstrap, *fetches(sluice)), ask(kafka.bootstrap, *fetches(kafka))
    for rs in (ours, theirs):
        for r in rs:
            for t in r["responses"]:
                if "topic_id" in t:
                    t["topic_id"] = t["topic_id"] is not None and t["topic_id"].int != 0
    assert ours == theirs
    for version, (uncommitted, committed, past) in zip(range(4, 19), zip(*[iter(ours)] * 3)):
        (part, unknown) = uncommitted["responses"][0]["partitions"]
        assert (part["error_code"], part["high_watermark"]) == (0, 10), (version, part)
        assert values_of(part["records"]) == values, version
        assert unknown["error_code"] == 3, (version, unknown)
        (part,) = committed["responses"][0]["partitions"]
        assert (part["error_code"], part["last_stable_offset"]) == (0, 10), (version, part)
        assert values_of(part["records"]) == values, version
        (part,) = past["responses"][0]["partitions"]
        assert part["error_code"] == 1 and not part["records"], (version, part)

    # ListOffsets 1 to 10: latest, earliest and by timestamp (v7's record, offset 4).
    def lo(version, ts):
        return build(ListOffsetsRequest, version, replica_id=-1, isolation_level=0, timeout_ms=1000, topics=[{
            "name": VERSIONS, "partitions": [{"partition_index": 0, "current_leader_epoch": -1, "timestamp": ts}]}])

    requests = [lo(v, ts) for v in range(1, 11) for ts in (-1, -2, TS + 7)]
    ours, theirs = ask_both(both, *requests)
    assert ours == theirs
    assert [r["topics"][0]["partitions"][0]["offset"] for r in ours] == [10, 0, 4] * 10

    # Metadata 0 to 13: the same topic, partition, leader and epoch; brokers at their own ports.
    def md(version, names):
        return build(MetadataRequest, version, topics=[{"topic_id": None, "name": n} for n in names],
                     allow_auto_topic_creation=False, include_cluster_authorized_operations=False,
                     include_topic_authorized_operations=False)

    # Before 4 a request may not refuse auto creation, so only the existing topic is asked for.
    requests = [md(v, [VERSIONS] if v < 4 else [VERSIONS, "admin-none"]) for v in range(0, 14)]
    ours, theirs = ask_both(both, *requests)
    for b, rs in ((sluice, ours), (kafka, theirs)):
        for r in rs:
            broker_fields(b, r, "brokers", "node_id")
            if "cluster_id" in r:
                r["cluster_id"] = bool(r["cluster_id"])
            for t in r["topics"]:
                if "topic_id" in t:
                    t["topic_id"] = t["topic_id"] is not None and t["topic_id"].int != 0
            r["topics"].sort(key=lambda t: t["name"])
    assert ours == theirs
    for version, r in enumerate(ours):
        # Sorted by name: "admin-none" (from 4) before this test's topic.
        assert [t["error_code"] for t in r["topics"]] == ([0] if version < 4 else [3, 0]), version
        (part,) = r["topics"][-1]["partitions"]
        assert (part["error_code"], part["leader_id"], part["replica_nodes"], part["isr_nodes"]) == (0, 1, [1], [1])

    # DescribeCluster 0 to 2 (2 with and without fenced brokers, KIP-1073: none is fenced).
    requests = [build(DescribeClusterRequest, v, include_cluster_authorized_operations=False, endpoint_type=1,
                      include_fenced_brokers=fenced) for v, fenced in ((0, False), (1, False), (2, False), (2, True))]
    ours, theirs = ask_both(both, *requests)
    assert [b["is_fenced"] for b in ours[3]["brokers"]] == [False]
    for b, rs in ((sluice, ours), (kafka, theirs)):
        for r in rs:
            broker_fields(b, r, "brokers", "broker_id")
            r["cluster_id"] = bool(r["cluster_id"])
    assert ours == theirs
    assert [(r["error_code"], r["controller_id"]) for r in ours] == [(0, 1)] * 4

    # DeleteRecords 0 to 2: the log start moves to 2, then 4, then stays.
    requests = [build(DeleteRecordsRequest, v, timeout_ms=30_000, topics=[{"name": VERSIONS, "partitions": [
        {"partition_index": 0, "offset": offset}, {"partition_index": 9, "offset": 0}]}])
        for v, offset in ((0, 2), (1, 4), (2, 3))]
    ours, theirs = ask_both(both, *requests)
    assert ours == theirs
    got = [[(p["partition_index"], p["error_code"], p["low_watermark"]) for p in r["topics"][0]["partitions"]]
           for r in ours]
    assert got == [[(0, 0, 2), (9, 3, -1)], [(0, 0, 4), (9, 3, -1)], [(0, 0, 4), (9, 3, -1)]]

    # InitProducerId 0 to 4 without a transactional id: a new producer id each, epoch 0. A
    # Kafka broker that has no block of producer ids yet answers COORDINATOR_LOAD_IN_PROGRESS
    # (14, retriable) until the controller gives it one.
    requests = [build(InitProducerIdRequest, v, transactional_id=None, transaction_timeout_ms=60_000,
                      producer_id=-1, producer_epoch=-1) for v in range(0, 5)]
    deadline = time.monotonic() + 30
    for b in both:
        while (code := ask(b.bootstrap, requests[-1])[0]["error_code"]) == 14 and time.monotonic() < deadline:
            time.sleep(0.2)
        assert code == 0, (b.bootstrap, code)
    ours, theirs = ask_both(both, *requests)
    for rs in (ours, theirs):
        ids = [r.pop("producer_id") for r in rs]
        assert len(set(ids)) == 5 and min(ids) >= 0, ids
    assert ours == theirs
    assert {(r["error_code"], r["producer_epoch"]) for r in ours} == {(0, 0)}


def test_every_version_of_the_topic_and_config_admin_apis_like_kafka(both):
    # Nothing changes: creations, new partitions and config changes only validate, and the
    # topic deleted does not exist.
    new = {"name": "admin-validated", "num_partitions": 2, "replication_factor": 1, "assignments": [],
           "configs": [{"name": "retention.ms", "value": "1000"}]}
    existing = dict(new, name=A)
    creates = [build(CreateTopicsRequest, v, topics=[new, existing], timeout_ms=30_000, validate_only=True)
               for v in range(2, 8)]
    grows = [build(CreatePartitionsRequest, v, topics=[{"name": A, "count": 3, "assignments": None},
                                                       {"name": B, "count": 4, "assignments": None},
                                                       {"name": "admin-none", "count": 2, "assignments": None}],
                   timeout_ms=30_000, validate_only=True) for v in range(0, 4)]
    deletes = [build(DeleteTopicsRequest, v, topic_names=["admin-none"], topics=[{"name": "admin-none", "topic_id": None}],
                     timeout_ms=30_000) for v in range(1, 7)]
    deletes.append(build(DeleteTopicsRequest, 6, topics=[{"name": None, "topic_id": uuid.uuid4()}], timeout_ms=30_000))
    keys = ["cleanup.policy", "max.message.bytes", "segment.bytes"]
    describes = [build(DescribeConfigsRequest, v, include_synonyms=True, include_documentation=True, resources=[
        {"resource_type": 2, "resource_name": A, "configuration_keys": keys},
        {"resource_type": 2, "resource_name": "admin-none", "configuration_keys": keys}]) for v in range(1, 5)]
    changes = [{"resource_type": 2, "resource_name": A, "configs": [
                   {"name": "retention.ms", "config_operation": 0, "value": "1000"}]},
               {"resource_type": 2, "resource_name": B, "configs": [
                   {"name": "retention.ms", "config_operation": 0, "value": "soon"}]},
               {"resource_type": 2, "resource_name": "admin-none", "configs": [
                   {"name": "retention.ms", "config_operation": 0, "value": "1000"}]}]
    incremental = [build(IncrementalAlterConfigsRequest, v, resources=changes, validate_only=True) for v in (0, 1)]
    legacy_changes = [dict(c, configs=[{"name": x["name"], "value": x["value"]} for x in c["configs"]]) for c in changes]
    legacy = [build(AlterConfigsRequest, v, resources=legacy_changes, validate_only=True) for v in (0, 1, 2)]
    requests = creates + grows + deletes + describes + incremental + legacy
    ours, theirs = ask_both(both, *requests)
    n_creates, n_describes = len(creates), len(describes)
    first_describe = len(creates) + len(grows) + len(deletes)
    for rs in (ours, theirs):
        for r in rs[:n_creates]:
            for t in r["topics"]:
                if "topic_id" in t:
                    t["topic_id"] = t["topic_id"] is not None and t["topic_id"].int != 0
                # From version 5 Kafka lists the configs of the topic it would create; Sluice
                # does not yet.
                t.pop("configs", None)
        for r in rs[first_describe:first_describe + n_describes]:
            for result in r["results"]:
                # Sluice documents configs in its own words, and lists them in another order.
                for c in result["configs"]:
                    c.pop("documentation", None)
                result["configs"].sort(key=lambda c: c["name"])
        for r in rs[first_describe + n_describes:]:
            # The message for a value Kafka cannot parse is Kafka's own wording.
            r["responses"][1].pop("error_message")
    for i, (o, k) in enumerate(zip(ours, theirs)):
        assert o == k, (i, requests[i])

    ours = iter(ours)
    for _ in creates:
        # 36 TOPIC_ALREADY_EXISTS.
        assert [t["error_code"] for t in next(ours)["topics"]] == [0, 36]
    for _ in grows:
        # 37 INVALID_PARTITIONS (already 3), 3 UNKNOWN_TOPIC_OR_PARTITION.
        assert [t["error_code"] for t in next(ours)["results"]] == [37, 0, 3]
    # 100 UNKNOWN_TOPIC_ID, for the deletion by id.
    assert [[t["error_code"] for t in next(ours)["responses"]] for _ in deletes] == [[3]] * 6 + [[100]]
    for v in range(1, 5):
        r = next(ours)
        assert [x["error_code"] for x in r["results"]] == [0, 3], v
        assert [(c["name"], c["value"]) for c in r["results"][0]["configs"]] == [
            ("cleanup.policy", "delete"), ("max.message.bytes", "1048588"), ("segment.bytes", "1073741824")], v
    for _ in incremental + legacy:
        # 40 INVALID_CONFIG.
        assert [t["error_code"] for t in next(ours)["responses"]] == [0, 40, 3]


def api_versions_v5(bootstrap: str, cluster_id: str | None, node_id: int) -> tuple[int, int, bytes]:
    """ApiVersions version 5 (KIP-1242: the client names the cluster and node it means to reach),
    sent as raw bytes (kafka-python stops at 4): its error code, how many APIs it lists and the
    bytes after the API list."""
    def compact(s: str | None) -> bytes:
        if s is None:
            return b"\x00"
        b = s.encode()
        return bytes([len(b) + 1]) + b
    body = compact("sluice-test") + compact("1") + compact(cluster_id) + struct.pack(">i", node_id) + b"\x00"
    header = struct.pack(">hhi", 18, 5, 7) + struct.pack(">h", 4) + b"test" + b"\x00"
    host, port = bootstrap.rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=10) as s:
        frame = header + body
        s.sendall(struct.pack(">i", len(frame)) + frame)
        size = struct.unpack(">i", s.recv(4, socket.MSG_WAITALL))[0]
        data = s.recv(size, socket.MSG_WAITALL)
    assert struct.unpack(">i", data[:4])[0] == 7
    error = struct.unpack(">h", data[4:6])[0]
    count = data[6] - 1  # a compact array's length (under 127 entries here)
    return error, count, data[7 + count * 7:]


def test_api_versions_5_checks_the_cluster_and_node_the_client_names_as_kafka(both):
    sluice, kafka = both
    got = {}
    for name, b in (("sluice", sluice), ("kafka", kafka)):
        client = admin(b.bootstrap)  # kept alive until the answer is in
        cid = client.describe_cluster().result(timeout=10).cluster_id
        cases = {"none": (None, -1), "node-without-cluster": (None, 1), "right": (cid, 1),
                 "other-cluster": ("AAAAAAAAAAAAAAAAAAAAAA", 1), "other-node": (cid, 7), "cluster-only": (cid, -1)}
        got[name] = {case: api_versions_v5(b.bootstrap, *args) for case, args in cases.items()}
    # Error code and whether APIs are listed: the same on both (each lists its own APIs).
    seen = {name: {case: (error, count > 0) for case, (error, count, _) in answers.items()}
            for name, answers in got.items()}
    assert seen["sluice"] == seen["kafka"] == {
        "none": (0, True), "right": (0, True), "node-without-cluster": (42, False), "cluster-only": (42, False),
        "other-cluster": (129, False), "other-node": (129, False)}, seen
    # Answered, version 5 lists exactly what version 4 lists.
    (v4,) = ask(sluice.bootstrap, build(ApiVersionsRequest, 4, client_software_name="t", client_software_version="1"))
    assert got["sluice"]["right"][1] == len(v4["api_keys"]) == len(EXPECTED_APIS)
