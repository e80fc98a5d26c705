"""Requests pipelined on one connection see the effects of the ones before them, as in Kafka.

Kafka handles one request of a connection at a time, so a ListOffsets sent right behind a
DeleteRecords, without waiting for its answer, sees the new log start offset; clients depend on
it. Sluice runs a connection's requests concurrently (pipelined produces share fdatasyncs), but
each request starts only once the earlier ones took effect (`broker/src/handlers/order.rs`). The same
sequence of mixed requests, written to the socket in one go, goes to Sluice and to Apache Kafka
4.x; both must answer what a one-at-a-time broker answers.
"""

from __future__ import annotations

import time

from kafka.protocol.admin.configs import DescribeConfigsRequest, IncrementalAlterConfigsRequest
from kafka.protocol.admin.topics import CreatePartitionsRequest, DeleteRecordsRequest, DeleteTopicsRequest
from kafka.protocol.consumer.fetch import FetchRequest
from kafka.protocol.consumer.group import OffsetCommitRequest, OffsetFetchRequest
from kafka.protocol.consumer.offsets import ListOffsetsRequest
from kafka.protocol.metadata.find_coordinator import FindCoordinatorRequest
from kafka.protocol.metadata.metadata import MetadataRequest
from kafka.protocol.producer.produce import ProduceRequest
from kafka.record import MemoryRecords

from harness import create_topic
from wire import Pipeline, batch, build

EARLIEST, LATEST = -2, -1
TOPIC_RESOURCE = 2


def produce(topic, partition, values):
    return build(ProduceRequest, 9, acks=-1, timeout_ms=30_000, topic_data=[{
        "name": topic, "partition_data": [{"index": partition, "records": batch(values)}]}])


def list_offsets(topic, timestamp):
    return build(ListOffsetsRequest, 7, replica_id=-1, isolation_level=0, topics=[{
        "name": topic, "partitions": [{"partition_index": 0, "current_leader_epoch": -1,
                                       "timestamp": timestamp}]}])


def fetch(topic, offset):
    return build(FetchRequest, 12, replica_id=-1, max_wait_ms=0, min_bytes=0, max_bytes=1 << 20,
                            isolation_level=0, session_id=0, session_epoch=-1, topics=[{
                                "topic": topic, "partitions": [{
                                    "partition": 0, "current_leader_epoch": -1, "fetch_offset": offset,
                                    "last_fetched_epoch": -1, "log_start_offset": -1,
                                    "partition_max_bytes": 1 << 20}]}],
                            forgotten_topics_data=[], rack_id="")


def delete_records(topic, offset):
    return build(DeleteRecordsRequest, 2, timeout_ms=30_000, topics=[{
        "name": topic, "partitions": [{"partition_index": 0, "offset": offset}]}])


def offset_commit(group, topic, offset):
    return build(OffsetCommitRequest, 8, group_id=group, generation_id_or_member_epoch=-1, member_id="",
                                  group_instance_id=None, topics=[{
                                      "name": topic, "partitions": [{
                                          "partition_index": 0, "committed_offset": offset,
                                          "committed_leader_epoch": -1, "committed_metadata": ""}]}])


def offset_fetch(group, topic):
    return build(OffsetFetchRequest, 7, group_id=group, topics=[{"name": topic, "partition_indexes": [0]}],
                                 require_stable=False)


def wait_for_coordinator(bootstrap: str, group: str) -> None:
    """Kafka creates `__consumer_offsets` on the first FindCoordinator and answers
    COORDINATOR_NOT_AVAILABLE until it is there."""
    deadline = time.monotonic() + 60
    while True:
        pipe = Pipeline(bootstrap)
        pipe.send(build(FindCoordinatorRequest, 3, key=group, key_type=0))
        (r,) = pipe.responses()
        pipe.close()
        if r["error_code"] == 0:
            return
        assert time.monotonic() < deadline, r
        time.sleep(0.5)


def first(response, *path):
    """The first element down a path of list fields: `first(r, "topics", "partitions")`."""
    for key in path:
        response = response[key][0]
    return response


def summary(name: str, r: dict):
    """What a test compares of each response."""
    if name == "produce":
        p = first(r, "responses", "partition_responses")
        return ("produce", p["error_code"], p["base_offset"])
    if name == "list_offsets":
        p = first(r, "topics", "partitions")
        return ("list_offsets", p["error_code"], p["offset"])
    if name == "fetch":
        p = first(r, "responses", "partitions")
        offsets = []
        records = MemoryRecords(p["records"] or b"")
        while True:
            b = records.next_batch()
            if b is None:
                break
            offsets += [rec.offset for rec in b]
        return ("fetch", p["error_code"], p["log_start_offset"], p["high_watermark"], offsets)
    if name == "delete_records":
        p = first(r, "topics", "partitions")
        return ("delete_records", p["error_code"], p["low_watermark"])
    if name == "offset_commit":
        return ("offset_commit", first(r, "topics", "partitions")["error_code"])
    if name == "offset_fetch":
        p = first(r, "topics", "partitions")
        return ("offset_fetch", p["error_code"], p["committed_offset"])
    if name == "alter_configs":
        return ("alter_configs", r["responses"][0]["error_code"])
    if name == "describe_configs":
        res = r["results"][0]
        values = {c["name"]: c["value"] for c in res["configs"]}
        return ("describe_configs", res["error_code"], values.get("retention.ms"))
    if name == "create_partitions":
        return ("create_partitions", r["results"][0]["error_code"])
    if name == "metadata":
        t = r["topics"][0]
        return ("metadata", t["error_code"], len(t["partitions"]))
    if name == "delete_topics":
        return ("delete_topics", r["responses"][0]["error_code"])
    raise AssertionError(name)


def run_sequence(bootstrap: str, topic: str, group: str):
    """The pipelined sequence, in three writes: data path, then configs and partitions, then
    deletion. Returns each response's summary and what a one-at-a-time broker answers."""
    values = lambda n, tag: [f"{tag}-{i}".encode() for i in range(n)]
    rounds = [
        [
            ("produce", produce(topic, 0, values(10, "a")), ("produce", 0, 0)),
            ("list_offsets", list_offsets(topic, LATEST), ("list_offsets", 0, 10)),
            ("fetch", fetch(topic, 0), ("fetch", 0, 0, 10, list(range(10)))),
            ("delete_records", delete_records(topic, 4), ("delete_records", 0, 4)),
            ("list_offsets", list_offsets(topic, EARLIEST), ("list_offsets", 0, 4)),
            # OFFSET_OUT_OF_RANGE: offset 0 is gone (Kafka leaves the offsets at -1 then).
            ("fetch", fetch(topic, 0), ("fetch", 1, -1, -1, [])),
            ("produce", produce(topic, 0, values(5, "b")), ("produce", 0, 10)),
            ("produce", produce(topic, 0, values(5, "c")), ("produce", 0, 15)),
            ("list_offsets", list_offsets(topic, LATEST), ("list_offsets", 0, 20)),
            # The batch holding offset 4 comes whole; the consumer skips what is below.
            ("fetch", fetch(topic, 4), ("fetch", 0, 4, 20, list(range(20)))),
            ("offset_commit", offset_commit(group, topic, 12), ("offset_commit", 0)),
            ("offset_fetch", offset_fetch(group, topic), ("offset_fetch", 0, 12)),
            ("offset_commit", offset_commit(group, topic, 13), ("offset_commit", 0)),
            ("offset_fetch", offset_fetch(group, topic), ("offset_fetch", 0, 13)),
            ("delete_records", delete_records(topic, 20), ("delete_records", 0, 20)),
            ("produce", produce(topic, 0, values(1, "d")), ("produce", 0, 20)),
            ("list_offsets", list_offsets(topic, EARLIEST), ("list_offsets", 0, 20)),
            ("list_offsets", list_offsets(topic, LATEST), ("list_offsets", 0, 21)),
        ],
        [
            ("alter_configs", build(IncrementalAlterConfigsRequest, 1, validate_only=False, resources=[{
                "resource_type": TOPIC_RESOURCE, "resource_name": topic, "configs": [{
                    "name": "retention.ms", "config_operation": 0, "value": "123456"}]}]),
             ("alter_configs", 0)),
            ("describe_configs", build(DescribeConfigsRequest, 4, resources=[{
                "resource_type": TOPIC_RESOURCE, "resource_name": topic,
                "configuration_keys": ["retention.ms"]}], include_synonyms=False,
                include_documentation=False), ("describe_configs", 0, "123456")),
            ("create_partitions", build(CreatePartitionsRequest, 3, topics=[{
                "name": topic, "count": 3, "assignments": None}], timeout_ms=30_000,
                validate_only=False), ("create_partitions", 0)),
            ("metadata", build(MetadataRequest, 12, topics=[{"topic_id": None, "name": topic}],
                                            allow_auto_topic_creation=False,
                                            include_topic_authorized_operations=False),
             ("metadata", 0, 3)),
        ],
        [
            ("delete_topics", build(DeleteTopicsRequest, 6, topics=[{"name": topic, "topic_id": None}],
                                                     timeout_ms=30_000), ("delete_topics", 0)),
            # UNKNOWN_TOPIC_OR_PARTITION
            ("metadata", build(MetadataRequest, 12, topics=[{"topic_id": None, "name": topic}],
                                            allow_auto_topic_creation=False,
                                            include_topic_authorized_operations=False),
             ("metadata", 3, 0)),
        ],
    ]
    got, want = [], []
    for requests in rounds:
        pipe = Pipeline(bootstrap)
        for _, request, _ in requests:
            pipe.send(request)
        responses = pipe.responses()
        pipe.close()
        got.append([summary(name, r) for (name, _, _), r in zip(requests, responses)])
        want.append([expected for _, _, expected in requests])
    return got, want


def test_pipelined_mixed_requests_see_every_earlier_effect(broker, kafka_reference):
    for name, bootstrap in (("kafka", kafka_reference.bootstrap), ("sluice", broker.bootstrap)):
        create_topic(bootstrap, "pipelined", 1)
        wait_for_coordinator(bootstrap, "pipelined-group")
        got, want = run_sequence(bootstrap, "pipelined", "pipelined-group")
        # Kafka answers CreatePartitions and DeleteTopics once its controller has committed
        # the change; its broker's Metadata may show the state before it a moment longer (each
        # seen in CI). Sluice answers after its own shards have the change, so it is held to it.
        before = {1: ("metadata", 0, 1), 2: ("metadata", 0, 3)}
        for i, (g, w) in enumerate(zip(got, want)):
            if name == "kafka" and i in before and g == w[:-1] + [before[i]]:
                continue
            assert g == w, f"{name}, round {i}: " + "\n".join(
                f"{'  ' if a == b else '!!'} got {a} want {b}" for a, b in zip(g, w))


def test_two_hundred_pipelined_produces_keep_their_order(broker):
    """Produces on one connection still run concurrently (each waits only until the one
    before holds its place in the log): 200 pipelined ones are answered in order, at
    consecutive offsets."""
    create_topic(broker.bootstrap, "pipelined-commit", 1)
    pipe = Pipeline(broker.bootstrap)
    for i in range(200):
        pipe.send(produce("pipelined-commit", 0, [f"v{i}".encode()]))
    got = [summary("produce", r) for r in pipe.responses()]
    pipe.close()
    assert got == [("produce", 0, i) for i in range(200)]
