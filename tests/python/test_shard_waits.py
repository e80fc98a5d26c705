"""What a shard waits on (engine/src/waits.rs): every segment fdatasync, every job queued for
another shard, every round trip to the controller and the shard's reactor itself (a timer due
every 50 ms) are timed; a wait of 100 ms or more is logged with its cause and counted in
`/metrics` (`sluice_shard_waits_total`, `sluice_shard_slow_waits_total`,
`sluice_shard_wait_seconds_total`, `sluice_shard_wait_max_seconds`, labelled `cause`).
"""

from __future__ import annotations

import os
import re
import signal
import time
import urllib.request

import pytest

from harness import Broker, assert_all_delivered, consumer, create_topic, free_port, produce_all, producer, read_to_end

CAUSES = ("fdatasync", "cross_shard_queue", "controller", "reactor")


@pytest.fixture(scope="module")
def broker():
    metrics_port = free_port()
    b = Broker(cores=2, name="waits", extra_args=["--metrics-listener", f"127.0.0.1:{metrics_port}"])
    b.metrics_port = metrics_port
    b.start()
    yield b
    b.stop()
    b.remove()


def waits(b) -> dict[tuple[str, str], float]:
    """{(metric, cause): value} of the four wait families."""
    text = urllib.request.urlopen(f"http://127.0.0.1:{b.metrics_port}/metrics", timeout=10).read().decode()
    out = {}
    for m in re.finditer(r'^(sluice_shard_\w+)\{cause="(\w+)"\} (\S+)$', text, re.M):
        out[(m.group(1), m.group(2))] = float(m.group(3))
    return out


def test_waits_are_timed_and_a_paused_broker_names_the_pause(broker):
    topic = "waited"
    create_topic(broker.bootstrap, topic, 4)
    before = waits(broker)
    for family in ("sluice_shard_waits_total", "sluice_shard_slow_waits_total", "sluice_shard_wait_seconds_total",
                   "sluice_shard_wait_max_seconds"):
        assert {c for (f, c) in before if f == family} == set(CAUSES), (family, before)

    # acks=all records on partitions of both shards: each batch is made durable with an
    # fdatasync before it is acknowledged, and a connection's requests for the other shard's
    # partitions go there as jobs.
    reports = produce_all(producer(broker.bootstrap), topic,
                          [{"partition": i % 4, "value": f"w{i}".encode()} for i in range(400)])
    assert_all_delivered(reports)
    time.sleep(0.2)
    after = waits(broker)
    assert after[("sluice_shard_waits_total", "fdatasync")] > before[("sluice_shard_waits_total", "fdatasync")]
    assert after[("sluice_shard_waits_total", "cross_shard_queue")] > \
        before[("sluice_shard_waits_total", "cross_shard_queue")]
    # The reactor probe ticks on its own, 20 times a second on each shard.
    assert after[("sluice_shard_waits_total", "reactor")] > before[("sluice_shard_waits_total", "reactor")]
    for c in CAUSES:
        assert after[("sluice_shard_wait_max_seconds", c)] >= before[("sluice_shard_wait_max_seconds", c)]

    # The whole process stopped for 400 ms: each shard's reactor fires its timer that much late,
    # and says so once in the log (at most one line a second per cause) and in the counters.
    slow_before = after[("sluice_shard_slow_waits_total", "reactor")]
    log_before = broker.log_text().count("the reactor was late")
    os.kill(broker.pid, signal.SIGSTOP)
    try:
        time.sleep(0.4)
    finally:
        os.kill(broker.pid, signal.SIGCONT)
    deadline = time.monotonic() + 10
    while (now := waits(broker))[("sluice_shard_slow_waits_total", "reactor")] < slow_before + 1 \
            and time.monotonic() < deadline:
        time.sleep(0.1)
    assert now[("sluice_shard_slow_waits_total", "reactor")] >= slow_before + 1, now
    assert now[("sluice_shard_wait_max_seconds", "reactor")] >= 0.3, now
    lines = [line for line in broker.log_text().splitlines() if "the reactor was late" in line]
    assert len(lines) > log_before, broker.log_tail()
    late = lines[-1]
    assert "WARN" in late and 'cause="reactor"' in late, late
    assert int(re.search(r"\bms=(\d+)", late).group(1)) >= 300, late
    # What the thread did meanwhile, from its rusage.
    assert re.search(r"over \d+ ms: \d+ ms on CPU, \d+ preemptions, \d+ voluntary switches, \d+ major page faults",
                     late), late

    # And it goes on serving: all 400 records read back in order per partition.
    c = consumer(broker.bootstrap)
    try:
        from confluent_kafka import TopicPartition
        c.assign([TopicPartition(topic, p, 0) for p in range(4)])
        got = read_to_end(c, {(topic, p): 100 for p in range(4)})
    finally:
        c.close()
    assert sorted((m.partition(), m.offset(), m.value()) for m in got) == sorted(
        (r.partition, r.offset, f"w{i}".encode()) for i, r in enumerate(reports))
