"""Durability of a real `sluice` under broker faults, many cycles, with clients running throughout.

`test_kill_and_stall_cycles`: an idempotent producer (acks=all) and a consumer group member run as
separate processes (this file run as a script, see `producer_main` and `consumer_main`) while the
test, at random moments, either SIGKILLs the broker and starts it again on the same port and data
directory, or SIGSTOPs it for 0.2-3 s and then SIGCONTs it. After every fault the test waits until
the producer has a new acknowledgement and the consumer has consumed again. At the end (producer
flushed, consumer drained) the log and the processes' records must show:

- every acknowledged message is in the log exactly once, at its acknowledged offset; a message
  whose delivery failed may be missing, but is never there twice; nothing is there that was
  never produced; offsets run 0, 1, 2, ... with no gap; per partition, produce order is kept;
- the consumer saw only what the log holds (nothing it saw was lost later), resumed after every
  fault, went back only to its last acknowledged commit or later (redelivery after the last
  commit is allowed, as in Kafka), never skipped a message, and together saw every message; its
  final committed offsets are the ends of the partitions.

`SLUICE_FAULT_CYCLES` sets the number of faults (default 16, about 35 s on a 2-core machine),
`SLUICE_FAULT_SEED` the random seed (printed, so a failing run can be replayed).

`test_tiny_batch_cache_under_cold_reads`: a broker with a 64 KiB batch cache per shard; several
consumers read cold data from the beginning of several partitions at once while a producer
appends at the tail; everything read is correct (payload checksums, offsets in order), and the
broker's peak RSS (`VmHWM`) stays bounded, below the data read.

`test_resident_memory_does_not_grow_with_appends`: the same load appended round after round does
not keep growing the broker's resident memory once the batch cache is full.
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import threading
import time
import traceback
import zlib
from collections import Counter, defaultdict
from pathlib import Path

import pytest
from confluent_kafka import Consumer, KafkaError, KafkaException, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, ConfigResource, ResourceType

from harness import CLIENT_DEFAULTS, consumer, create_topic, digest, producer, read_to_end, watermarks

INITIAL_REBALANCE_DELAY_MS = 300
BROKER_ARGS = ["--group-initial-rebalance-delay-ms", str(INITIAL_REBALANCE_DELAY_MS)]

TOPIC = "faults"
PARTITIONS = 4
KEYS = 499
GROUP = "faults-group"
# Messages per second the producer offers.
RATE = 1_000

CYCLES = int(os.environ.get("SLUICE_FAULT_CYCLES", "16"))
# A stall lasts this long (uniformly random), longer than the producer's request timeout at the
# top end, so that librdkafka times requests out and sends them again (the broker must dedupe).
STALL_S = (0.2, 3.0)
# After the clients have made progress again, the next fault comes this much later (random).
GAP_S = (0.0, 1.2)
# Bounds for a stuck broker or client; a passing run takes a fraction of these.
RESUME_TIMEOUT_S = 60
FLUSH_TIMEOUT_S = 90
DRAIN_TIMEOUT_S = 90
PROC_EXIT_TIMEOUT_S = 30

# Client settings shared by both processes: reconnect quickly (librdkafka's default backoff grows
# to 10 s, which would make every restart cost that much waiting), and Kafka's classic group
# timings scaled down.
RECONNECT = {"reconnect.backoff.ms": 50, "reconnect.backoff.max.ms": 500}
PRODUCER_CONFIG = {
    "enable.idempotence": True,
    "acks": "all",
    "linger.ms": 5,
    "batch.num.messages": 200,
    "max.in.flight.requests.per.connection": 5,
    # Shorter than the longest stall: the client times requests out and sends them again.
    "request.timeout.ms": 1_500,
    # Longer than any fault: deliveries should normally succeed, but may fail (and are then
    # allowed to be missing).
    "message.timeout.ms": 30_000,
    **RECONNECT,
}
CONSUMER_CONFIG = {
    "enable.auto.commit": False,
    "auto.offset.reset": "earliest",
    "session.timeout.ms": 6_000,
    "heartbeat.interval.ms": 1_000,
    "fetch.wait.max.ms": 100,
    **RECONNECT,
}


def key_of(seq: int) -> bytes:
    return b"k%03d" % ((seq * 7919) % KEYS)


def value_of(seq: int) -> bytes:
    return b"%d|%s" % (seq, digest("faults", seq)[:32].encode())


def seq_of(value: bytes) -> int:
    return int(value.split(b"|", 1)[0])


# ---- the client processes ---------------------------------------------------------------------


def _event_log(path: str):
    out = open(path, "a", buffering=1)  # line-buffered: each event reaches the OS at once

    def emit(ev: str, **fields) -> None:
        out.write(json.dumps({"t": time.monotonic(), "ev": ev, **fields}) + "\n")

    return out, emit


def producer_main(spec: dict) -> int:
    """Produces keyed, sequence-numbered messages at spec["rate"] per second until spec["stop"]
    exists, then flushes. Logs every delivery report (ok with partition and offset, or failed)
    and every client error, one JSON object per line."""
    out, emit = _event_log(spec["log"])

    def on_delivery(err, msg):
        seq = seq_of(msg.value())
        if err is None:
            emit("ok", s=seq, p=msg.partition(), o=msg.offset())
        else:
            emit("fail", s=seq, p=msg.partition(), code=err.code(), error=str(err))

    def on_error(err):
        emit("error", code=err.code(), error=str(err), fatal=err.fatal())

    p = Producer({"bootstrap.servers": spec["bootstrap"], "error_cb": on_error, **CLIENT_DEFAULTS, **PRODUCER_CONFIG})
    emit("started", pid=os.getpid())
    stop = Path(spec["stop"])
    rate = spec["rate"]
    started = time.monotonic()
    seq = 0
    while not stop.exists():
        if seq % 50 == 0:
            ahead = started + seq / rate - time.monotonic()
            if ahead > 0:
                time.sleep(ahead)
            elif ahead < -2:
                started -= ahead + 2  # after a long stall, do not burst to catch up
        try:
            p.produce(spec["topic"], key=key_of(seq), value=value_of(seq), on_delivery=on_delivery)
        except BufferError:
            p.poll(0.05)
            continue
        seq += 1
        p.poll(0)
    emit("stopping", produced=seq)
    left = p.flush(spec["flush_timeout"])
    emit("flushed", produced=seq, left=left)
    out.close()
    return 0


def consumer_main(spec: dict) -> int:
    """One consumer group member: subscribes, consumes, and after each batch it processed
    commits (synchronously) the next offset of each partition in it. Logs assignments, each
    batch, each commit and its outcome, one JSON object per line, until spec["stop"] exists."""
    out, emit = _event_log(spec["log"])
    topic = spec["topic"]

    def on_assign(c, parts):
        emit("assign", parts=sorted(tp.partition for tp in parts))

    def on_revoke(c, parts):
        emit("revoke", parts=sorted(tp.partition for tp in parts))

    def on_lost(c, parts):
        emit("lost", parts=sorted(tp.partition for tp in parts))

    def on_error(err):
        emit("error", code=err.code(), error=str(err), fatal=err.fatal())

    c = Consumer({"bootstrap.servers": spec["bootstrap"], "group.id": spec["group"], "error_cb": on_error, **CLIENT_DEFAULTS, **CONSUMER_CONFIG})
    c.subscribe([topic], on_assign=on_assign, on_revoke=on_revoke, on_lost=on_lost)
    emit("started", pid=os.getpid())
    stop = Path(spec["stop"])
    while not stop.exists():
        msgs = c.consume(num_messages=500, timeout=0.2)
        records = []
        batch: dict[int, int] = {}
        for m in msgs:
            err = m.error()
            if err is not None:
                emit("error", code=err.code(), error=str(err), fatal=False)
                continue
            seq = seq_of(m.value())
            if m.key() != key_of(seq) or m.value() != value_of(seq):
                emit("damaged", p=m.partition(), o=m.offset(), key=repr(m.key()), value=repr(m.value()))
            records.append([m.partition(), m.offset(), seq])
            batch[m.partition()] = m.offset() + 1
        if not records:
            continue
        emit("consumed", records=records)
        emit("committing", offsets=batch)
        try:
            result = c.commit(offsets=[TopicPartition(topic, p, o) for p, o in batch.items()], asynchronous=False)
        except KafkaException as e:
            emit("commit_failed", offsets=batch, error=str(e))
            continue
        ok = {tp.partition: tp.offset for tp in result if tp.error is None}
        failed = {tp.partition: str(tp.error) for tp in result if tp.error is not None}
        emit("committed", offsets=ok, errors=failed)
    emit("stopping")
    c.close()
    emit("closed")
    out.close()
    return 0


# ---- the test side of the client processes ------------------------------------------------------


class ClientProc:
    """A client process this test started, and the events it logged so far (read incrementally)."""

    def __init__(self, workdir: Path, role: str, spec: dict):
        self.role = role
        self.log_path = workdir / f"{role}.jsonl"
        self.stop_path = workdir / f"{role}.stop"
        self.stderr_path = workdir / f"{role}.stderr"
        spec = {**spec, "log": str(self.log_path), "stop": str(self.stop_path)}
        with open(self.stderr_path, "ab") as err:
            self.proc = subprocess.Popen(
                [sys.executable, __file__, f"--{role}", json.dumps(spec)],
                stdin=subprocess.DEVNULL,
                stdout=err,
                stderr=subprocess.STDOUT,
            )
        self.events: list[dict] = []
        self._pos = 0

    def poll(self) -> list[dict]:
        """Reads the complete lines logged since the last call; returns them (also kept)."""
        try:
            with open(self.log_path, "rb") as f:
                f.seek(self._pos)
                data = f.read()
        except FileNotFoundError:
            return []
        end = data.rfind(b"\n") + 1
        new = [json.loads(line) for line in data[:end].splitlines()]
        self._pos += end
        self.events.extend(new)
        return new

    def check_alive(self) -> None:
        code = self.proc.poll()
        if code is not None:
            raise AssertionError(f"the {self.role} process exited with {code}\n{self.stderr()}")

    def stop_and_wait(self, timeout: float) -> None:
        self.stop_path.touch()
        try:
            code = self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            raise AssertionError(f"the {self.role} process did not finish within {timeout} s\n{self.stderr()}")
        assert code == 0, f"the {self.role} process exited with {code}\n{self.stderr()}"
        self.poll()

    def stderr(self) -> str:
        try:
            return f"--- {self.stderr_path} ---\n" + self.stderr_path.read_text(errors="replace")[-4000:]
        except FileNotFoundError:
            return ""


@pytest.fixture
def client_procs(tmp_path):
    """Starts client processes; at teardown any still running gets SIGKILL (by its PID)."""
    started: list[ClientProc] = []

    def start(role: str, spec: dict) -> ClientProc:
        cp = ClientProc(tmp_path, role, spec)
        started.append(cp)
        return cp

    yield start
    for cp in started:
        if cp.proc.poll() is None:
            os.kill(cp.proc.pid, signal.SIGKILL)
            cp.proc.wait(timeout=10)


# ---- checks ------------------------------------------------------------------------------------


def read_log(bootstrap: str) -> tuple[dict[int, list[int]], dict[int, int]]:
    """Reads every partition from 0 to its high watermark; returns {partition: [seq by offset]}
    and the ends. Checks every payload and that offsets run 0, 1, 2, ... with no gap."""
    c = consumer(bootstrap)
    marks = watermarks(c, TOPIC, PARTITIONS)
    for p, (low, _) in marks.items():
        assert low == 0, f"partition {p} starts at {low}"
    ends = {p: hi for p, (_, hi) in marks.items()}
    c.assign([TopicPartition(TOPIC, p, 0) for p in range(PARTITIONS)])
    msgs = read_to_end(c, {(TOPIC, p): ends[p] for p in range(PARTITIONS)}, timeout=120)
    c.close()
    log: dict[int, list[int]] = defaultdict(list)
    offsets: dict[int, list[int]] = defaultdict(list)
    for m in msgs:
        seq = seq_of(m.value())
        assert (m.key(), m.value()) == (key_of(seq), value_of(seq)), f"message at {m.partition()}/{m.offset()} is damaged"
        log[m.partition()].append(seq)
        offsets[m.partition()].append(m.offset())
    for p in range(PARTITIONS):
        assert offsets[p] == list(range(ends[p])), f"partition {p}: offsets have gaps or repeats"
    return dict(log), ends


def check_log(log: dict[int, list[int]], produced: int, acked: dict, failed: dict) -> dict:
    """The producer-side checks; returns counts for the report."""
    where: dict[int, list[tuple[int, int]]] = defaultdict(list)
    for p, seqs in log.items():
        for o, s in enumerate(seqs):
            where[s].append((p, o))
    never_produced = [s for s in where if not 0 <= s < produced]
    assert not never_produced, f"the log holds messages never produced: {never_produced[:5]}"
    unreported = [s for s in range(produced) if s not in acked and s not in failed]
    assert not unreported, f"{len(unreported)} messages got no delivery report, first {unreported[:5]}"
    twice = {s: w for s, w in where.items() if len(w) > 1}
    lost = [s for s in acked if s not in where]
    moved = [(s, acked[s], where[s][0]) for s in acked if s in where and where[s][0] != acked[s]]
    counts = {
        "acknowledged": len(acked),
        "failed": len(failed),
        "failed_in_log": sum(1 for s in failed if s in where),
        "lost": len(lost),
        "duplicates": sum(len(w) - 1 for w in twice.values()),
    }
    print(f"log: {counts}")
    assert not lost, f"{len(lost)} of {len(acked)} acknowledged messages are gone, e.g. {sorted(lost)[:5]}"
    assert not twice, f"{len(twice)} messages are in the log more than once (idempotence failed): {sorted(twice.items())[:5]}"
    assert not moved, f"acknowledged messages not at their acknowledged offset: {moved[:5]}"
    for p, seqs in log.items():
        bad = [(o, seqs[o], seqs[o + 1]) for o in range(len(seqs) - 1) if seqs[o] >= seqs[o + 1]]
        assert not bad, f"partition {p} is out of produce order at (offset, seq, next seq) {bad[:5]}"
    return counts


def check_consumer(events: list[dict], log: dict[int, list[int]], ends: dict[int, int]) -> dict:
    """The consumer-side checks over its events in the order it logged them; returns counts."""
    damaged = [e for e in events if e["ev"] == "damaged"]
    assert not damaged, f"the consumer read damaged messages: {damaged[:3]}"
    fatal = [e for e in events if e["ev"] == "error" and e.get("fatal")]
    assert not fatal, f"the consumer had fatal errors: {fatal[:3]}"
    last: dict[int, int] = {}  # partition -> offset last consumed
    next_unseen = defaultdict(int)  # partition -> one past the highest offset consumed
    acked_commit = defaultdict(int)  # partition -> the latest acknowledged commit
    seen: dict[int, set[int]] = defaultdict(set)
    consumed = redelivered = rewinds = 0
    for e in events:
        if e["ev"] == "committed":
            for p, o in e["offsets"].items():
                acked_commit[int(p)] = max(acked_commit[int(p)], o)
        elif e["ev"] == "consumed":
            for p, o, s in e["records"]:
                assert o < len(log[p]) and log[p][o] == s, (
                    f"the consumer read seq {s} at {p}/{o}, but the log holds "
                    f"{log[p][o] if o < len(log[p]) else 'nothing'} there (what it saw was lost later)"
                )
                if last.get(p) is not None and o != last[p] + 1 or last.get(p) is None and o != 0:
                    # A jump: only back to the last acknowledged commit or later (redelivery), and
                    # never past what it has not seen (a message skipped).
                    assert o >= acked_commit[p], (
                        f"partition {p}: consumption went back to {o}, before the last acknowledged commit {acked_commit[p]}"
                    )
                    assert o <= next_unseen[p], f"partition {p}: consumption jumped to {o}, skipping from {next_unseen[p]}"
                    rewinds += 1
                if o < next_unseen[p]:
                    redelivered += 1
                consumed += 1
                last[p] = o
                next_unseen[p] = max(next_unseen[p], o + 1)
                seen[p].add(o)
    for p in range(PARTITIONS):
        missing = ends[p] - len(seen[p])
        assert seen[p] == set(range(ends[p])), f"partition {p}: the consumer never saw {missing} of {ends[p]} messages"
    counts = {"consumed": consumed, "redelivered": redelivered, "rewinds": rewinds,
              "assignments": sum(1 for e in events if e["ev"] == "assign"),
              "commits_acknowledged": sum(1 for e in events if e["ev"] == "committed" and e["offsets"]),
              "commits_failed": sum(1 for e in events if e["ev"] == "commit_failed" or e["ev"] == "committed" and e["errors"])}
    print(f"consumer: {counts}")
    return counts


# ---- the fault cycles --------------------------------------------------------------------------


def test_kill_and_stall_cycles(fresh_broker, client_procs):
    broker = fresh_broker
    seed = int(os.environ.get("SLUICE_FAULT_SEED", random.randrange(1 << 32)))
    print(f"SLUICE_FAULT_SEED={seed} SLUICE_FAULT_CYCLES={CYCLES}")
    rng = random.Random(seed)
    create_topic(broker.bootstrap, TOPIC, PARTITIONS)
    base = {"bootstrap": broker.bootstrap, "topic": TOPIC}
    cons = client_procs("consumer", {**base, "group": GROUP})
    prod = client_procs("producer", {**base, "rate": RATE, "flush_timeout": FLUSH_TIMEOUT_S})

    last_ok = [0.0]  # monotonic time of the latest successful delivery report
    last_consumed = [0.0]

    def follow() -> None:
        for e in prod.poll():
            if e["ev"] == "ok":
                last_ok[0] = e["t"]
            elif e["ev"] == "error" and e["fatal"]:
                raise AssertionError(f"the idempotent producer hit a fatal error: {e}")
        for e in cons.poll():
            if e["ev"] == "consumed":
                last_consumed[0] = e["t"]
            elif e["ev"] == "error" and e["fatal"]:
                raise AssertionError(f"the consumer hit a fatal error: {e}")
        prod.check_alive()
        cons.check_alive()

    def wait_for_progress(since: float, what: str) -> float:
        """Waits until both clients made progress after `since`; returns how long that took."""
        deadline = time.monotonic() + RESUME_TIMEOUT_S
        while True:
            follow()
            if last_ok[0] > since and last_consumed[0] > since:
                return time.monotonic() - since
            if time.monotonic() > deadline:
                raise AssertionError(
                    f"{what}: no progress within {RESUME_TIMEOUT_S} s (producer acknowledged "
                    f"{'yes' if last_ok[0] > since else 'nothing'}, consumer consumed "
                    f"{'yes' if last_consumed[0] > since else 'nothing'})\n{prod.stderr()}\n{cons.stderr()}"
                )
            time.sleep(0.05)

    kinds = Counter()
    stalled_s = 0.0
    resume_s: dict[str, list[float]] = defaultdict(list)
    t0 = time.monotonic()
    wait_for_progress(t0, "start")
    for cycle in range(CYCLES):
        time.sleep(rng.uniform(*GAP_S))
        kind = rng.choice(["kill", "stall"])
        kinds[kind] += 1
        if kind == "kill":
            broker.kill()
            broker.start()
        else:
            pause = rng.uniform(*STALL_S)
            os.kill(broker.pid, signal.SIGSTOP)
            try:
                time.sleep(pause)
            finally:
                os.kill(broker.pid, signal.SIGCONT)
            stalled_s += pause
        back = time.monotonic()
        resume_s[kind].append(wait_for_progress(back, f"cycle {cycle} ({kind})"))
    elapsed = time.monotonic() - t0

    # The end: the producer flushes everything, then the consumer drains to the ends.
    prod.stop_and_wait(FLUSH_TIMEOUT_S + PROC_EXIT_TIMEOUT_S)
    done = prod.events[-1]
    assert done["ev"] == "flushed" and done["left"] == 0, f"the producer did not flush everything: {done}"
    fatal = [e for e in prod.events if e["ev"] == "error" and e["fatal"]]
    assert not fatal, f"the idempotent producer hit fatal errors: {fatal[:3]}"
    produced = done["produced"]
    acked = {e["s"]: (e["p"], e["o"]) for e in prod.events if e["ev"] == "ok"}
    failed = {e["s"]: e["error"] for e in prod.events if e["ev"] == "fail"}
    c = consumer(broker.bootstrap)
    ends = {p: hi for p, (_, hi) in watermarks(c, TOPIC, PARTITIONS).items()}
    c.close()
    deadline = time.monotonic() + DRAIN_TIMEOUT_S
    reached: dict[int, int] = defaultdict(lambda: -1)
    new_events = cons.events  # everything logged so far, then what comes
    while True:
        for e in new_events:
            if e["ev"] == "consumed":
                for p, o, _ in e["records"]:
                    reached[p] = max(reached[p], o)
        if all(reached[p] >= ends[p] - 1 for p in range(PARTITIONS)):
            break
        cons.check_alive()
        assert time.monotonic() < deadline, f"the consumer did not drain within {DRAIN_TIMEOUT_S} s: at {dict(reached)} of ends {ends}"
        time.sleep(0.05)
        new_events = cons.poll()
    # Let its last commit complete before it closes.
    deadline = time.monotonic() + PROC_EXIT_TIMEOUT_S
    while True:
        cons.poll()
        commits = [e["ev"] for e in cons.events if e["ev"] in ("committing", "committed", "commit_failed")]
        if not commits or commits[-1] != "committing":
            break
        assert time.monotonic() < deadline, "the consumer's last commit did not complete"
        time.sleep(0.05)
    cons.stop_and_wait(PROC_EXIT_TIMEOUT_S)

    log, final_ends = read_log(broker.bootstrap)
    assert final_ends == ends, f"the log grew after the producer flushed: {ends} -> {final_ends}"
    log_counts = check_log(log, produced, acked, failed)
    consumer_counts = check_consumer(cons.events, log, ends)
    g = consumer(broker.bootstrap, **{"group.id": GROUP})
    committed = {tp.partition: tp.offset for tp in g.committed([TopicPartition(TOPIC, p) for p in range(PARTITIONS)], timeout=10)}
    g.close()
    assert committed == ends, f"the group's committed offsets {committed} are not the ends {ends}"

    def spread(xs):
        return f"{min(xs):.2f}-{max(xs):.2f} s" if xs else "-"

    print(
        f"faults: {CYCLES} in {elapsed:.0f} s: {kinds['kill']} SIGKILL+restart, {kinds['stall']} SIGSTOP/SIGCONT "
        f"({stalled_s:.0f} s stalled); progress again after a restart {spread(resume_s['kill'])}, after a stall "
        f"{spread(resume_s['stall'])}; consumer resumed after all {CYCLES}; produced {produced}, "
        f"{json.dumps(log_counts)}, {json.dumps(consumer_counts)}"
    )


# ---- a tiny batch cache under cold reads ---------------------------------------------------------

CACHE_TOPIC = "cold"
CACHE_PARTITIONS = 4
CACHE_BYTES = 64 << 10
# Cold data: this many messages of VALUE_BYTES per partition before the readers start.
COLD_PER_PARTITION = 12_000
VALUE_BYTES = 2_000
# Readers: each reads READ_SPAN partitions from offset 0, so every partition is read by two
# readers at different positions at once.
READERS = 4
READ_SPAN = 2
TAIL_RATE = 1_000  # messages per second appended at the tail while they read
TAIL_SECONDS = 8
# The broker idles at about 40 MiB (debug build); with the default 256 MiB cache per shard, the
# cold data alone (~96 MB) would fit in the cache. Today's peak is about 55 MiB.
PEAK_RSS_BOUND_KIB = 96 << 10


def cold_value(p: int, seq: int) -> bytes:
    body = (digest("cold", p, seq).encode() * (VALUE_BYTES // 64 + 1))[:VALUE_BYTES]
    return b"%d|%d|%08x|" % (p, seq, zlib.crc32(body)) + body


def check_cold(m) -> None:
    p, seq, crc, body = m.value().split(b"|", 3)
    assert int(p) == m.partition(), f"a message of partition {int(p)} read from {m.partition()}"
    assert int(seq) == m.offset(), f"{m.partition()}/{m.offset()} holds message {int(seq)} (order)"
    assert int(crc, 16) == zlib.crc32(body), f"{m.partition()}/{m.offset()}: payload checksum mismatch"


def vm_hwm_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1])
    raise AssertionError("no VmHWM")


@pytest.fixture
def tiny_cache_broker(unstarted_broker):
    config = unstarted_broker.root / "sluice.toml"
    config.write_text(f"batch.cache.bytes = {CACHE_BYTES}\n")
    unstarted_broker.extra_args += ["--config", str(config)]
    unstarted_broker.start()
    # The setting took effect (a TOML file once parsed the name as nested tables and ignored it).
    resource = ConfigResource(ResourceType.BROKER, "1")
    admin_client = AdminClient({"bootstrap.servers": unstarted_broker.bootstrap})
    described = admin_client.describe_configs([resource])[resource].result(timeout=15)
    assert described["batch.cache.bytes"].value == str(CACHE_BYTES)
    return unstarted_broker


def test_tiny_batch_cache_under_cold_reads(tiny_cache_broker):
    broker = tiny_cache_broker
    create_topic(broker.bootstrap, CACHE_TOPIC, CACHE_PARTITIONS)
    p = producer(broker.bootstrap, **{"enable.idempotence": True, "linger.ms": 20, "batch.num.messages": 1_000})
    failed: list = []

    def on_delivery(err, msg):
        if err is not None:
            failed.append(str(err))

    def produce(part: int, seq: int) -> None:
        while True:
            try:
                p.produce(CACHE_TOPIC, partition=part, value=cold_value(part, seq), on_delivery=on_delivery)
                return
            except BufferError:
                p.poll(0.05)

    t = time.monotonic()
    for seq in range(COLD_PER_PARTITION):
        for part in range(CACHE_PARTITIONS):
            produce(part, seq)
        p.poll(0)
    assert p.flush(120) == 0 and not failed, f"cold data not all acknowledged: {failed[:3]}"
    cold_bytes = COLD_PER_PARTITION * CACHE_PARTITIONS * VALUE_BYTES
    print(f"cold data: {cold_bytes >> 20} MiB in {time.monotonic() - t:.1f} s; broker VmHWM {vm_hwm_kib(broker.pid) >> 10} MiB")
    # A clean restart: the data is cold (in no cache of the broker), and the peak RSS measured
    # from here is the reads' (appending grows the broker's RSS on its own: see
    # test_resident_memory_does_not_grow_with_appends).
    p.flush(10)
    broker.restart()
    p = producer(broker.bootstrap, **{"enable.idempotence": True, "linger.ms": 20, "batch.num.messages": 1_000})
    start_kib = vm_hwm_kib(broker.pid)

    ends: dict[int, int] = {}
    errors: list[str] = []
    read_bytes = [0] * READERS
    stop_tail = threading.Event()

    def tail() -> None:
        seq = COLD_PER_PARTITION
        started = time.monotonic()
        try:
            while not stop_tail.is_set() and time.monotonic() - started < TAIL_SECONDS:
                for part in range(CACHE_PARTITIONS):
                    produce(part, seq)
                seq += 1
                p.poll(0)
                time.sleep(CACHE_PARTITIONS / TAIL_RATE)
            assert p.flush(60) == 0 and not failed, f"tail messages not all acknowledged: {failed[:3]}"
            ends.update({part: seq for part in range(CACHE_PARTITIONS)})
        except BaseException as e:
            errors.append(f"tail producer: {e!r}")

    def reader(i: int) -> None:
        parts = [(i + k) % CACHE_PARTITIONS for k in range(READ_SPAN)]
        c = consumer(broker.bootstrap, **{"client.id": f"reader-{i}"})
        try:
            c.assign([TopicPartition(CACHE_TOPIC, part, 0) for part in parts])
            nxt = {part: 0 for part in parts}
            deadline = time.monotonic() + 180
            while not ends or any(nxt[part] < ends[part] for part in parts):
                assert time.monotonic() < deadline, f"reader {i} is stuck at {nxt} (ends {ends})"
                assert not errors, "another thread failed"
                for m in c.consume(num_messages=1_000, timeout=0.5):
                    err = m.error()
                    if err is not None:
                        if err.code() == KafkaError._PARTITION_EOF:
                            continue
                        raise AssertionError(f"consumer error: {err}")
                    assert m.offset() == nxt[m.partition()], f"reader {i}: {m.partition()}/{m.offset()} after {nxt[m.partition()] - 1}"
                    check_cold(m)
                    nxt[m.partition()] += 1
                    read_bytes[i] += len(m.value())
        except BaseException as e:
            errors.append(f"reader {i}: {e!r}\n{traceback.format_exc()}")
        finally:
            c.close()

    peak = [0]
    done = threading.Event()

    def sample() -> None:
        while not done.wait(0.2):
            try:
                peak[0] = max(peak[0], vm_hwm_kib(broker.pid))
            except (OSError, AssertionError):
                return

    threads = [threading.Thread(target=reader, args=(i,), daemon=True) for i in range(READERS)]
    threads.append(threading.Thread(target=tail, daemon=True))
    sampler = threading.Thread(target=sample, daemon=True)
    t = time.monotonic()
    sampler.start()
    for th in threads:
        th.start()
    for th in threads:
        th.join(timeout=240)
    stop_tail.set()
    done.set()
    sampler.join(timeout=5)
    hung = [th.name for th in threads if th.is_alive()]
    assert not hung, f"threads still running after 240 s: {hung}"
    assert not errors, "\n".join(errors)
    hwm = vm_hwm_kib(broker.pid)
    total = sum(read_bytes)
    appended = sum(ends.values()) - COLD_PER_PARTITION * CACHE_PARTITIONS
    print(
        f"read {total >> 20} MiB ({READERS} readers x {READ_SPAN} partitions) in {time.monotonic() - t:.1f} s "
        f"with a {CACHE_BYTES >> 10} KiB cache per shard while appending {appended} messages "
        f"({appended * VALUE_BYTES >> 20} MiB); broker peak RSS (VmHWM) {start_kib >> 10} MiB after the restart, "
        f"{hwm >> 10} MiB at the end"
    )
    assert total >= READ_SPAN * cold_bytes, "the readers read less than the cold data twice over"
    assert hwm < PEAK_RSS_BOUND_KIB, f"the broker's peak RSS {hwm >> 10} MiB is over {PEAK_RSS_BOUND_KIB >> 10} MiB"


def vm_rss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise AssertionError("no VmRSS")


# Appending the same load round after round: once the first round has warmed the broker up
# (buffers, allocator), later rounds must not grow its resident memory by more than this.
APPEND_ROUNDS = 4
ROUND_PER_PARTITION = 6_000  # x CACHE_PARTITIONS x VALUE_BYTES = 48 MB per round
APPEND_GROWTH_BOUND_KIB = 32 << 10


def test_resident_memory_does_not_grow_with_appends(tiny_cache_broker):
    broker = tiny_cache_broker
    create_topic(broker.bootstrap, CACHE_TOPIC, CACHE_PARTITIONS)
    p = producer(broker.bootstrap, **{"enable.idempotence": True, "linger.ms": 20, "batch.num.messages": 1_000})
    failed: list = []

    def on_delivery(err, msg):
        if err is not None:
            failed.append(str(err))

    rss = [vm_rss_kib(broker.pid)]
    for r in range(APPEND_ROUNDS):
        for seq in range(r * ROUND_PER_PARTITION, (r + 1) * ROUND_PER_PARTITION):
            for part in range(CACHE_PARTITIONS):
                while True:
                    try:
                        p.produce(CACHE_TOPIC, partition=part, value=cold_value(part, seq), on_delivery=on_delivery)
                        break
                    except BufferError:
                        p.poll(0.05)
            p.poll(0)
        assert p.flush(120) == 0 and not failed, f"round {r}: not all acknowledged: {failed[:3]}"
        time.sleep(0.5)
        rss.append(vm_rss_kib(broker.pid))
    round_mib = ROUND_PER_PARTITION * CACHE_PARTITIONS * VALUE_BYTES >> 20
    print(f"broker RSS (MiB) idle, then after each round of {round_mib} MiB appended: {[k >> 10 for k in rss]}")
    growth = rss[-1] - rss[1]
    assert growth < APPEND_GROWTH_BOUND_KIB, (
        f"the broker's resident memory grew by {growth >> 10} MiB over {APPEND_ROUNDS - 1} more rounds of "
        f"{round_mib} MiB appended with a {CACHE_BYTES >> 10} KiB batch cache: {[k >> 10 for k in rss]} MiB"
    )


if __name__ == "__main__" and len(sys.argv) == 3 and sys.argv[1] in ("--producer", "--consumer"):
    try:
        main = producer_main if sys.argv[1] == "--producer" else consumer_main
        code = main(json.loads(sys.argv[2]))
    except BaseException:
        traceback.print_exc()
        code = 1
    sys.exit(code)
