"""Time retention as Kafka does it, checked against Apache Kafka 4.x on the same requests.

A segment's age is its largest record timestamp, or, where it holds no valid timestamp (records
produced with -1), the time its file was last written; retention runs every
`log.retention.check.interval.ms`, walks from the oldest segment, never deletes past the high
watermark, and rolls the active segment only when the whole log is expired. Before this was
fixed, records produced without a timestamp or with old ones were deleted by Sluice within
milliseconds, the active segment included.
"""

from __future__ import annotations

import time

import pytest
from confluent_kafka import Producer, TopicPartition
from confluent_kafka.admin import ConfigResource, ResourceType

from harness import Broker, admin, consumer, create_topic, read_to_end

CHECK_MS = 250
BROKER_ARGS = ["--log-retention-check-interval-ms", str(CHECK_MS)]
KAFKA_PROPS = {
    "log.retention.check.interval.ms": str(CHECK_MS),
    # Kafka's first retention pass waits this long (default 30 s) after start-up.
    "log.initial.task.delay.ms": "0",
}
RETENTION_MS = 20_000
RECORDS = 20
# Timestamps the cases produce with: none (-1), from 1970, and now.
CASES = {"no-timestamp": -1, "1970": 1_000, "now": None}


def produce(bootstrap: str, topic: str, timestamp: int | None) -> None:
    p = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5, "enable.idempotence": True})
    failures = []
    for i in range(RECORDS):
        kwargs = {} if timestamp is None else {"timestamp": timestamp}
        p.produce(topic, value=f"{topic}-{i}".encode(), key=str(i).encode(),
                  on_delivery=lambda err, _m: err and failures.append(err), **kwargs)
    assert p.flush(30) == 0
    assert not failures, failures


def low_high(bootstrap: str, topic: str) -> tuple[int, int]:
    c = consumer(bootstrap)
    try:
        return c.get_watermark_offsets(TopicPartition(topic, 0), timeout=10, cached=False)
    finally:
        c.close()


def test_time_retention_keeps_what_kafka_keeps(broker, kafka_reference):
    servers = {"sluice": broker.bootstrap, "kafka": kafka_reference.bootstrap}
    for name, bootstrap in servers.items():
        for case, ts in CASES.items():
            topic = f"retention-{case}"
            create_topic(bootstrap, topic, 1, {"retention.ms": str(RETENTION_MS)})
            produce(bootstrap, topic, ts)
    # Kafka deletes the 1970 records at one of its next passes; wait for that, then for ten
    # more passes, and compare what each broker kept.
    deadline = time.monotonic() + 60
    while low_high(kafka_reference.bootstrap, "retention-1970")[0] != RECORDS:
        assert time.monotonic() < deadline, "Kafka never applied retention to the 1970 records"
        time.sleep(0.25)
    time.sleep(10 * CHECK_MS / 1000)
    kept = {name: {case: low_high(b, f"retention-{case}") for case in CASES} for name, b in servers.items()}
    expected = {"no-timestamp": (0, RECORDS), "1970": (RECORDS, RECORDS), "now": (0, RECORDS)}
    assert kept["kafka"] == expected, kept
    assert kept["sluice"] == kept["kafka"], kept
    # What was kept reads back whole, with the timestamps it was produced with.
    for case in ("no-timestamp", "now"):
        topic = f"retention-{case}"
        c = consumer(broker.bootstrap)
        c.assign([TopicPartition(topic, 0, 0)])
        got = read_to_end(c, {(topic, 0): RECORDS})
        c.close()
        assert [m.value() for m in got] == [f"{topic}-{i}".encode() for i in range(RECORDS)]
        assert [m.offset() for m in got] == list(range(RECORDS))
        if case == "no-timestamp":
            assert {m.timestamp()[1] for m in got} == {-1}, [m.timestamp() for m in got[:3]]
    # The emptied log goes on at the next offset on both.
    for name, bootstrap in servers.items():
        produce(bootstrap, "retention-1970", None)
        assert low_high(bootstrap, "retention-1970") == (RECORDS, 2 * RECORDS), name


def test_the_check_interval_is_kafkas_by_default():
    b = Broker(cores=1, name="retention-default")
    try:
        b.start()
        resource = ConfigResource(ResourceType.BROKER, "1")
        client = admin(b.bootstrap)
        described = client.describe_configs([resource])[resource].result(timeout=15)
        assert described["log.retention.check.interval.ms"].value == "300000"
        # With the default interval, even records from 1970 stay for minutes after start-up.
        create_topic(b.bootstrap, "old", 1, {"retention.ms": "1000"})
        produce(b.bootstrap, "old", 1_000)
        time.sleep(2)
        assert low_high(b.bootstrap, "old") == (0, RECORDS)
        b.stop_cleanly()
        assert "panicked" not in b.log_text()
    finally:
        if b.running():
            b.stop_cleanly()
        b.remove()


@pytest.mark.parametrize("flag", ["0", "x"])
def test_a_bad_check_interval_is_refused_at_start(flag, tmp_path):
    import subprocess
    from harness import SLUICE_BIN
    out = subprocess.run([str(SLUICE_BIN), "--data-dir", str(tmp_path / "d"),
                          "--log-retention-check-interval-ms", flag],
                         capture_output=True, text=True, timeout=30)
    assert out.returncode != 0
    assert "retention" in out.stderr, out.stderr
