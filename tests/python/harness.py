"""Starting and stopping a real `sluice` process, and small client helpers shared by the tests.

The binary is `target/debug/sluice` (`tests/run` builds it), or `$SLUICE_BIN`. Data directories
live under `$SLUICE_TEST_DIR` (default `target/tmp`): the engine uses O_DIRECT, which tmpfs
does not support, so they must be on a real filesystem.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from confluent_kafka import Consumer, KafkaError, KafkaException, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic, OffsetSpec

REPO = Path(__file__).resolve().parents[2]
SLUICE_BIN = Path(os.environ.get("SLUICE_BIN", REPO / "target" / "debug" / "sluice"))
TEST_DIR = Path(os.environ.get("SLUICE_TEST_DIR", REPO / "target" / "tmp"))

# How long a starting broker may take to answer Metadata.
START_TIMEOUT_S = 30.0
# How long SIGTERM may take before the harness resorts to SIGKILL.
STOP_TIMEOUT_S = 10.0
# How long a killed broker's port may keep accepting connections (see `Broker.kill`).
KILLED_PORT_CLOSES_S = 2.0
LOG_TAIL_LINES = 80
# Shard 0 logs this once it serves, after any start-up work such as creating internal topics.
READY_LINE = "serving the Kafka protocol"


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class BrokerError(AssertionError):
    pass


class Broker:
    """One `sluice` process on 127.0.0.1 (or `host`), restartable on the same data directory and
    port. `prefix` goes before the command, e.g. `ip netns exec NS` to run it in a network
    namespace."""

    def __init__(self, cores: int = 2, num_partitions: int = 1, name: str = "broker", extra_args=(),
                 listener_name: str = "PLAINTEXT", client_config: dict | None = None):
        """`extra_args` go on the command line after the harness's own flags, e.g.
        `["--group-initial-rebalance-delay-ms", "300"]`. `listener_name` names the client
        listener (its protocol comes from `listener.security.protocol.map`) and
        `client_config` is what a librdkafka client needs to talk to it (e.g. SSL settings)."""
        TEST_DIR.mkdir(parents=True, exist_ok=True)
        self.root = Path(tempfile.mkdtemp(prefix=f"pytest-{name}-", dir=TEST_DIR))
        self.data_dir = self.root / "data"
        self.log_path = self.root / "sluice.log"
        self.cores = cores
        self.num_partitions = num_partitions
        self.extra_args = [str(a) for a in extra_args]
        self.listener_name = listener_name
        self.client_config = dict(client_config or {})
        self.port = free_port()
        self.host = "127.0.0.1"
        self.prefix: list[str] = []
        self.proc: subprocess.Popen | None = None
        self.starts = 0

    @property
    def bootstrap(self) -> str:
        return f"{self.host}:{self.port}"

    @property
    def pid(self) -> int:
        assert self.proc is not None, "broker is not running"
        return self.proc.pid

    def listeners(self) -> str:
        """The `--listeners` flag's value (a cluster node adds its CONTROLLER listener)."""
        return f"{self.listener_name}://{self.bootstrap}"

    def start(self, new_port: bool = False, wait_for_partitions: bool = True, wait: bool = True) -> None:
        """Starts the broker on its data directory; `new_port` moves it to another free port.

        Returns once the port answers Metadata and, with `wait_for_partitions`, once ListOffsets
        answers for every partition Metadata lists: each shard serves as soon as its own
        partitions are open, so the port can answer while another shard still recovers
        (test_restart.py::test_every_listed_partition_answers_once_the_port_does). Without
        `wait` it returns at once (a cluster's nodes wait for each other: start them all, then
        `wait_ready`)."""
        assert self.proc is None or self.proc.poll() is not None, "broker already running"
        if new_port:
            self.port = free_port()
        if not SLUICE_BIN.exists():
            raise BrokerError(f"{SLUICE_BIN} does not exist; build it with `cargo build -p sluice-broker`")
        self.starts += 1
        log = open(self.log_path, "ab")
        log.write(f"\n===== start {self.starts} =====\n".encode())
        log.flush()
        self.proc = subprocess.Popen(
            [
                *self.prefix,
                str(SLUICE_BIN),
                "--data-dir", str(self.data_dir),
                "--listeners", self.listeners(),
                "--cores", str(self.cores),
                "--num-partitions", str(self.num_partitions),
                *self.extra_args,
            ],
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            env={**os.environ, "RUST_LOG": os.environ.get("RUST_LOG", "info")},
        )
        log.close()
        if wait:
            self.wait_ready(wait_for_partitions)

    def wait_ready(self, wait_for_partitions: bool = True) -> None:
        deadline = time.monotonic() + START_TIMEOUT_S
        while True:
            code = self.proc.poll()
            if code is not None:
                raise BrokerError(f"sluice exited with {code} while starting\n{self.log_tail()}")
            if time.monotonic() > deadline:
                raise BrokerError(f"sluice did not answer within {START_TIMEOUT_S} s\n{self.log_tail()}")
            try:
                with socket.create_connection((self.host, self.port), timeout=0.5):
                    pass
            except OSError:
                time.sleep(0.05)
                continue
            break
        # The port answers; now the protocol must too.
        client = admin(self.bootstrap, **self.client_config)
        while True:
            try:
                md = client.list_topics(timeout=1.0)
            except Exception as e:
                code = self.proc.poll()
                if code is not None or time.monotonic() > deadline:
                    raise BrokerError(f"Metadata failed ({e}); sluice exit status {code}\n{self.log_tail()}") from e
                continue
            # A cluster node lists brokers once they have registered with the controller.
            if md.brokers:
                break
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise BrokerError(f"Metadata named no broker\n{self.log_tail()}")
            time.sleep(0.05)
        while wait_for_partitions:
            missing = unanswered_partitions(client)
            if not missing:
                break
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise BrokerError(f"ListOffsets still fails for {missing[:5]}\n{self.log_tail()}")
            time.sleep(0.05)

    def stop(self, sig: int = signal.SIGTERM, timeout: float = STOP_TIMEOUT_S) -> int:
        """Sends `sig` to the process this harness started and reaps it. After SIGTERM, a
        process still alive after `timeout` gets SIGKILL and the stop is an error."""
        assert self.proc is not None, "broker was never started"
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
            try:
                self.proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
                raise BrokerError(
                    f"sluice (pid {self.proc.pid}) did not exit within {timeout} s of "
                    f"{signal.Signals(sig).name}; killed\n{self.log_tail()}"
                )
        return self.proc.returncode

    def stop_cleanly(self) -> None:
        """SIGTERM, and the broker must exit 0 having closed every shard."""
        code = self.stop(signal.SIGTERM)
        if code != 0:
            raise BrokerError(f"sluice exited with {code} after SIGTERM\n{self.log_tail()}")

    def kill(self) -> None:
        """SIGKILL: no chance to flush or close anything. Returns once the port refuses
        connections: the kernel tears a killed process's io_uring down asynchronously, and a
        listening socket with an accept still queued there keeps accepting for about 10 ms after
        the process was reaped; the next start's check would take that for another broker
        ("another process is listening there"). Kafka, without io_uring, has no such window."""
        self.kill_and_wait_refused(self.port)

    def kill_and_wait_refused(self, port: int) -> None:
        """SIGKILL, then wait until `port` refuses connections (see `kill`)."""
        code = self.stop(signal.SIGKILL)
        assert code == -signal.SIGKILL, f"expected death by SIGKILL, got exit {code}"
        deadline = time.monotonic() + KILLED_PORT_CLOSES_S
        while True:
            try:
                socket.create_connection((self.host, port), timeout=0.2).close()
            except OSError:
                return
            assert time.monotonic() < deadline, f"port {port} still accepts connections {KILLED_PORT_CLOSES_S} s after the kill"
            time.sleep(0.005)

    def restart(self, sig: int = signal.SIGTERM, new_port: bool = False) -> None:
        """Stops with SIGTERM (must exit 0) or SIGKILL and starts again on the same data."""
        if sig == signal.SIGKILL:
            self.kill()
        else:
            self.stop_cleanly()
        self.start(new_port=new_port)

    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def log_text(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")
        except FileNotFoundError:
            return ""

    def current_log(self) -> str:
        """The log since the latest start."""
        return self.log_text().rsplit(f"===== start {self.starts} =====", 1)[-1]

    def log_tail(self, lines: int = LOG_TAIL_LINES) -> str:
        tail = self.log_text().splitlines()[-lines:]
        return f"--- last {len(tail)} lines of {self.log_path} ---\n" + "\n".join(tail)

    def remove(self) -> None:
        shutil.rmtree(self.root, ignore_errors=True)


# ---- client helpers ---------------------------------------------------------------------------

# librdkafka's log lines go through Python logging (delivered on poll), so pytest shows them with
# the test that failed instead of them reaching stderr at random moments.
LIBRDKAFKA_LOG = logging.getLogger("librdkafka")
CLIENT_DEFAULTS = {"logger": LIBRDKAFKA_LOG, "log.connection.close": False}


def admin(bootstrap: str, **extra) -> AdminClient:
    return AdminClient({"bootstrap.servers": bootstrap, **CLIENT_DEFAULTS, **extra})


def unanswered_partitions(client: AdminClient) -> list:
    """Partitions that Metadata lists but ListOffsets (latest) fails for, with their errors."""
    md = client.list_topics(timeout=10)
    tps = [TopicPartition(name, p) for name, t in md.topics.items() if t.error is None for p in t.partitions]
    if not tps:
        return []
    futures = client.list_offsets({tp: OffsetSpec.latest() for tp in tps}, request_timeout=10)
    missing = []
    for tp, f in futures.items():
        try:
            f.result(timeout=15)
        except KafkaException as e:
            missing.append((tp.topic, tp.partition, str(e)))
    return sorted(missing)


def create_topic(bootstrap: str, name: str, partitions: int, config: dict | None = None) -> None:
    client = admin(bootstrap)
    futures = client.create_topics(
        [NewTopic(name, num_partitions=partitions, replication_factor=1, config=config or {})],
        operation_timeout=10,
        request_timeout=15,
    )
    futures[name].result(timeout=20)
    # Sluice answers Metadata with the new topic at once; Apache Kafka (the reference in the
    # differential tests) may take a moment to propagate it to its broker's metadata cache.
    deadline = time.monotonic() + 15
    while True:
        md = client.list_topics(topic=name, timeout=10)
        if md.topics[name].error is None or time.monotonic() > deadline:
            break
        time.sleep(0.1)
    assert md.topics[name].error is None, md.topics[name].error
    assert sorted(md.topics[name].partitions) == list(range(partitions))


def consumer(bootstrap: str, **extra) -> Consumer:
    """A consumer for manual assignment (assign(), never subscribe()): these tests do not rely on
    group coordination, but librdkafka requires a group.id. Nothing is committed."""
    config = {
        "bootstrap.servers": bootstrap,
        "group.id": "sluice-tests-unused",
        "enable.auto.commit": False,
        "enable.auto.offset.store": False,
        "auto.offset.reset": "error",
        "fetch.wait.max.ms": 100,
        **CLIENT_DEFAULTS,
    }
    config.update(extra)
    return Consumer(config)


def watermarks(c: Consumer, topic: str, partitions: int) -> dict[int, tuple[int, int]]:
    return {p: c.get_watermark_offsets(TopicPartition(topic, p), timeout=10, cached=False) for p in range(partitions)}


def read_to_end(c: Consumer, ends: dict[tuple[str, int], int], timeout: float = 60.0) -> list:
    """Reads from the current assignment until every (topic, partition) has delivered the
    message just before its end offset; returns the messages in the order received. Fails on a
    consumer error, on a message at or past its partition's end, or when time runs out."""
    pending = {tp: end for tp, end in ends.items()}
    positions = {tp: None for tp in ends}
    for tp, end in list(pending.items()):
        if end == 0:
            del pending[tp]
    out = []
    deadline = time.monotonic() + timeout
    while pending:
        if time.monotonic() > deadline:
            raise AssertionError(
                f"timed out reading; still waiting for {pending} (last offsets seen {positions})"
            )
        for m in c.consume(num_messages=10_000, timeout=0.5):
            err = m.error()
            if err is not None:
                if err.code() == KafkaError._PARTITION_EOF:
                    continue
                raise AssertionError(f"consumer error: {err}")
            tp = (m.topic(), m.partition())
            assert tp in ends, f"message from unassigned {tp}"
            assert m.offset() < ends[tp], f"{tp} delivered offset {m.offset()} at or past its end {ends[tp]}"
            positions[tp] = m.offset()
            out.append(m)
            if m.offset() == ends[tp] - 1:
                pending.pop(tp, None)
    return out


def digest(*parts) -> str:
    h = hashlib.sha256()
    for p in parts:
        h.update(str(p).encode())
        h.update(b"\0")
    return h.hexdigest()


# ---- producing ---------------------------------------------------------------------------------


@dataclass
class Delivery:
    """One delivery report: the broker's answer for one message."""

    error: object  # KafkaError or None
    partition: int
    offset: int
    timestamp: int


def producer(bootstrap: str, **extra) -> Producer:
    config = {
        "bootstrap.servers": bootstrap,
        "acks": "all",
        "linger.ms": 10,
        "batch.num.messages": 10_000,
        # librdkafka's default, stated: the tests check the broker's offsets and order as they
        # are, without producer ids and sequence numbers.
        "enable.idempotence": False,
        "message.timeout.ms": 60_000,
        **CLIENT_DEFAULTS,
    }
    config.update(extra)
    return Producer(config)


def produce_all(p: Producer, topic: str, messages, flush_timeout: float = 120.0) -> list[Delivery]:
    """Produces `messages` (dicts of Producer.produce keyword arguments) in order, flushes, and
    returns each message's delivery report by index. Fails if any report is missing."""
    reports: list[Delivery | None] = []

    def on_delivery(index):
        def cb(err, msg):
            reports[index] = Delivery(err, msg.partition(), msg.offset(), msg.timestamp()[1])

        return cb

    for i, m in enumerate(messages):
        reports.append(None)
        while True:
            try:
                p.produce(topic, on_delivery=on_delivery(i), **m)
                break
            except BufferError:
                p.poll(0.05)
        p.poll(0)
    left = p.flush(flush_timeout)
    assert left == 0, f"{left} messages still unacknowledged after {flush_timeout} s"
    missing = [i for i, r in enumerate(reports) if r is None]
    assert not missing, f"{len(missing)} messages got no delivery report, first {missing[:5]}"
    return reports


def assert_all_delivered(reports: list[Delivery]) -> None:
    failed = [(i, r.error) for i, r in enumerate(reports) if r.error is not None]
    assert not failed, f"{len(failed)} of {len(reports)} deliveries failed, first: {failed[:5]}"


class Stats:
    """librdkafka statistics, to see the bytes that really crossed the wire."""

    def __init__(self):
        self.latest: dict | None = None

    def __call__(self, raw: str) -> None:
        self.latest = json.loads(raw)

    def config(self) -> dict:
        return {"statistics.interval.ms": 100, "stats_cb": self}

    def wait_for(self, client, predicate, timeout: float = 10.0) -> dict:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            client.poll(0.1)
            if self.latest is not None and predicate(self.latest):
                return self.latest
        raise AssertionError(f"statistics never satisfied the condition; last: {self.latest and {k: self.latest[k] for k in ('txmsgs', 'rxmsgs') if k in self.latest}}")

    @staticmethod
    def wire_bytes(stats: dict, direction: str) -> int:
        """Bytes sent ("txbytes") or received ("rxbytes") over every broker connection."""
        return sum(b[direction] for b in stats["brokers"].values())
