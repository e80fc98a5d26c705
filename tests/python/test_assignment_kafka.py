"""Manual replica assignments in CreateTopics and CreatePartitions, against Apache Kafka 4.x.

A single node accepts an assignment naming itself and refuses one naming a broker that is not
registered with INVALID_REPLICA_ASSIGNMENT, as Kafka does; a partition count or replication
factor given together with an assignment is an invalid request. The same requests go to both.
"""

from __future__ import annotations

from confluent_kafka.admin import NewPartitions, NewTopic

from harness import admin
from kafka.protocol.admin.topics import CreatePartitionsRequest, CreateTopicsRequest
from wire import Pipeline, build


def create(bootstrap: str, name: str, assignments, num_partitions=-1, replication_factor=-1) -> int:
    pipe = Pipeline(bootstrap)
    pipe.send(build(CreateTopicsRequest, 7, topics=[{
        "name": name, "num_partitions": num_partitions, "replication_factor": replication_factor,
        "assignments": [{"partition_index": i, "broker_ids": b} for i, b in enumerate(assignments)],
        "configs": []}], timeout_ms=30_000, validate_only=False))
    (r,) = pipe.responses()
    pipe.close()
    return r["topics"][0]["error_code"]


def grow(bootstrap: str, name: str, count: int, assignments) -> int:
    pipe = Pipeline(bootstrap)
    pipe.send(build(CreatePartitionsRequest, 3, topics=[{
        "name": name, "count": count, "assignments": [{"broker_ids": b} for b in assignments]}],
        timeout_ms=30_000, validate_only=False))
    (r,) = pipe.responses()
    pipe.close()
    return r["results"][0]["error_code"]


def partitions(bootstrap: str, name: str) -> int:
    md = admin(bootstrap).list_topics(topic=name, timeout=10)
    t = md.topics[name]
    return -1 if t.error else len(t.partitions)


def run(bootstrap: str) -> dict:
    import time
    r = {
        "self": create(bootstrap, "assigned", [[1], [1], [1]]),
        "unknown_broker": create(bootstrap, "assigned-unknown", [[2]]),
        "twice": create(bootstrap, "assigned-twice", [[1, 1]]),
        "with_count": create(bootstrap, "assigned-count", [[1]], num_partitions=1),
        "grow_self": grow(bootstrap, "assigned", 4, [[1]]),
        "grow_unknown": grow(bootstrap, "assigned", 5, [[2]]),
        "grow_wrong_count": grow(bootstrap, "assigned", 6, [[1]]),
    }
    deadline = time.monotonic() + 15
    while partitions(bootstrap, "assigned") != 4 and time.monotonic() < deadline:
        time.sleep(0.2)
    r["partitions"] = partitions(bootstrap, "assigned")
    # The admin client's own calls, as operators make them.
    client = admin(bootstrap)
    f = client.create_topics([NewTopic("assigned-admin", num_partitions=2, replica_assignment=[[1], [1]])])
    f["assigned-admin"].result(timeout=20)
    f = client.create_partitions([NewPartitions("assigned-admin", 3, replica_assignment=[[1]])])
    f["assigned-admin"].result(timeout=20)
    return r


def test_manual_assignments_are_checked_as_kafka_checks_them(broker, kafka_reference):
    got = {name: run(b) for name, b in (("kafka", kafka_reference.bootstrap), ("sluice", broker.bootstrap))}
    assert got["sluice"] == got["kafka"], got
    # 0 NONE, 39 INVALID_REPLICA_ASSIGNMENT, 42 INVALID_REQUEST.
    assert got["sluice"]["self"] == 0 and got["sluice"]["grow_self"] == 0
    assert got["sluice"]["unknown_broker"] == 39 and got["sluice"]["grow_unknown"] == 39
    assert got["sluice"]["partitions"] == 4
