"""Fetch cost by partition count: fetches per second and broker CPU per fetch for 1, 16, 1,000
and 10,000 partitions, in two cases:

- incremental: a fetch session (KIP-227) holding every partition of the topic, each fetched at
  its end; then incremental Fetches with nothing new (an empty request, the next epoch each
  time), which must answer with no partitions. This is what an idle consumer costs.
- full: a sessionless Fetch of every partition from offset 0, each holding one small batch, so
  every response carries one batch per partition (all under the broker's 2 MiB fetch.max.bytes).

One connection, one request in flight, `max_wait_ms=0`, against a fresh release `sluice --cores 2`
(partitions spread over both shards). Broker CPU is utime+stime from /proc/<pid>/stat before and
after each case; the client's own CPU is reported beside it, since on 2 cores the client competes
for the same CPUs. Requests are encoded once (full) or cheaply (incremental) and responses are
skipped unparsed after the first, which is checked. A measurement, not a test.

    perf/fetch-sessions                       # builds the release broker first
    perf/fetch-sessions --seconds 3 --sizes 1,16,1000
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import subprocess
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests" / "python"))

# Small segments: a new segment preallocates min(16 MiB, segment.bytes) per partition, and 10,000
# partitions at the default would reserve 160 GiB.
SEGMENT_BYTES = 16384
PRODUCE_CHUNK = 1000
STOP_TIMEOUT_S = 180
CREATE_TIMEOUT_S = 300


def broker_cpu_s(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    # utime and stime are fields 14 and 15 of the file (1-based), 12 and 13 after the name.
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def read_frame(sock: socket.socket) -> bytes:
    def exactly(n: int) -> bytes:
        chunks, have = [], 0
        while have < n:
            c = sock.recv(min(n - have, 1 << 20))
            if not c:
                raise ConnectionError("broker closed the connection")
            chunks.append(c)
            have += len(c)
        return b"".join(chunks)

    (size,) = __import__("struct").unpack(">i", exactly(4))
    return exactly(size)


def fetch(topic: str, partitions: int, offsets, session=(0, -1), parts=True):
    from kafka.protocol.consumer.fetch import FetchRequest
    from wire import build

    topics = []
    if parts:
        topics = [{"topic": topic, "partitions": [
            {"partition": p, "current_leader_epoch": -1, "fetch_offset": offsets[p], "last_fetched_epoch": -1,
             "log_start_offset": -1, "partition_max_bytes": 1 << 20} for p in range(partitions)]}]
    return build(FetchRequest, 12, replica_id=-1, max_wait_ms=0, min_bytes=0, max_bytes=50 << 20,
                 isolation_level=0, session_id=session[0], session_epoch=session[1], topics=topics,
                 forgotten_topics_data=[], rack_id="")


def encode(request) -> bytes:
    from kafka.protocol.parser import KafkaProtocol

    proto = KafkaProtocol(client_id="fetch-sessions")
    proto.send_request(request)
    return proto.send_bytes()


def create_topic(bootstrap: str, topic: str, partitions: int) -> None:
    """As the tests' helper, with room for 10,000 partitions (each a directory and files)."""
    from confluent_kafka.admin import NewTopic
    from harness import admin

    client = admin(bootstrap)
    futures = client.create_topics(
        [NewTopic(topic, num_partitions=partitions, replication_factor=1,
                  config={"segment.bytes": str(SEGMENT_BYTES)})],
        operation_timeout=CREATE_TIMEOUT_S, request_timeout=CREATE_TIMEOUT_S)
    futures[topic].result(timeout=CREATE_TIMEOUT_S + 10)


def produce(bootstrap: str, topic: str, partitions: int) -> None:
    from kafka.protocol.producer.produce import ProduceRequest
    from wire import Pipeline, batch, build

    pipe = Pipeline(bootstrap)
    for start in range(0, partitions, PRODUCE_CHUNK):
        pipe.send(build(ProduceRequest, 9, acks=-1, timeout_ms=30_000, topic_data=[{
            "name": topic, "partition_data": [
                {"index": p, "records": batch([b"x" * 100])} for p in range(start, min(partitions, start + PRODUCE_CHUNK))]}]))
    for r in pipe.responses():
        for p in r["responses"][0]["partition_responses"]:
            assert p["error_code"] == 0, p
    pipe.close()


def measure(pid: int, seconds: float, step) -> dict:
    # A short warm-up, then as many fetches as fit in `seconds`.
    for _ in range(3):
        step()
    cpu0, client0, t0 = broker_cpu_s(pid), time.process_time(), time.monotonic()
    n = 0
    while True:
        step()
        n += 1
        elapsed = time.monotonic() - t0
        if elapsed >= seconds and n >= 5:
            break
    cpu = broker_cpu_s(pid) - cpu0
    client = time.process_time() - client0
    return {
        "fetches": n,
        "seconds": round(elapsed, 3),
        "fetches_per_s": round(n / elapsed, 1),
        "broker_cpu_us_per_fetch": round(cpu / n * 1e6, 1),
        "client_cpu_us_per_fetch": round(client / n * 1e6, 1),
    }


def run_size(broker, partitions: int, seconds: float) -> dict:
    from kafka.protocol.consumer.fetch import FetchResponse  # noqa: F401 (schemas loaded once)
    from wire import Pipeline

    topic = f"fetch-sessions-{partitions}"
    create_topic(broker.bootstrap, topic, partitions)
    produce(broker.bootstrap, topic, partitions)
    out = {"partitions": partitions}

    # Incremental with nothing new: a session of every partition at its end (offset 1).
    pipe = Pipeline(broker.bootstrap)
    pipe.send(fetch(topic, partitions, [1] * partitions, session=(0, 0)))
    (full,) = pipe.responses()
    session = full["session_id"]
    assert session > 0 and full["error_code"] == 0, full["error_code"]
    listed = sum(len(t["partitions"]) for t in full["responses"])
    assert listed == partitions, listed
    sock = pipe.sock
    epoch = [1]

    def incremental():
        sock.sendall(encode(fetch(topic, partitions, None, session=(session, epoch[0]), parts=False)))
        body = read_frame(sock)
        epoch[0] += 1
        return body

    first = incremental()
    # An empty incremental response: header, throttle, error, session id, no topics; tiny.
    assert len(first) < 64, f"an incremental fetch with nothing new answered {len(first)} bytes"
    out["incremental_nothing_new"] = measure(broker.pid, seconds, incremental)
    pipe.close()

    # Full sessionless fetches, one batch per partition.
    pipe = Pipeline(broker.bootstrap)
    pipe.send(fetch(topic, partitions, [0] * partitions))
    (full,) = pipe.responses()
    rows = [p for t in full["responses"] for p in t["partitions"]]
    assert len(rows) == partitions and all(p["error_code"] == 0 and p["records"] for p in rows)
    request = encode(fetch(topic, partitions, [0] * partitions))
    sock = pipe.sock
    sizes = []

    def full_fetch():
        sock.sendall(request)
        sizes.append(len(read_frame(sock)))

    out["full_with_data"] = measure(broker.pid, seconds, full_fetch)
    out["full_with_data"]["response_bytes"] = sizes[-1]
    pipe.close()
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--bin", default=str(REPO / "target" / "release" / "sluice"))
    ap.add_argument("--no-build", action="store_true", help="use --bin as it is")
    ap.add_argument("--seconds", type=float, default=5.0, help="measured per case")
    ap.add_argument("--sizes", default="1,16,1000,10000")
    ap.add_argument("--label", default="", help="recorded in the results, e.g. the code measured")
    ap.add_argument("--commit", default=None,
                    help="the commit --bin was built from, when not this checkout's HEAD (e.g. a before figure)")
    ap.add_argument("--out", default=None, help="results JSON (default perf/results/fetch-sessions-<UTC>-<commit>.json)")
    args = ap.parse_args()
    if not args.no_build:
        subprocess.run(["cargo", "build", "--release", "-q", "-p", "sluice-broker"], cwd=REPO, check=True)
    os.environ["SLUICE_BIN"] = args.bin
    os.environ.setdefault("SLUICE_TEST_DIR", str(REPO / "target" / "perf" / "fetch-sessions"))
    from harness import Broker

    script_commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True,
                                   text=True).stdout.strip()
    commit = args.commit or script_commit
    load_before = Path("/proc/loadavg").read_text().split()[:3]
    broker = Broker(cores=2, num_partitions=1, name="fetch-sessions")
    results = []
    broker.start()
    try:
        for n in [int(s) for s in args.sizes.split(",")]:
            r = run_size(broker, n, args.seconds)
            results.append(r)
            inc, full = r["incremental_nothing_new"], r["full_with_data"]
            print(f"{n} partitions: incremental {inc['fetches_per_s']:>8} fetch/s "
                  f"{inc['broker_cpu_us_per_fetch']:>9} us broker CPU/fetch | full {full['fetches_per_s']:>7} fetch/s "
                  f"{full['broker_cpu_us_per_fetch']:>9} us broker CPU/fetch ({full['response_bytes']} B)", flush=True)
    finally:
        if broker.running():
            broker.stop(signal.SIGTERM, timeout=STOP_TIMEOUT_S)
        broker.remove()
    stamp = datetime.now(timezone.utc).strftime("%Y-%m-%dT%H%M%SZ")
    out = Path(args.out) if args.out else REPO / "perf" / "results" / f"fetch-sessions-{stamp}-{commit}.json"
    out.write_text(json.dumps({
        "benchmark": "fetch-sessions",
        "commit": commit,
        "script_commit": script_commit,
        "label": args.label,
        "binary": args.bin,
        "utc": stamp,
        "machine": {"cpus": os.cpu_count(), "kernel": os.uname().release,
                    "loadavg_before": load_before, "loadavg_after": Path("/proc/loadavg").read_text().split()[:3]},
        "broker": "--cores 2, defaults (fetch.max.bytes 2 MiB), one connection, one fetch in flight, max_wait_ms=0",
        "seconds_per_case": args.seconds,
        "results": results,
    }, indent=2) + "\n")
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
