"""SASL listeners (`SASL_PLAINTEXT`, `SASL_SSL`) with the PLAIN mechanism, its users in Kafka's
`listener.name.<l>.plain.sasl.jaas.config`: librdkafka and kafka-python authenticate, produce
and consume (groups and transactions too), wrong passwords, unknown users and mechanisms are
refused with Kafka's errors, and raw frames check what Kafka's SASL server checks (nothing but
ApiVersions and SASL before authentication, pipelined requests answered in order)."""

from __future__ import annotations

import socket
import struct
import subprocess
import tempfile
import time
import urllib.request
from pathlib import Path

import pytest
from confluent_kafka import Consumer, KafkaException, Producer, TopicPartition
from confluent_kafka.admin import NewTopic

import certs as certs_mod
from harness import SLUICE_BIN, TEST_DIR, Broker, admin, free_port
from reference import java

ALICE_PW = "alice-Pw-3d9c"
ADMIN_PW = "admin-Pw-81be"
JAAS = ('org.apache.kafka.common.security.plain.PlainLoginModule required '
        f'username="admin" password="{ADMIN_PW}" user_admin="{ADMIN_PW}" user_alice="{ALICE_PW}";')


def sasl_client(user="alice", password=ALICE_PW, protocol="SASL_PLAINTEXT", mechanism="PLAIN", **extra) -> dict:
    return {"security.protocol": protocol, "sasl.mechanism": mechanism, "sasl.username": user,
            "sasl.password": password, **extra}


def sasl_broker(name: str, protocol: str = "SASL_PLAINTEXT", client: dict | None = None, args=()) -> Broker:
    return Broker(
        cores=2, num_partitions=2, name=name, listener_name="CLIENT",
        client_config=client if client is not None else sasl_client(protocol=protocol),
        extra_args=["--listener-security-protocol-map", f"CLIENT:{protocol}",
                    "--sasl-enabled-mechanisms", "PLAIN",
                    "--override", f"listener.name.client.plain.sasl.jaas.config={JAAS}",
                    "--connection-failed-authentication-delay-ms", "300", *args],
    )


@pytest.fixture(scope="module")
def broker():
    metrics_port = free_port()
    b = sasl_broker("sasl", args=["--metrics-listener", f"127.0.0.1:{metrics_port}"])
    b.metrics_port = metrics_port
    b.start()
    yield b
    b.stop()
    b.remove()


def request(api_key: int, version: int, corr: int, body: bytes) -> bytes:
    header = struct.pack(">hhih", api_key, version, corr, 4) + b"test"
    return struct.pack(">i", len(header) + len(body)) + header + body


def api_versions(corr: int) -> bytes:
    return request(18, 0, corr, b"")


def handshake(corr: int, mechanism: str) -> bytes:
    m = mechanism.encode()
    return request(17, 1, corr, struct.pack(">h", len(m)) + m)


def authenticate(corr: int, token: bytes) -> bytes:
    return request(36, 1, corr, struct.pack(">i", len(token)) + token)


def metadata(corr: int) -> bytes:
    return request(3, 1, corr, struct.pack(">i", -1))


def read_frames(sock: socket.socket, n: int) -> list[bytes]:
    """`n` response frames (correlation id first), fewer if the broker closes first."""
    buf = b""
    out = []
    while len(out) < n:
        while len(buf) >= 4 and len(buf) >= 4 + struct.unpack(">i", buf[:4])[0]:
            size = struct.unpack(">i", buf[:4])[0]
            out.append(buf[4:4 + size])
            buf = buf[4 + size:]
        if len(out) >= n:
            break
        data = sock.recv(1 << 16)
        if not data:
            break
        buf += data
    return out


def closed_within(sock: socket.socket, seconds: float) -> float | None:
    """Seconds until the broker closes `sock`, or None if it stays open that long."""
    start = time.monotonic()
    sock.settimeout(seconds)
    try:
        while sock.recv(4096):
            pass
        return time.monotonic() - start
    except socket.timeout:
        return None


def test_pipelined_authentication_then_requests_answered_in_order(broker):
    with socket.create_connection(("127.0.0.1", broker.port), timeout=10) as s:
        s.sendall(api_versions(1) + handshake(2, "PLAIN") + authenticate(3, f"\0alice\0{ALICE_PW}".encode())
                  + metadata(4))
        frames = read_frames(s, 4)
        assert [struct.unpack(">i", f[:4])[0] for f in frames] == [1, 2, 3, 4]
        assert struct.unpack(">h", frames[1][4:6])[0] == 0  # SaslHandshake: NONE
        assert struct.unpack(">h", frames[2][4:6])[0] == 0  # SaslAuthenticate: NONE
        assert len(frames[3]) > 20  # Metadata answered with its brokers
        # A second handshake on an authenticated connection: ILLEGAL_SASL_STATE (34).
        s.sendall(handshake(5, "PLAIN"))
        (f,) = read_frames(s, 1)
        assert struct.unpack(">ih", f[:6]) == (5, 34)


def test_a_version_0_handshake_takes_bare_tokens(broker):
    """Kafka's original exchange: after SaslHandshake v0 the PLAIN token goes as a bare frame
    (no request header) and the answer comes back bare (empty for PLAIN)."""
    with socket.create_connection(("127.0.0.1", broker.port), timeout=10) as s:
        token = f"\0alice\0{ALICE_PW}".encode()
        s.sendall(request(17, 0, 1, struct.pack(">h", 5) + b"PLAIN") + struct.pack(">i", len(token)) + token
                  + metadata(2))
        frames = read_frames(s, 3)
        assert struct.unpack(">ih", frames[0][:6]) == (1, 0)
        assert frames[1] == b""
        assert struct.unpack(">i", frames[2][:4])[0] == 2 and len(frames[2]) > 20
    with socket.create_connection(("127.0.0.1", broker.port), timeout=10) as s:
        token = b"\0alice\0wrong"
        s.sendall(request(17, 0, 1, struct.pack(">h", 5) + b"PLAIN") + struct.pack(">i", len(token)) + token)
        frames = read_frames(s, 2)
        assert len(frames) == 1  # the handshake's answer; the bad token closes the connection


@pytest.mark.parametrize("legacy", [False, True])
def test_kcat_lists_the_cluster_through_sasl(broker, legacy):
    """kcat (its own librdkafka): SaslHandshake v1 and SaslAuthenticate, or with ApiVersions off
    and the 0.10.0 fallback, SaslHandshake v0 and bare tokens."""
    extra = ["-X", "api.version.request=false", "-X", "broker.version.fallback=0.10.0"] if legacy else []
    out = subprocess.run(["kcat", "-b", broker.bootstrap, "-X", "security.protocol=SASL_PLAINTEXT",
                          "-X", "sasl.mechanism=PLAIN", "-X", "sasl.username=alice", "-X", f"sasl.password={ALICE_PW}",
                          *extra, "-m", "10", "-L"], capture_output=True, text=True, timeout=30)
    assert out.returncode == 0, out.stderr
    assert f"broker 1 at {broker.bootstrap}" in out.stdout or " 1 brokers:" in out.stdout, out.stdout


def test_nothing_but_sasl_before_authentication(broker):
    with socket.create_connection(("127.0.0.1", broker.port), timeout=10) as s:
        s.sendall(metadata(1))
        assert read_frames(s, 1) == []
    with socket.create_connection(("127.0.0.1", broker.port), timeout=10) as s:
        s.sendall(handshake(1, "PLAIN") + metadata(2))
        frames = read_frames(s, 2)
        assert len(frames) == 1 and struct.unpack(">ih", frames[0][:6]) == (1, 0)
    assert "Metadata before SASL authentication; closing the connection" in broker.log_path.read_text()


def test_wrong_password_unknown_user_and_mechanism_are_refused_then_closed(broker):
    for token in [f"\0alice\0{ADMIN_PW}".encode(), b"\0mallory\0x", f"admin\0alice\0{ALICE_PW}".encode()]:
        with socket.create_connection(("127.0.0.1", broker.port), timeout=10) as s:
            s.sendall(handshake(1, "PLAIN") + authenticate(2, token))
            frames = read_frames(s, 2)
            corr, code, msg_len = struct.unpack(">ihh", frames[1][:8])
            assert (corr, code) == (2, 58)  # SASL_AUTHENTICATION_FAILED
            assert frames[1][8:8 + msg_len].startswith(b"Authentication failed")
            # Closed after connection.failed.authentication.delay.ms (300 ms here), not before.
            closed = closed_within(s, 5)
            assert closed is not None and closed >= 0.2, closed
    with socket.create_connection(("127.0.0.1", broker.port), timeout=10) as s:
        s.sendall(handshake(1, "SCRAM-SHA-256"))
        (f,) = read_frames(s, 1)
        corr, code, n, m_len = struct.unpack(">ihih", f[:12])
        assert (corr, code, n) == (1, 33, 1) and f[12:12 + m_len] == b"PLAIN"  # UNSUPPORTED_SASL_MECHANISM
    for config, says in [
        (sasl_client(password="wrong"), "Invalid username or password"),
        (sasl_client(user="nobody"), "Invalid username or password"),
        (sasl_client(mechanism="SCRAM-SHA-256"), "PLAIN"),
    ]:
        errors = []
        a = admin(broker.bootstrap, **config, error_cb=lambda e: errors.append(str(e)))
        with pytest.raises(KafkaException):
            a.list_topics(timeout=3)
        a.poll(1)  # serves error_cb
        assert any(says in e for e in errors), errors[:3]
    # A client without SASL gets no metadata: its Metadata request closes the connection.
    with pytest.raises(KafkaException):
        admin(broker.bootstrap).list_topics(timeout=3)
    # Each refusal is counted, as Kafka's socket-server metrics count them.
    metrics = urllib.request.urlopen(f"http://127.0.0.1:{broker.metrics_port}/metrics", timeout=10).read().decode()
    counts = {line.split()[0]: float(line.split()[1]) for line in metrics.splitlines()
              if line.startswith("kafka_server_socket_server_metrics_")}
    assert counts["kafka_server_socket_server_metrics_failed_authentication_total"] >= 7, counts
    assert counts["kafka_server_socket_server_metrics_successful_authentication_total"] >= 1, counts
    log = broker.log_path.read_text()
    assert "kafka_consumergroup_lag is not exported" in log
    assert "failed SASL authentication: invalid username or password for user \"alice\"" in log
    assert "failed SASL authentication: invalid username or password for user \"mallory\"" in log
    assert ALICE_PW not in log and ADMIN_PW not in log


def test_librdkafka_produces_consumes_in_a_group_and_in_a_transaction(broker):
    config = sasl_client()
    a = admin(broker.bootstrap, **config)
    a.create_topics([NewTopic("s", num_partitions=2, replication_factor=1)])["s"].result(10)
    p = Producer({"bootstrap.servers": broker.bootstrap, **config, "acks": "all"})
    for i in range(1_000):
        p.produce("s", key=None if i % 3 == 0 else b"k%d" % i, value=b"v%d" % i, partition=i % 2)
    assert p.flush(30) == 0
    c = Consumer({"bootstrap.servers": broker.bootstrap, **config, "group.id": "sasl-group",
                  "auto.offset.reset": "earliest", "enable.auto.commit": False})
    c.subscribe(["s"])
    got = {}
    deadline = time.monotonic() + 60
    while len(got) < 1_000 and time.monotonic() < deadline:
        m = c.poll(0.5)
        if m is not None and m.error() is None:
            got[(m.partition(), m.offset())] = (m.key(), m.value())
    c.commit(asynchronous=False)
    committed = c.committed([TopicPartition("s", 0), TopicPartition("s", 1)], timeout=10)
    c.close()
    assert len(got) == 1_000
    assert sorted(v for _, v in got.values()) == sorted(b"v%d" % i for i in range(1_000))
    assert [tp.offset for tp in committed] == [500, 500]
    t = Producer({"bootstrap.servers": broker.bootstrap, **config, "transactional.id": "sasl-txn"})
    t.init_transactions(30)
    t.begin_transaction()
    for i in range(50):
        t.produce("s-txn", value=b"t%d" % i, partition=0)
    t.commit_transaction(30)
    r = Consumer({"bootstrap.servers": broker.bootstrap, **config, "group.id": "sasl-reader",
                  "isolation.level": "read_committed"})
    r.assign([TopicPartition("s-txn", 0, 0)])
    values = []
    deadline = time.monotonic() + 30
    while len(values) < 50 and time.monotonic() < deadline:
        m = r.poll(0.5)
        if m is not None and m.error() is None:
            values.append(m.value())
    r.close()
    assert values == [b"t%d" % i for i in range(50)]


def test_kafka_python_and_the_java_tools_over_sasl_ssl():
    from kafka import KafkaConsumer, KafkaProducer
    from kafka import TopicPartition as KTP

    TEST_DIR.mkdir(parents=True, exist_ok=True)
    c = certs_mod.make(Path(tempfile.mkdtemp(prefix="pytest-certs-", dir=TEST_DIR)))
    b = sasl_broker("sasl-ssl", protocol="SASL_SSL",
                    client=sasl_client(protocol="SASL_SSL", **{"ssl.ca.location": str(c.ca)}),
                    args=["--ssl-keystore-location", str(c.broker_keystore)])
    b.start()
    try:
        common = dict(bootstrap_servers=b.bootstrap, security_protocol="SASL_SSL", ssl_cafile=str(c.ca),
                      sasl_mechanism="PLAIN", sasl_plain_username="alice", sasl_plain_password=ALICE_PW)
        p = KafkaProducer(acks="all", **common)
        futures = [p.send("kp", value=b"v%d" % i, partition=0) for i in range(300)]
        p.flush(30)
        assert [f.get(30).offset for f in futures] == list(range(300))
        p.close()
        k = KafkaConsumer(auto_offset_reset="earliest", enable_auto_commit=False, consumer_timeout_ms=10_000, **common)
        k.assign([KTP("kp", 0)])
        got = []
        for m in k:
            got.append(m.value)
            if len(got) == 300:
                break
        k.close()
        assert got == [b"v%d" % i for i in range(300)]
        bad = dict(common, sasl_plain_password="wrong")
        before = b.log_path.read_text().count("failed SASL authentication")
        with pytest.raises(Exception):
            KafkaProducer(bootstrap_timeout_ms=3000, **bad)
        assert b.log_path.read_text().count("failed SASL authentication") > before

        # Apache Kafka's Java client, through its console tools: the client configuration as a
        # Kafka user writes it (PEM truststore, PlainLoginModule).
        def client_properties(password: str) -> Path:
            path = Path(tempfile.mkstemp(prefix="client-", suffix=".properties", dir=c.dir)[1])
            path.write_text(
                "security.protocol=SASL_SSL\nsasl.mechanism=PLAIN\n"
                "sasl.jaas.config=org.apache.kafka.common.security.plain.PlainLoginModule required "
                f'username="alice" password="{password}";\n'
                f"ssl.truststore.type=PEM\nssl.truststore.location={c.ca}\n")
            return path

        good = client_properties(ALICE_PW)
        lines = "".join(f"java-{i}\n" for i in range(100))
        done = java("org.apache.kafka.tools.ConsoleProducer", "--bootstrap-server", b.bootstrap, "--topic", "java",
                    "--command-config", str(good), stdin=lines)
        assert done.returncode == 0, done.stderr[-2000:]
        read = java("org.apache.kafka.tools.consumer.ConsoleConsumer", "--bootstrap-server", b.bootstrap,
                    "--topic", "java", "--from-beginning", "--max-messages", "100", "--timeout-ms", "20000",
                    "--command-config", str(good))
        assert read.stdout.split() == [f"java-{i}" for i in range(100)], read.stderr[-2000:]
        refused = java("org.apache.kafka.tools.TopicCommand", "--bootstrap-server", b.bootstrap, "--list",
                       "--command-config", str(client_properties("wrong")), timeout=120)
        assert refused.returncode != 0
        assert "Authentication failed: Invalid username or password" in refused.stdout + refused.stderr
    finally:
        b.stop()
        b.remove()


def test_connections_that_never_authenticate_are_closed_when_idle():
    """A client that stops in the middle of the TLS handshake, or after ApiVersions without
    authenticating, holds its connection slot no longer than `connections.max.idle.ms`."""
    TEST_DIR.mkdir(parents=True, exist_ok=True)
    c = certs_mod.make(Path(tempfile.mkdtemp(prefix="pytest-certs-", dir=TEST_DIR)))
    b = sasl_broker("sasl-idle", protocol="SASL_SSL",
                    client=sasl_client(protocol="SASL_SSL", **{"ssl.ca.location": str(c.ca)}),
                    args=["--ssl-keystore-location", str(c.broker_keystore), "--connections-max-idle-ms", "1500"])
    b.start()
    try:
        # The TLS handshake never starts: a bare TCP connection that sends nothing.
        with socket.create_connection(("127.0.0.1", b.port), timeout=10) as s:
            closed = closed_within(s, 8)
            assert closed is not None and 1.0 <= closed < 6, closed
        # TLS done, then one ApiVersions and nothing more: no authentication.
        import ssl
        ctx = ssl.create_default_context(cafile=str(c.ca))
        with socket.create_connection(("127.0.0.1", b.port), timeout=10) as raw:
            with ctx.wrap_socket(raw, server_hostname="localhost") as s:
                s.sendall(api_versions(1))
                (f,) = read_frames(s, 1)
                assert struct.unpack(">ih", f[:6]) == (1, 0)
                closed = closed_within(s, 8)
                assert closed is not None and 1.0 <= closed < 6, closed
        log = b.log_path.read_text()
        assert "SSL handshake not done within connections.max.idle.ms" in log
        assert "idle waiting for a request for connections.max.idle.ms" in log
    finally:
        b.stop()
        b.remove()


def run_sluice(*args: str) -> str:
    d = tempfile.mkdtemp(prefix="pytest-sasl-bad-", dir=TEST_DIR)
    r = subprocess.run([str(SLUICE_BIN), "--data-dir", d, "--cores", "1", "--listeners", "CLIENT://127.0.0.1:0",
                        "--listener-security-protocol-map", "CLIENT:SASL_PLAINTEXT", *args],
                       capture_output=True, text=True, timeout=30)
    assert r.returncode != 0
    return r.stdout + r.stderr


def test_bad_sasl_settings_stop_the_start():
    assert "GSSAPI is not a mechanism Sluice runs (PLAIN, SCRAM-SHA-256, SCRAM-SHA-512, OAUTHBEARER)" in run_sluice()
    assert "SCRAM-SHA-256 takes org.apache.kafka.common.security.scram.ScramLoginModule" in run_sluice(
        "--sasl-enabled-mechanisms", "SCRAM-SHA-256", "--override", f"listener.name.client.scram-sha-256.sasl.jaas.config={JAAS}")
    assert "set listener.name.client.plain.sasl.jaas.config" in run_sluice("--sasl-enabled-mechanisms", "PLAIN")
    out = run_sluice("--sasl-enabled-mechanisms", "PLAIN", "--override",
                     f'listener.name.client.plain.sasl.jaas.config=PlainLoginModule required password="{ALICE_PW}";')
    assert "PLAIN takes org.apache.kafka.common.security.plain.PlainLoginModule" in out and ALICE_PW not in out
    out = run_sluice("--sasl-enabled-mechanisms", "PLAIN", "--override",
                     f'listener.name.client.plain.sasl.jaas.config={JAAS[:-1]}')
    assert "does not end with ';'" in out and ALICE_PW not in out
    assert "no user_<name>" in run_sluice(
        "--sasl-enabled-mechanisms", "PLAIN", "--override",
        "listener.name.client.plain.sasl.jaas.config="
        "org.apache.kafka.common.security.plain.PlainLoginModule required username=\"a\";")


def test_sasl_frames_that_lie_about_their_sizes_close_only_their_connection(broker):
    """A SaslAuthenticate whose token claims more bytes than its frame holds, a SaslHandshake
    whose mechanism does, and a frame whose size prefix claims a gigabyte: each connection is
    closed unanswered (or answered no further), and a client logging in beside them is served."""
    lying = [
        request(17, 1, 1, struct.pack(">h", 200) + b"PLAIN"),
        handshake(1, "PLAIN") + request(36, 1, 2, struct.pack(">i", 1 << 30) + b"\0alice\0"),
        struct.pack(">i", 1 << 30) + b"\0\x11\0\x01",
    ]
    for frames in lying:
        with socket.create_connection(("127.0.0.1", broker.port), timeout=10) as s:
            s.sendall(frames)
            answered = read_frames(s, 3)
            assert len(answered) <= 1, answered
            assert closed_within(s, 5) is not None
    # A frame of 600 KiB, under socket.request.max.bytes but over sasl.server.max.receive.size
    # (512 KiB): closed at once before authentication, its body not awaited; after it, awaited.
    big = struct.pack(">i", 600 << 10) + struct.pack(">hhi", 3, 1, 9)
    with socket.create_connection(("127.0.0.1", broker.port), timeout=10) as s:
        s.sendall(big)
        assert closed_within(s, 5) is not None
    with socket.create_connection(("127.0.0.1", broker.port), timeout=10) as s:
        s.sendall(handshake(1, "PLAIN") + authenticate(2, f"\0alice\0{ALICE_PW}".encode()))
        assert len(read_frames(s, 2)) == 2
        s.sendall(big)
        assert closed_within(s, 1.5) is None
    with socket.create_connection(("127.0.0.1", broker.port), timeout=10) as s:
        s.sendall(handshake(1, "PLAIN") + authenticate(2, f"\0alice\0{ALICE_PW}".encode()) + metadata(3))
        frames = read_frames(s, 3)
        assert [struct.unpack(">i", f[:4])[0] for f in frames] == [1, 2, 3]


def sasl_authenticate_answer(frame: bytes) -> tuple[int, int]:
    """A SaslAuthenticate v1 response frame: its error code and session lifetime."""
    (error,) = struct.unpack(">h", frame[4:6])
    at = 6
    (n,) = struct.unpack(">h", frame[at:at + 2])
    at += 2 + max(n, 0)
    (n,) = struct.unpack(">i", frame[at:at + 4])
    at += 4 + max(n, 0)
    (lifetime,) = struct.unpack(">q", frame[at:at + 8])
    return error, lifetime


def login(s: socket.socket, corr: int, user: str, password: str) -> tuple[int, int]:
    s.sendall(handshake(corr, "PLAIN") + authenticate(corr + 1, f"\0{user}\0{password}".encode()))
    frames = read_frames(s, 2)
    assert len(frames) == 2, frames
    assert struct.unpack(">ih", frames[0][:6]) == (corr, 0)
    return sasl_authenticate_answer(frames[1])


def test_sessions_end_unless_the_client_logs_in_again():
    """KIP-368 with connections.max.reauth.ms: the session's lifetime comes in the
    SaslAuthenticate response; the client logs in again on its connection (same principal only)
    and goes on; a request after the session ended closes the connection. librdkafka renews its
    sessions by itself, and a producer and a consumer run through several of them."""
    metrics_port = free_port()
    b = sasl_broker("sasl-reauth", args=["--override", "connections.max.reauth.ms=2000",
                                         "--metrics-listener", f"127.0.0.1:{metrics_port}"])
    b.start()
    try:
        with socket.create_connection(("127.0.0.1", b.port), timeout=10) as s:
            assert login(s, 1, "alice", ALICE_PW) == (0, 2000)
            time.sleep(1.2)
            s.sendall(metadata(3))
            assert struct.unpack(">i", read_frames(s, 1)[0][:4])[0] == 3
            assert login(s, 4, "alice", ALICE_PW) == (0, 2000)
            time.sleep(1.2)  # past the first session's end, within the second's
            s.sendall(metadata(6))
            assert struct.unpack(">i", read_frames(s, 1)[0][:4])[0] == 6
            time.sleep(1.2)  # past the second's
            s.sendall(metadata(7))
            assert read_frames(s, 1) == []
        with socket.create_connection(("127.0.0.1", b.port), timeout=10) as s:
            assert login(s, 1, "alice", ALICE_PW) == (0, 2000)
            time.sleep(1.1)
            s.sendall(handshake(3, "PLAIN") + authenticate(4, f"\0admin\0{ADMIN_PW}".encode()))
            frames = read_frames(s, 2)
            assert sasl_authenticate_answer(frames[1])[0] == 58  # SASL_AUTHENTICATION_FAILED
            assert closed_within(s, 5) is not None
        config = sasl_client()
        a = admin(b.bootstrap, **config)
        a.create_topics([NewTopic("renewed", num_partitions=2, replication_factor=1)])["renewed"].result(10)
        p = Producer({"bootstrap.servers": b.bootstrap, **config, "acks": "all", "linger.ms": 5})
        c = Consumer({"bootstrap.servers": b.bootstrap, **config, "group.id": "renewing",
                      "auto.offset.reset": "earliest"})
        c.subscribe(["renewed"])
        errors = []
        got = []
        sent = 0
        deadline = time.monotonic() + 7
        while time.monotonic() < deadline:
            p.produce("renewed", value=b"r%d" % sent, partition=sent % 2,
                      on_delivery=lambda e, m: e is None or errors.append(e))
            sent += 1
            p.poll(0)
            m = c.poll(0.05)
            if m is not None and m.error() is None:
                got.append(m.value())
        assert p.flush(30) == 0
        deadline = time.monotonic() + 30
        while len(got) < sent and time.monotonic() < deadline:
            m = c.poll(0.2)
            if m is not None and m.error() is None:
                got.append(m.value())
        c.close()
        assert errors == []
        assert sent > 50
        assert sorted(got) == sorted(b"r%d" % i for i in range(sent))
        metrics = urllib.request.urlopen(f"http://127.0.0.1:{metrics_port}/metrics", timeout=10).read().decode()
        values = {line.split()[0]: float(line.split()[1]) for line in metrics.splitlines()
                  if line.startswith("kafka_server_socket_server_metrics_")}
        assert values["kafka_server_socket_server_metrics_successful_reauthentication_total"] >= 3, values
        assert values["kafka_server_socket_server_metrics_failed_reauthentication_total"] == 1, values
        assert values["kafka_server_socket_server_metrics_expired_connections_killed_count_total"] == 1, values
    finally:
        b.stop()
        b.remove()
