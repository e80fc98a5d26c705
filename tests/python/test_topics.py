"""Topic metadata seen through every shard: with --cores 2 each connection lands on one of two
shards (SO_REUSEPORT), and each shard answers Metadata from its own copy of the metadata image,
so a client only sees a consistent broker if every shard's copy is the same."""

from __future__ import annotations

import threading
import time

from confluent_kafka import TopicPartition
from confluent_kafka.admin import NewTopic

from harness import READY_LINE, admin, assert_all_delivered, consumer, create_topic, produce_all, producer, read_to_end

# Fresh connections to ask: each lands on a shard at random, so 16 miss one of two shards with
# probability 2^-15.
CONNECTIONS = 16


def topics_seen(bootstrap: str) -> dict[str, int]:
    """Asks CONNECTIONS fresh clients for every topic; fails unless all got the same answer,
    and returns it as {topic: partitions}."""
    answers: dict[tuple, int] = {}
    for _ in range(CONNECTIONS):
        md = admin(bootstrap).list_topics(timeout=10)
        answer = tuple(sorted((name, len(t.partitions)) for name, t in md.topics.items() if t.error is None))
        answers[answer] = answers.get(answer, 0) + 1
    assert len(answers) == 1, "connections disagree on the topics: " + "; ".join(
        f"{n} saw {dict(a)}" for a, n in answers.items()
    )
    return dict(next(iter(answers)))


def check_topic_data(bootstrap: str, topic: str, partitions: int) -> None:
    """One message per partition goes in at offset 0 and comes back."""
    reports = produce_all(producer(bootstrap), topic, ({"partition": q, "value": b"m%d" % q} for q in range(partitions)))
    assert_all_delivered(reports)
    assert [(r.partition, r.offset) for r in reports] == [(q, 0) for q in range(partitions)]
    c = consumer(bootstrap)
    c.assign([TopicPartition(topic, q, 0) for q in range(partitions)])
    msgs = read_to_end(c, {(topic, q): 1 for q in range(partitions)})
    c.close()
    assert sorted((m.partition(), m.value()) for m in msgs) == [(q, b"m%d" % q) for q in range(partitions)]


def test_every_shard_sees_topics_created_one_after_another(fresh_broker):
    created = {"seq-a": 1, "seq-b": 4, "seq-c": 7}
    for name, partitions in created.items():
        create_topic(fresh_broker.bootstrap, name, partitions)
    seen = topics_seen(fresh_broker.bootstrap)
    assert {k: v for k, v in seen.items() if k in created} == created
    for name, partitions in created.items():
        check_topic_data(fresh_broker.bootstrap, name, partitions)


def test_concurrent_create_topics_are_all_kept(fresh_broker):
    """Six CreateTopics at once on six connections (fixed in 663387d: before it, only one topic
    survived, a different one on each shard)."""
    names = [f"concurrent-{i}" for i in range(6)]
    admins = [admin(fresh_broker.bootstrap) for _ in names]
    for a in admins:
        a.list_topics(timeout=10)  # connected before the race starts
    barrier = threading.Barrier(len(names))
    errors = []

    def create(i):
        barrier.wait()
        try:
            admins[i].create_topics([NewTopic(names[i], num_partitions=2, replication_factor=1)], request_timeout=20)[names[i]].result(timeout=30)
        except Exception as e:  # reported below
            errors.append((names[i], e))

    threads = [threading.Thread(target=create, args=(i,)) for i in range(len(names))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert not errors, errors
    seen = topics_seen(fresh_broker.bootstrap)
    assert {k: v for k, v in seen.items() if k.startswith("concurrent-")} == {n: 2 for n in names}


def test_create_topic_as_soon_as_the_port_answers(unstarted_broker):
    """On a first start shard 0 creates __consumer_offsets while shard 1 already serves. A topic
    created meanwhile must end up on both shards' images (before 663387d, one shard lost it and
    a later Metadata request auto-created it again, deleting partitions)."""
    broker = unstarted_broker
    broker.start(wait_for_partitions=False)
    create_topic(broker.bootstrap, "early", 4)
    deadline = time.monotonic() + 30
    while READY_LINE not in broker.current_log():
        assert time.monotonic() < deadline, "the broker never finished starting"
        time.sleep(0.05)
    assert topics_seen(broker.bootstrap).get("early") == 4
    check_topic_data(broker.bootstrap, "early", 4)
    assert "deleted partition" not in broker.log_text()
