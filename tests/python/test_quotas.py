"""Client quotas: set, described and removed with Kafka's `kafka-configs`, kept in the metadata
log, and enforced: a producer and a consumer with a quota are held to it over 20 s and told so
(`throttle_time_ms`, librdkafka's throttle callback), while clients without one beside them on
the same broker are never throttled."""

from __future__ import annotations

import socket
import threading
import time
import urllib.request

import pytest
from confluent_kafka import TopicPartition

from kafka.protocol.admin import CreatePartitionsRequest, CreateTopicsRequest, DeleteTopicsRequest
from kafka.protocol.metadata import MetadataRequest

from harness import Broker, admin, consumer, create_topic, free_port, producer
from reference import java
from wire import Pipeline, build

SECONDS = 20
PRODUCE_QUOTA = 256 * 1024
CONSUME_QUOTA = 512 * 1024
VALUE = b"q" * 1000


@pytest.fixture(scope="module")
def broker():
    # Two samples of a second: Kafka's rate with its default eleven lets a client that starts
    # flat out take ten seconds' worth at once and again each time the oldest sample expires,
    # about 1.1-1.2x its quota over its first 20 s (as Kafka's own broker, whose rules these
    # are); with two, the burst is one second's worth and the test can hold it to 10%.
    metrics_port = free_port()
    b = Broker(cores=2, name="quotas", extra_args=["--override", "quota.window.num=2",
                                                   "--metrics-listener", f"127.0.0.1:{metrics_port}"])
    b.metrics_port = metrics_port
    b.start()
    yield b
    b.stop()
    b.remove()


def configs(bootstrap: str, *args: str) -> str:
    """Runs Kafka's kafka-configs (ConfigCommand) and returns what it printed."""
    r = java("org.apache.kafka.tools.ConfigCommand", "--bootstrap-server", bootstrap, *args)
    assert r.returncode == 0, r.stdout + r.stderr
    return r.stdout


def test_kafka_configs_sets_describes_and_removes_client_quotas(broker):
    b = broker.bootstrap
    out = configs(b, "--alter", "--entity-type", "clients", "--entity-name", "cfg-client",
                  "--add-config", "producer_byte_rate=1048576,consumer_byte_rate=2097152")
    assert "Completed updating config for client cfg-client." in out
    configs(b, "--alter", "--entity-type", "users", "--entity-default", "--add-config", "request_percentage=50")
    configs(b, "--alter", "--entity-type", "users", "--entity-name", "alice", "--entity-type", "clients",
            "--entity-name", "app", "--add-config", "producer_byte_rate=4096")
    out = configs(b, "--describe", "--entity-type", "clients", "--entity-name", "cfg-client")
    assert "Quota configs for client-id 'cfg-client' are" in out
    assert "producer_byte_rate=1048576.0" in out and "consumer_byte_rate=2097152.0" in out
    out = configs(b, "--describe", "--entity-type", "users", "--entity-default")
    assert "Quota configs for the default user-principal are request_percentage=50.0" in out
    out = configs(b, "--describe", "--entity-type", "users", "--entity-name", "alice", "--entity-type", "clients",
                  "--entity-name", "app")
    assert "Quota configs for user-principal 'alice', client-id 'app' are producer_byte_rate=4096.0" in out
    # Every client quota.
    out = configs(b, "--describe", "--entity-type", "clients")
    assert "client-id 'cfg-client'" in out and "alice" not in out
    configs(b, "--alter", "--entity-type", "clients", "--entity-name", "cfg-client", "--delete-config",
            "producer_byte_rate")
    out = configs(b, "--describe", "--entity-type", "clients", "--entity-name", "cfg-client")
    assert "consumer_byte_rate=2097152.0" in out and "producer_byte_rate" not in out
    configs(b, "--alter", "--entity-type", "clients", "--entity-name", "cfg-client", "--delete-config",
            "consumer_byte_rate")
    configs(b, "--alter", "--entity-type", "users", "--entity-default", "--delete-config", "request_percentage")
    configs(b, "--alter", "--entity-type", "users", "--entity-name", "alice", "--entity-type", "clients",
            "--entity-name", "app", "--delete-config", "producer_byte_rate")
    out = configs(b, "--describe", "--entity-type", "clients", "--entity-name", "cfg-client")
    assert "Quota configs for client-id 'cfg-client' are" not in out
    # A quota Kafka refuses is refused with its message.
    r = java("org.apache.kafka.tools.ConfigCommand", "--bootstrap-server", b, "--alter", "--entity-type", "clients",
             "--entity-name", "x", "--add-config", "producer_byte_rate=1.5")
    assert r.returncode != 0 and "producer_byte_rate cannot be a fractional value." in r.stdout + r.stderr


class Side:
    """What one client got through and how often it was throttled."""

    def __init__(self):
        self.bytes = 0
        self.throttles: list[float] = []
        self.lock = threading.Lock()

    def throttled(self, event):
        if event.throttle_time > 0:
            self.throttles.append(event.throttle_time)


def produce_for(b: str, client_id: str, topic: str, side: Side, until: float, per_second: int | None):
    """Produces 1,000-byte values until `until` (paced to `per_second` values, or flat out) and
    counts the bytes acknowledged before it."""
    def delivered(err, msg):
        if err is None and time.monotonic() <= until:
            with side.lock:
                side.bytes += len(msg.value())

    p = producer(b, **{"client.id": client_id, "linger.ms": 5, "batch.size": 16384, "throttle_cb": side.throttled,
                       "queue.buffering.max.kbytes": 1024, "on_delivery": delivered})
    start, sent = time.monotonic(), 0
    while time.monotonic() < until:
        if per_second is not None and sent >= (time.monotonic() - start) * per_second:
            p.poll(0.01)
            continue
        try:
            p.produce(topic, VALUE)
            sent += 1
        except BufferError:
            p.poll(0.01)
        p.poll(0)
    p.flush(30)


def consume_for(b: str, client_id: str, topic: str, side: Side, until: float, end: int):
    """Reads the topic from the start until `until` or its end, counting the value bytes."""
    c = consumer(b, **{"client.id": client_id, "throttle_cb": side.throttled, "fetch.max.bytes": 8 << 20})
    c.assign([TopicPartition(topic, 0, 0)])
    read = 0
    try:
        while time.monotonic() < until and read < end:
            for m in c.consume(1000, 0.2):
                if m.error() is None:
                    read += 1
                    side.bytes += len(m.value())
    finally:
        c.close()


def test_a_client_over_its_quota_is_held_to_it_and_the_others_are_not_throttled(broker):
    b = broker.bootstrap
    create_topic(b, "quota-produce", 1)
    create_topic(b, "quota-consume", 1)
    # What the consumers read: 16 MB, more than the limited one may read in 20 s.
    filled = 16_000
    p = producer(b, **{"client.id": "filler"})
    for _ in range(filled):
        while True:
            try:
                p.produce("quota-consume", VALUE)
                break
            except BufferError:
                p.poll(0.05)
    assert p.flush(60) == 0
    configs(b, "--alter", "--entity-type", "clients", "--entity-name", "slow-producer",
            "--add-config", f"producer_byte_rate={PRODUCE_QUOTA}")
    configs(b, "--alter", "--entity-type", "clients", "--entity-name", "slow-consumer",
            "--add-config", f"consumer_byte_rate={CONSUME_QUOTA}")

    sides = {name: Side() for name in ("slow-producer", "fast-producer", "slow-consumer", "fast-consumer")}
    until = time.monotonic() + SECONDS
    threads = [
        threading.Thread(target=produce_for, args=(b, "slow-producer", "quota-produce", sides["slow-producer"],
                                                   until, None)),
        # 1 MB/s, four times the other's quota, without one.
        threading.Thread(target=produce_for, args=(b, "fast-producer", "quota-produce", sides["fast-producer"],
                                                   until, 1000)),
        threading.Thread(target=consume_for, args=(b, "slow-consumer", "quota-consume", sides["slow-consumer"],
                                                   until, filled)),
        threading.Thread(target=consume_for, args=(b, "fast-consumer", "quota-consume", sides["fast-consumer"],
                                                   until, filled)),
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join(SECONDS + 90)
    rates = {name: s.bytes / SECONDS for name, s in sides.items()}
    print({name: (round(rate / 1024), len(sides[name].throttles)) for name, rate in rates.items()})

    # The limited producer: throttled, and within 10% of its quota over the 20 s (a request's
    # bytes count against it, so its values' bytes are a little less than what was counted).
    assert sides["slow-producer"].throttles, "the broker never told the producer it was throttled"
    assert rates["slow-producer"] <= 1.1 * PRODUCE_QUOTA, rates
    assert rates["slow-producer"] >= 0.5 * PRODUCE_QUOTA, rates
    # The limited consumer: the same.
    assert sides["slow-consumer"].throttles, "the broker never told the consumer it was throttled"
    assert rates["slow-consumer"] <= 1.1 * CONSUME_QUOTA, rates
    # (Throttled fetches come back empty, and librdkafka waits out each throttle before it asks
    # again, so a consumer gets less than its quota: about two thirds of it here.)
    assert rates["slow-consumer"] >= 0.3 * CONSUME_QUOTA, rates
    # The others: never throttled, and they got what they asked for: the paced producer about
    # 1 MB/s, the consumer the whole topic.
    assert sides["fast-producer"].throttles == [] and sides["fast-consumer"].throttles == []
    assert rates["fast-producer"] >= 0.8 * 1000 * len(VALUE), rates
    assert sides["fast-consumer"].bytes == filled * len(VALUE), rates


def create(topics: dict[str, int], version: int):
    return build(CreateTopicsRequest, version, timeout_ms=30_000, validate_only=False,
                 topics=[{"name": n, "num_partitions": p, "replication_factor": 1, "assignments": [], "configs": []}
                         for n, p in topics.items()])


def errors(response: dict, results: str = "topics") -> dict[str, int]:
    return {t["name"]: t["error_code"] for t in response[results]}


def test_controller_mutations_over_the_quota_are_refused_with_throttling_quota_exceeded(broker):
    """KIP-599: each partition created or deleted takes a token from a bucket of
    quota x quota.window.num x quota.window.size.seconds (2 x 2 x 1 s here) that fills at the
    quota; recent versions get THROTTLING_QUOTA_EXCEEDED (89) for the topics past an empty bucket
    and the throttle time to wait, older ones are only throttled; a client without the quota
    beside it is never held."""
    configs(broker.bootstrap, "--alter", "--entity-type", "clients", "--entity-name", "mutator",
            "--add-config", "controller_mutation_rate=2")
    mutator = Pipeline(broker.bootstrap, client_id="mutator")
    free = Pipeline(broker.bootstrap, client_id="free")
    try:
        mutator.send(create({"mut-a": 3, "mut-b": 6, "mut-c": 1}, 6))
        (r,) = mutator.responses()
        # 4 tokens: mut-a leaves 1, mut-b takes it below zero (once is allowed), mut-c waits.
        assert errors(r) == {"mut-a": 0, "mut-b": 0, "mut-c": 89}, r
        assert 2000 <= r["throttle_time_ms"] <= 2600, r
        free.send(create({"free-a": 5}, 6))
        (f,) = free.responses()
        assert errors(f) == {"free-a": 0} and f["throttle_time_ms"] == 0, f
        time.sleep(r["throttle_time_ms"] / 1000 + 0.1)
        # Version 5 cannot say THROTTLING_QUOTA_EXCEEDED: created, and throttled.
        mutator.send(create({"mut-c": 1, "mut-d": 3}, 5))
        (r,) = mutator.responses()
        assert errors(r) == {"mut-c": 0, "mut-d": 0}, r
        assert 1000 <= r["throttle_time_ms"] <= 2100, r
        time.sleep(r["throttle_time_ms"] / 1000 + 0.1)
        mutator.send(build(DeleteTopicsRequest, 5, topic_names=["mut-b", "mut-a"], timeout_ms=30_000))
        (r,) = mutator.responses()
        assert {t["name"]: t["error_code"] for t in r["responses"]} == {"mut-b": 0, "mut-a": 89}, r
        assert r["throttle_time_ms"] >= 2500, r
        time.sleep(r["throttle_time_ms"] / 1000 + 0.1)
        mutator.send(build(CreatePartitionsRequest, 3, timeout_ms=30_000, validate_only=False,
                           topics=[{"name": "mut-d", "count": 5, "assignments": None},
                                   {"name": "mut-c", "count": 3, "assignments": None}]))
        (r,) = mutator.responses()
        assert errors(r, "results") == {"mut-d": 0, "mut-c": 89}, r
    finally:
        mutator.close()
        free.close()
    m = throttle_metrics(broker)
    assert m['kafka_server_controllermutation_throttled_total{user="",client_id="mutator"}'] >= 4, m
    md = admin(broker.bootstrap).list_topics(timeout=10).topics
    assert "mut-b" not in md and "mut-a" in md and "mut-c" in md
    assert len(md["mut-d"].partitions) == 5 and len(md["mut-c"].partitions) == 1
    assert len(md["free-a"].partitions) == 5


def test_a_client_over_its_request_percentage_is_throttled_and_the_others_are_not(broker):
    """request_percentage: the time the broker spends on a client's requests, 100 a second of
    one shard. Pipelined Metadata requests of a client allowed 0.1% (1 ms a second) come back
    with throttle times (at most a sample, 1 s, as Kafka bounds them); another client's don't."""
    configs(broker.bootstrap, "--alter", "--entity-type", "clients", "--entity-name", "busy",
            "--add-config", "request_percentage=0.1")
    throttles = {}
    for client_id in ("busy", "idle"):
        p = Pipeline(broker.bootstrap, client_id=client_id)
        try:
            for _ in range(400):
                p.send(build(MetadataRequest, 4, topics=None, allow_auto_topic_creation=False))
            throttles[client_id] = [r["throttle_time_ms"] for r in p.responses()]
        finally:
            p.close()
    busy = [t for t in throttles["busy"] if t > 0]
    assert busy and max(busy) <= 1000, throttles["busy"]
    assert set(throttles["idle"]) == {0}
    # /metrics counts them under Kafka's Request quota group, for the client id the quota is on.
    m = throttle_metrics(broker)
    assert m['kafka_server_request_throttled_total{user="",client_id="busy"}'] == len(busy), m
    assert m['kafka_server_request_throttle_time_ms_total{user="",client_id="busy"}'] >= sum(busy) - len(busy), m
    assert not any('client_id="idle"' in k for k in m), m


def throttle_metrics(b) -> dict[str, float]:
    text = urllib.request.urlopen(f"http://127.0.0.1:{b.metrics_port}/metrics", timeout=10).read().decode()
    return {line.rsplit(" ", 1)[0]: float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
            if line.startswith("kafka_server_") and "throttle" in line and not line.startswith("#")}


def test_connections_over_their_ips_creation_rate_are_closed_after_a_throttle(broker):
    """KIP-612: `kafka-configs --entity-type ips` sets connection_creation_rate on an address;
    its connections beyond the rate are closed unanswered after their throttle time, while
    another address opening as many at once is served every one."""
    from test_sasl import api_versions, read_frames

    def answers(s: socket.socket) -> int:
        try:
            return len(read_frames(s, 1))
        except ConnectionResetError:  # closed with the request unread
            return 0
    configs(broker.bootstrap, "--alter", "--entity-type", "ips", "--entity-name", "127.0.0.2",
            "--add-config", "connection_creation_rate=5")
    try:
        out = configs(broker.bootstrap, "--describe", "--entity-type", "ips", "--entity-name", "127.0.0.2")
        assert "connection_creation_rate=5.0" in out, out
        time.sleep(0.5)  # every shard's image holds the quota
        answered = {}
        for source in ("127.0.0.2", "127.0.0.1"):
            sockets = [socket.create_connection(("127.0.0.1", broker.port), timeout=10, source_address=(source, 0))
                       for _ in range(30)]
            try:
                for s in sockets:
                    s.sendall(api_versions(1))
                answered[source] = sum(map(answers, sockets))
            finally:
                for s in sockets:
                    s.close()
        assert answered["127.0.0.1"] == 30, answered
        # Five a second over samples of a second: about one sample's worth gets through.
        assert 3 <= answered["127.0.0.2"] <= 12, answered
    finally:
        configs(broker.bootstrap, "--alter", "--entity-type", "ips", "--entity-name", "127.0.0.2",
                "--delete-config", "connection_creation_rate")
