"""Apache Kafka 4.x running beside Sluice as the reference for differential tests.

`KafkaReference` starts one combined broker and controller (KRaft) from the jars that
`tests/java/fetch-deps` puts in `target/java-deps` (it runs that script when they are missing),
on free 127.0.0.1 ports and a fresh directory under the test directory, with the server
properties a test module asks for. Tests send the same requests to it and to Sluice and compare
what each answers.
"""

from __future__ import annotations

import base64
import gc
import os
import shutil
import signal
import subprocess
import tempfile
import time
import uuid
from pathlib import Path

from confluent_kafka.admin import AdminClient

from harness import REPO, TEST_DIR, free_port

DEPS = REPO / "target" / "java-deps"
# A cold JVM on two busy cores takes 10-20 s to serve.
START_TIMEOUT_S = 120.0


def ensure_jars() -> None:
    if not (DEPS / ".pom.sha256").exists():
        subprocess.run([str(REPO / "tests" / "java" / "fetch-deps")], check=True)


def kafka_tool(main: str, *args, timeout: float = 180) -> str:
    """Runs one of Apache Kafka's command-line tools (`org.apache.kafka.tools...`); its stdout."""
    ensure_jars()
    cmd = ["java", "-XX:TieredStopAtLevel=1", "-Dorg.slf4j.simpleLogger.defaultLogLevel=warn",
           "-cp", f"{DEPS}/*", main, *args]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    assert done.returncode == 0, f"{main} {' '.join(args)}: exit {done.returncode}\n{done.stdout}\n{done.stderr}"
    return done.stdout


def java(*args, stdin=None, timeout=180) -> subprocess.CompletedProcess:
    """Runs a Java main class (a Kafka tool, or a source file) with the Kafka jars on the class
    path; the finished process, whatever its exit status."""
    ensure_jars()
    return subprocess.run(
        ["java", "-Xmx256m", "-Dorg.slf4j.simpleLogger.defaultLogLevel=warn", "-cp", f"{DEPS}/*", *args],
        input=stdin, capture_output=True, text=True, timeout=timeout,
    )


class KafkaReference:
    """One Apache Kafka broker+controller process, stopped by PID."""

    def __init__(self, props: dict | None = None, name: str = "kafka"):
        ensure_jars()
        TEST_DIR.mkdir(parents=True, exist_ok=True)
        self.root = Path(tempfile.mkdtemp(prefix=f"pytest-{name}-", dir=TEST_DIR))
        self.port = free_port()
        self.controller_port = free_port()
        self.props = {
            "process.roles": "broker,controller",
            "node.id": "1",
            "controller.quorum.bootstrap.servers": f"127.0.0.1:{self.controller_port}",
            "listeners": f"PLAINTEXT://127.0.0.1:{self.port},CONTROLLER://127.0.0.1:{self.controller_port}",
            "advertised.listeners": f"PLAINTEXT://127.0.0.1:{self.port}",
            "controller.listener.names": "CONTROLLER",
            "listener.security.protocol.map": "PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT",
            "inter.broker.listener.name": "PLAINTEXT",
            "log.dirs": str(self.root / "data"),
            "num.partitions": "1",
            "offsets.topic.replication.factor": "1",
            "offsets.topic.num.partitions": "3",
            "transaction.state.log.replication.factor": "1",
            "transaction.state.log.min.isr": "1",
            "share.coordinator.state.topic.replication.factor": "1",
            "share.coordinator.state.topic.min.isr": "1",
            "group.initial.rebalance.delay.ms": "0",
            **(props or {}),
        }
        self.proc: subprocess.Popen | None = None

    @property
    def bootstrap(self) -> str:
        return f"127.0.0.1:{self.port}"

    def _java(self, *args) -> list[str]:
        # slf4j-simple (tests/java/pom.xml) writes the broker's log, at INFO, to server.log.
        return ["java", "-Xmx512m", "-XX:+UseG1GC", "-Djava.awt.headless=true",
                f"-Dorg.slf4j.simpleLogger.logFile={self.root / 'server.log'}",
                "-Dorg.slf4j.simpleLogger.defaultLogLevel=info",
                "-Dorg.slf4j.simpleLogger.showDateTime=true",
                "-cp", f"{DEPS}/*", *args]

    def start(self) -> None:
        props = self.root / "server.properties"
        props.write_text("".join(f"{k}={v}\n" for k, v in self.props.items()))
        # An id starting with '-' would be read as an option by kafka-storage's parser.
        cluster_id = "-"
        while cluster_id.startswith("-"):
            cluster_id = base64.urlsafe_b64encode(uuid.uuid4().bytes).decode().rstrip("=")
        subprocess.run(self._java("kafka.tools.StorageTool", "format", "-t", cluster_id,
                                  "-c", str(props), "--standalone"),
                       check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, timeout=120)
        out = open(self.root / "stdout.log", "wb")
        self.proc = subprocess.Popen(self._java("kafka.Kafka", str(props)), stdin=subprocess.DEVNULL,
                                     stdout=out, stderr=subprocess.STDOUT)
        out.close()
        deadline = time.monotonic() + START_TIMEOUT_S
        client = AdminClient({"bootstrap.servers": self.bootstrap})
        while True:
            assert self.proc.poll() is None, f"Kafka exited: {self.log_tail()}"
            try:
                # Serving once it lists itself as a registered, unfenced broker.
                md = client.list_topics(timeout=2)
                if md.brokers:
                    break
            except Exception:
                pass
            assert time.monotonic() < deadline, f"Kafka did not start: {self.log_tail()}"
            time.sleep(0.5)
        # The reference broker's own log is what explains a difference; one that logs nothing
        # (an slf4j 1.7 API beside Kafka 4's slf4j 2 logging) fails here.
        started = (self.root / "server.log").read_text(errors="replace") if (self.root / "server.log").exists() else ""
        assert "Kafka Server started" in started, f"the reference Kafka wrote no log: {started[-2000:]!r}"

    def log_tail(self, lines: int = 40) -> str:
        path = self.root / "server.log"
        if not path.exists():
            return ""
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])

    def stop(self) -> None:
        # Clients a test left for the garbage collector go while Kafka still answers, rather
        # than retry their connections loudly afterwards.
        gc.collect()
        if self.proc is not None and self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                os.kill(self.proc.pid, signal.SIGKILL)
                self.proc.wait()

    def remove(self) -> None:
        shutil.rmtree(self.root, ignore_errors=True)
