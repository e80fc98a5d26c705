"""kcat (the Debian package, on the system librdkafka) against a real `sluice`: metadata,
keyed produce from stdin, and consume to the end, compared byte for byte."""

from __future__ import annotations

import shutil
import subprocess
from collections import defaultdict

KCAT = shutil.which("kcat")
KCAT_TIMEOUT_S = 60


def kcat(broker, *args: str, stdin: bytes | None = None) -> str:
    assert KCAT is not None, "kcat is not installed (tests/run installs it)"
    r = subprocess.run(
        [KCAT, "-b", broker.bootstrap, *args],
        input=stdin,
        capture_output=True,
        timeout=KCAT_TIMEOUT_S,
    )
    assert r.returncode == 0, f"kcat {' '.join(args)} exited {r.returncode}\nstdout: {r.stdout!r}\nstderr: {r.stderr!r}"
    return r.stdout.decode()


LINES = ["alpha:1", "beta:two", "gamma:", "delta:x:y:z", "alpha:5", "epsilon:" + "e" * 1000]


def test_produce_keyed_lines_and_read_them_back(broker):
    topic = "kcat-lines"
    # Auto-created by kcat's Metadata request, with the broker's --num-partitions (3).
    kcat(broker, "-P", "-t", topic, "-K:", "-p", "0", stdin=("\n".join(LINES) + "\n").encode())
    # Headers too.
    kcat(broker, "-P", "-t", topic, "-K:", "-p", "0", "-H", "trace=abc", "-H", "n=1", stdin=b"zeta:with-headers\n")

    out = kcat(broker, "-C", "-t", topic, "-p", "0", "-e", "-o", "beginning", "-K:", "-q")
    assert out == "\n".join(LINES) + "\nzeta:with-headers\n"

    out = kcat(broker, "-C", "-t", topic, "-p", "0", "-e", "-o", "beginning", "-q", "-f", "%p|%o|%k|%s|%h\n")
    expected = [f"0|{i}|{line.split(':', 1)[0]}|{line.split(':', 1)[1]}|" for i, line in enumerate(LINES)]
    expected.append(f"0|{len(LINES)}|zeta|with-headers|trace=abc,n=1")
    assert out.splitlines() == expected

    # From an offset, and the last message.
    out = kcat(broker, "-C", "-t", topic, "-p", "0", "-e", "-o", "3", "-q", "-f", "%o %k\n")
    assert out.splitlines() == [f"{i} {line.split(':', 1)[0]}" for i, line in enumerate(LINES)][3:] + [f"{len(LINES)} zeta"]
    out = kcat(broker, "-C", "-t", topic, "-p", "0", "-o", "-1", "-c", "1", "-q", "-f", "%o %s\n")
    assert out == f"{len(LINES)} with-headers\n"


def test_keyed_lines_without_a_partition_spread_by_key(broker):
    topic = "kcat-spread"
    lines = [f"key-{i % 40}:value-{i}" for i in range(2_000)]
    kcat(broker, "-P", "-t", topic, "-K:", stdin=("\n".join(lines) + "\n").encode())
    out = kcat(broker, "-C", "-t", topic, "-e", "-o", "beginning", "-q", "-f", "%p %o %k %s\n")
    rows = [r.split(" ") for r in out.splitlines()]
    assert len(rows) == len(lines)
    assert sorted(f"{k}:{v}" for _, _, k, v in rows) == sorted(lines)
    key_partition = {}
    offsets = defaultdict(list)
    values = defaultdict(list)
    for p, o, k, v in rows:
        assert key_partition.setdefault(k, p) == p, f"{k} in partitions {key_partition[k]} and {p}"
        offsets[p].append(int(o))
        values[p].append(int(v.split("-")[1]))
    assert len(offsets) == 3, "40 keys should reach all 3 partitions"
    for p in offsets:
        assert offsets[p] == list(range(len(offsets[p])))
        assert values[p] == sorted(values[p]), f"partition {p} is not in the order the lines were sent"


def test_metadata_lists_the_broker_and_topics(broker):
    kcat(broker, "-P", "-t", "kcat-meta", "-p", "0", stdin=b"x\n")
    out = kcat(broker, "-L")
    lines = out.splitlines()
    assert lines[0].startswith("Metadata for all topics (from broker 1: ")
    assert lines[1:3] == [" 1 brokers:", f"  broker 1 at {broker.bootstrap} (controller)"]
    topics = {}
    current = None
    for line in lines[4:]:
        if line.startswith('  topic "'):
            current = line.split('"')[1]
            topics[current] = [line]
        elif current:
            topics[current].append(line)
    assert lines[3] == f" {len(topics)} topics:"
    assert "kcat-meta" in topics
    assert topics["kcat-meta"] == [
        '  topic "kcat-meta" with 3 partitions:',
        "    partition 0, leader 1, replicas: 1, isrs: 1",
        "    partition 1, leader 1, replicas: 1, isrs: 1",
        "    partition 2, leader 1, replicas: 1, isrs: 1",
    ]
    one = kcat(broker, "-L", "-t", "kcat-meta").splitlines()
    assert one[3:] == [" 1 topics:"] + topics["kcat-meta"]
