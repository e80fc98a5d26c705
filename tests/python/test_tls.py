"""SSL listeners: Kafka's `listener.security.protocol.map` and `ssl.*` settings, with real
clients (librdkafka through confluent-kafka, kafka-python, Python's own TLS) against a broker
whose client listener speaks TLS.

Certificates come from `certs.py` (the `openssl` command). Every record read back is compared
byte for byte with what was sent, also after a restart, when the records come from disk: over
TLS a fetch copies them rather than splicing them into the socket."""

from __future__ import annotations

import socket
import ssl
import subprocess
import tempfile
import time
from pathlib import Path

import pytest
from confluent_kafka import KafkaException, TopicPartition
from confluent_kafka.admin import ConfigResource, NewTopic

import certs as certs_mod
from harness import SLUICE_BIN, TEST_DIR, Broker, admin, consumer, producer, read_to_end

SECRET = "keystore-pw-never-logged-7f3a"


@pytest.fixture(scope="module")
def certs():
    TEST_DIR.mkdir(parents=True, exist_ok=True)
    return certs_mod.make(Path(tempfile.mkdtemp(prefix="pytest-certs-", dir=TEST_DIR)))


def ssl_client(certs, **extra) -> dict:
    return {"security.protocol": "SSL", "ssl.ca.location": str(certs.ca), **extra}


def tls_broker(certs, name: str, *args: str, client: dict | None = None) -> Broker:
    return Broker(
        cores=2,
        num_partitions=2,
        name=name,
        listener_name="CLIENT",
        client_config=client if client is not None else ssl_client(certs),
        extra_args=[
            "--listener-security-protocol-map", "CLIENT:SSL,CONTROLLER:PLAINTEXT",
            "--ssl-keystore-location", str(certs.broker_keystore),
            "--ssl-keystore-password", SECRET,
            *args,
        ],
    )


def messages(n: int) -> list[dict]:
    """Record shapes real clients send: null keys and values, headers, empty values."""
    out = []
    for i in range(n):
        m = {"value": f"value-{i}-".encode() * (1 + i % 7), "key": f"key-{i % 13}".encode()}
        if i % 5 == 0:
            m["key"] = None
        if i % 11 == 0:
            m["value"] = None
        if i % 3 == 0:
            m["headers"] = [("h", f"{i}".encode()), ("empty", b"")]
        out.append(m)
    return out


def produce(bootstrap: str, config: dict, topic: str, msgs: list[dict], **extra) -> dict[int, list]:
    p = producer(bootstrap, **config, **extra)
    sent: dict[int, list] = {0: [], 1: []}
    errors = []

    def report(m):
        def done(err, msg):
            if err is not None:
                errors.append(err)
            else:
                sent[msg.partition()].append((msg.offset(), m.get("key"), m.get("value"), m.get("headers", [])))
        return done

    for i, m in enumerate(msgs):
        p.produce(topic, partition=i % 2, on_delivery=report(m), **m)
        p.poll(0)
    assert p.flush(60) == 0
    assert not errors, errors[:3]
    return sent


def read_back(bootstrap: str, config: dict, topic: str, sent: dict[int, list]) -> None:
    c = consumer(bootstrap, **config)
    try:
        c.assign([TopicPartition(topic, p, 0) for p in sent])
        ends = {(topic, p): len(v) for p, v in sent.items()}
        got = read_to_end(c, ends)
    finally:
        c.close()
    for p, want in sent.items():
        mine = [(m.offset(), m.key(), m.value(), m.headers() or []) for m in got if m.partition() == p]
        assert [o for o, *_ in mine] == list(range(len(want))), f"partition {p}: offsets"
        assert mine == want, f"partition {p}: records differ"


def test_librdkafka_produces_and_consumes_over_ssl_from_memory_and_from_disk(certs):
    b = tls_broker(certs, "tls-rdkafka")
    b.start()
    try:
        config = ssl_client(certs)
        a = admin(b.bootstrap, **config)
        a.create_topics([NewTopic("tls", num_partitions=2, replication_factor=1)])["tls"].result(10)
        msgs = messages(3_000)
        sent = {0: [], 1: []}
        for codec in ["none", "gzip", "snappy", "lz4", "zstd"]:
            part = produce(b.bootstrap, config, "tls", msgs[:600], **{"compression.type": codec})
            msgs = msgs[600:]
            for p in sent:
                sent[p] += part[p]
        assert sum(len(v) for v in sent.values()) == 3_000
        read_back(b.bootstrap, config, "tls", sent)
        # After a restart no record is in the batch cache: the fetch reads the segment files,
        # and over TLS copies what it would otherwise splice.
        b.stop_cleanly()
        b.start()
        read_back(b.bootstrap, config, "tls", sent)
        log = b.log_path.read_text()
        assert "security_protocol=SSL" in log
        assert "fetches over SSL copy records through the broker" in log
        assert SECRET not in log
    finally:
        b.stop()
        b.remove()


def test_groups_and_transactions_over_ssl(certs):
    """A subscribed group member commits and a second member resumes from the commit; a
    transaction commits and a read_committed consumer sees exactly it. The broker's calls to
    itself (the coordinators' loads, transaction markers) go in-process, not in plaintext to its
    own SSL listener: the log shows no failed handshake."""
    from confluent_kafka import Consumer, Producer

    b = tls_broker(certs, "tls-groups")
    b.start()
    try:
        config = ssl_client(certs)
        a = admin(b.bootstrap, **config)
        a.create_topics([NewTopic("g", num_partitions=2, replication_factor=1)])["g"].result(10)
        sent = produce(b.bootstrap, config, "g", messages(400))

        def member():
            return Consumer({"bootstrap.servers": b.bootstrap, **config, "group.id": "tls-group",
                             "auto.offset.reset": "earliest", "enable.auto.commit": False,
                             "session.timeout.ms": 6000})

        c = member()
        c.subscribe(["g"])
        got = []
        deadline = time.monotonic() + 60
        while len(got) < 300 and time.monotonic() < deadline:
            m = c.poll(0.5)
            if m is not None and m.error() is None:
                got.append((m.partition(), m.offset()))
        assert len(got) >= 300, f"read {len(got)} of 300 in the group"
        c.commit(asynchronous=False)
        committed = {tp.partition: tp.offset for tp in c.committed([TopicPartition("g", 0), TopicPartition("g", 1)], timeout=10)}
        c.close()
        expected = {p: max(o for q, o in got if q == p) + 1 for p in (0, 1) if any(q == p for q, _ in got)}
        assert {p: committed[p] for p in expected} == expected
        c = member()
        c.subscribe(["g"])
        rest = []
        deadline = time.monotonic() + 60
        want = sum(len(v) for v in sent.values()) - sum(expected.values())
        while len(rest) < want and time.monotonic() < deadline:
            m = c.poll(0.5)
            if m is not None and m.error() is None:
                rest.append((m.partition(), m.offset()))
        c.close()
        assert sorted(rest) == sorted((p, o) for p in (0, 1) for o in range(expected.get(p, 0), len(sent[p])))

        p = Producer({"bootstrap.servers": b.bootstrap, **config, "transactional.id": "tls-txn"})
        p.init_transactions(30)
        p.begin_transaction()
        for i in range(100):
            p.produce("txn", key=b"k", value=b"t%d" % i, partition=0)
        p.commit_transaction(30)
        c = Consumer({"bootstrap.servers": b.bootstrap, **config, "group.id": "tls-reader",
                      "isolation.level": "read_committed", "auto.offset.reset": "earliest"})
        c.assign([TopicPartition("txn", 0, 0)])
        values = []
        deadline = time.monotonic() + 30
        while len(values) < 100 and time.monotonic() < deadline:
            m = c.poll(0.5)
            if m is not None and m.error() is None:
                values.append(m.value())
        c.close()
        assert values == [b"t%d" % i for i in range(100)]
        log = b.log_path.read_text()
        assert "SSL handshake failed" not in log
        assert "still waiting to read the other offsets partitions" not in log
    finally:
        b.stop()
        b.remove()


def test_kafka_python_over_ssl(certs):
    from kafka import KafkaConsumer, KafkaProducer

    b = tls_broker(certs, "tls-kafka-python")
    b.start()
    try:
        p = KafkaProducer(bootstrap_servers=b.bootstrap, security_protocol="SSL", ssl_cafile=str(certs.ca),
                          acks="all", linger_ms=5)
        futures = [p.send("kp", key=None if i % 4 == 0 else b"k%d" % i, value=b"v%d" % i, partition=0)
                   for i in range(500)]
        p.flush(30)
        offsets = [f.get(30).offset for f in futures]
        p.close()
        assert offsets == list(range(500))
        c = KafkaConsumer(bootstrap_servers=b.bootstrap, security_protocol="SSL", ssl_cafile=str(certs.ca),
                          auto_offset_reset="earliest", enable_auto_commit=False, consumer_timeout_ms=10_000)
        c.assign([__import__("kafka").TopicPartition("kp", 0)])
        got = []
        for m in c:
            got.append((m.offset, m.key, m.value))
            if len(got) == 500:
                break
        c.close()
        assert got == [(i, None if i % 4 == 0 else b"k%d" % i, b"v%d" % i) for i in range(500)]
    finally:
        b.stop()
        b.remove()


def handshake(port: int, cafile: Path, **kw):
    """A TLS handshake from Python's ssl module: the negotiated version, suite and certificate."""
    ctx = ssl.create_default_context(cafile=str(cafile))
    if "version" in kw:
        ctx.minimum_version = ctx.maximum_version = kw["version"]
    if "certfile" in kw:
        ctx.load_cert_chain(kw["certfile"], kw["keyfile"])
    with socket.create_connection(("127.0.0.1", port), timeout=5) as raw:
        with ctx.wrap_socket(raw, server_hostname="localhost") as s:
            return s.version(), s.cipher()[0], s.getpeercert()


def refused(bootstrap: str, config: dict) -> str:
    """Metadata through a client that must not get in: the error it ends with."""
    a = admin(bootstrap, **config)
    with pytest.raises(KafkaException) as e:
        a.list_topics(timeout=3)
    return str(e.value)


def test_refusals_versions_suites_reload_and_secrets(certs):
    b = tls_broker(certs, "tls-policy", "--ssl-enabled-protocols", "TLSv1.2",
                   "--ssl-cipher-suites", "TLS_ECDHE_ECDSA_WITH_AES_256_GCM_SHA384")
    b.start()
    try:
        version, suite, cert = handshake(b.port, certs.ca)
        assert version == "TLSv1.2"
        assert suite == "ECDHE-ECDSA-AES256-GCM-SHA384"
        assert dict(x[0] for x in cert["subject"])["commonName"] == "broker-1"
        with pytest.raises(ssl.SSLError):
            handshake(b.port, certs.ca, version=ssl.TLSVersion.TLSv1_3)
        # A plaintext client, and one that trusts another authority, get nothing.
        refused(b.bootstrap, {})
        refused(b.bootstrap, ssl_client(certs, **{"ssl.ca.location": str(certs.rogue_ca)}))
        assert "SSL handshake failed" in b.log_path.read_text()
        # DescribeConfigs: the password is sensitive and has no value.
        a = admin(b.bootstrap, **ssl_client(certs))
        node = next(iter(a.list_topics(timeout=10).brokers))
        res = ConfigResource("broker", str(node))
        described = a.describe_configs([res])[res].result(10)
        pw = described["ssl.keystore.password"]
        assert pw.is_sensitive and pw.value is None
        assert described["listener.security.protocol.map"].value == "CLIENT:SSL,CONTROLLER:PLAINTEXT"
        assert described["ssl.enabled.protocols"].value == "TLSv1.2"
        # The keystore file replaced: new handshakes show the new certificate, without a restart.
        new = certs.keystore("broker-renewed", "/CN=broker-1-renewed")
        certs.broker_keystore.write_bytes(new.read_bytes())
        deadline = time.monotonic() + 10
        while True:
            _, _, cert = handshake(b.port, certs.ca)
            cn = dict(x[0] for x in cert["subject"])["commonName"]
            if cn == "broker-1-renewed" or time.monotonic() > deadline:
                break
            time.sleep(0.2)
        assert cn == "broker-1-renewed"
        assert "reloaded" in b.log_path.read_text()
        assert SECRET not in b.log_path.read_text()
    finally:
        b.stop()
        b.remove()


def test_mutual_tls(certs):
    b = tls_broker(
        certs, "tls-mutual", "--ssl-client-auth", "required", "--ssl-truststore-location", str(certs.ca),
        client=ssl_client(certs, **{"ssl.certificate.location": str(certs.client_cert),
                                    "ssl.key.location": str(certs.client_key)}),
    )
    b.start()
    try:
        good = b.client_config
        sent = produce(b.bootstrap, good, "mtls", messages(200))
        read_back(b.bootstrap, good, "mtls", sent)
        # No certificate, or one from an authority the broker does not trust: refused.
        refused(b.bootstrap, ssl_client(certs))
        refused(b.bootstrap, ssl_client(certs, **{"ssl.certificate.location": str(certs.rogue_client_cert),
                                                  "ssl.key.location": str(certs.rogue_client_key)}))
        # One from the trusted authority that has expired: refused, and the log says why.
        certs_mod.expired("old-client", "ca", certs.dir, "/CN=alice/OU=tests", certs_mod.CLIENT_EXTENSIONS)
        refused(b.bootstrap, ssl_client(certs, **{"ssl.certificate.location": str(certs.dir / "old-client.crt"),
                                                  "ssl.key.location": str(certs.dir / "old-client.key")}))
        deadline = time.monotonic() + 10
        while "expired" not in b.log_path.read_text().lower():
            assert time.monotonic() < deadline, "no log line names the expired certificate"
            time.sleep(0.2)
        with pytest.raises((ssl.SSLError, ConnectionError)):
            # In TLS 1.3 the client's side of the handshake completes before the broker refuses
            # it: the refusal comes with the first read.
            with socket.create_connection(("127.0.0.1", b.port), timeout=5) as raw:
                ctx = ssl.create_default_context(cafile=str(certs.ca))
                with ctx.wrap_socket(raw, server_hostname="localhost") as s:
                    s.sendall(b"\x00\x00\x00\x00")
                    if not s.recv(1):
                        raise ConnectionError("closed")
        version, _, _ = handshake(b.port, certs.ca, certfile=str(certs.client_cert), keyfile=str(certs.client_key))
        assert version == "TLSv1.3"
    finally:
        b.stop()
        b.remove()


# Java's own name for a certificate's subject (X500Principal.getName(), RFC 2253), which Kafka
# makes a client certificate's principal from.
JAVA_SUBJECT = """
import java.io.FileInputStream;
import java.security.cert.CertificateFactory;
import java.security.cert.X509Certificate;

public class Subject {
    public static void main(String[] args) throws Exception {
        for (String path : args) {
            try (FileInputStream in = new FileInputStream(path)) {
                X509Certificate c = (X509Certificate) CertificateFactory.getInstance("X.509").generateCertificate(in);
                System.out.println(c.getSubjectX500Principal().getName());
            }
        }
    }
}
"""


def test_a_client_certificate_names_the_principal_acls_see(certs):
    """On an SSL listener without SASL the principal is the certificate's subject as Java names
    it, through ssl.principal.mapping.rules: alice's certificate maps to User:alice, the
    operator's keeps its whole distinguished name (written as Java writes it, compared with
    Java's own), and the ACLs follow."""
    from reference import java

    certs_mod.signed("operator", "ca", certs.dir, "/C=US/O=Example, Inc./OU=ops/CN=operator",
                     certs_mod.CLIENT_EXTENSIONS)
    source = certs.dir / "Subject.java"
    source.write_text(JAVA_SUBJECT)
    names = java(str(source), str(certs.dir / "operator.crt"), str(certs.client_cert))
    assert names.returncode == 0, names.stderr[-2000:]
    operator_dn, alice_dn = names.stdout.splitlines()
    assert operator_dn == r"CN=operator,OU=ops,O=Example\, Inc.,C=US" and alice_dn == "OU=tests,CN=alice", names.stdout
    operator = ssl_client(certs, **{"ssl.certificate.location": str(certs.dir / "operator.crt"),
                                    "ssl.key.location": str(certs.dir / "operator.key")})
    alice = ssl_client(certs, **{"ssl.certificate.location": str(certs.client_cert),
                                 "ssl.key.location": str(certs.client_key)})
    b = tls_broker(
        certs, "tls-principal", "--ssl-client-auth", "required", "--ssl-truststore-location", str(certs.ca),
        "--override", "ssl.principal.mapping.rules=RULE:^OU=tests,CN=(.*)$/$1/L,DEFAULT",
        "--override", "authorizer.class.name=org.apache.kafka.metadata.authorizer.StandardAuthorizer",
        "--override", f"super.users=User:{operator_dn}",
        client=operator,
    )
    b.start()
    try:
        from confluent_kafka.admin import AclBinding, AclOperation, AclPermissionType, ResourcePatternType, ResourceType
        a = admin(b.bootstrap, **operator)
        for f in a.create_topics([NewTopic("alices", 2, 1), NewTopic("others", 2, 1)]).values():
            f.result(20)
        grants = [AclBinding(ResourceType.TOPIC, "alices", ResourcePatternType.LITERAL, "User:alice", "*", op,
                             AclPermissionType.ALLOW)
                  for op in (AclOperation.WRITE, AclOperation.READ, AclOperation.DESCRIBE)]
        grants.append(AclBinding(ResourceType.GROUP, "sluice-tests-unused", ResourcePatternType.LITERAL,
                                 "User:alice", "*", AclOperation.READ, AclPermissionType.ALLOW))
        for f in a.create_acls(grants).values():
            f.result(20)
        sent = produce(b.bootstrap, alice, "alices", messages(50))
        read_back(b.bootstrap, alice, "alices", sent)
        assert set(admin(b.bootstrap, **alice).list_topics(timeout=10).topics) == {"alices"}
        with pytest.raises(AssertionError) as e:
            produce(b.bootstrap, alice, "others", messages(1), **{"message.timeout.ms": 5000})
        assert "TOPIC_AUTHORIZATION_FAILED" in str(e.value), e.value
        log = b.log_path.read_text()
        assert "principal=User:alice" in log and "denied" in log
    finally:
        b.stop()
        b.remove()
    r = run_sluice("--listeners", "CLIENT://127.0.0.1:0", "--listener-security-protocol-map", "CLIENT:SSL",
                   "--ssl-keystore-location", str(certs.broker_keystore),
                   "--override", "ssl.principal.mapping.rules=RULE:^(/x/")
    assert r.returncode != 0 and "ssl.principal.mapping.rules" in r.stderr + r.stdout


def run_sluice(*args: str) -> subprocess.CompletedProcess:
    d = tempfile.mkdtemp(prefix="pytest-tls-bad-", dir=TEST_DIR)
    return subprocess.run([str(SLUICE_BIN), "--data-dir", d, "--cores", "1", *args],
                          capture_output=True, text=True, timeout=30)


def test_bad_settings_stop_the_start_with_a_clear_error(certs):
    listeners = ["--listeners", "CLIENT://127.0.0.1:0", "--listener-security-protocol-map", "CLIENT:SSL"]
    r = run_sluice(*listeners)
    assert r.returncode != 0 and "set ssl.keystore.location" in r.stderr + r.stdout
    r = run_sluice(*listeners, "--ssl-keystore-location", str(certs.dir / "missing.pem"))
    assert r.returncode != 0 and "missing.pem" in r.stderr + r.stdout
    r = run_sluice(*listeners, "--ssl-keystore-location", str(certs.ca), "--ssl-key-password", SECRET)
    out = r.stderr + r.stdout
    assert r.returncode != 0 and "no private key" in out and SECRET not in out
    r = run_sluice("--listeners", "CLIENT://127.0.0.1:0")
    assert r.returncode != 0 and "listener.security.protocol.map" in r.stderr + r.stdout
    r = run_sluice(*listeners, "--ssl-keystore-location", str(certs.broker_keystore), "--ssl-client-auth", "required")
    assert r.returncode != 0 and "needs a truststore" in r.stderr + r.stdout
    r = run_sluice(*listeners, "--ssl-keystore-location", str(certs.broker_keystore), "--ssl-cipher-suites", "TLS_RSA_WITH_RC4")
    assert r.returncode != 0 and "TLS_RSA_WITH_RC4 is not a suite" in r.stderr + r.stdout


def keytool(*args: str, cwd: Path) -> None:
    r = subprocess.run(["keytool", *args], cwd=cwd, capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stdout + r.stderr


def test_pkcs12_stores_and_an_encrypted_pem_key(certs):
    """Key material as Kafka's operators keep it: a PKCS#12 keystore and truststore written by
    Java's keytool (ssl.keystore.type=PKCS12, ssl.truststore.type=PKCS12, with their
    passwords), and a PEM keystore whose key is encrypted PKCS#8 (ssl.key.password). Wrong
    passwords stop the start with an error that does not quote them."""
    d = certs.dir
    certs_mod._openssl("pkcs12", "-export", "-inkey", "broker.key", "-in", "broker.crt", "-certfile", "ca.pem",
                       "-name", "broker", "-out", "broker-openssl.p12", "-passout", f"pass:{SECRET}", cwd=d)
    keytool("-importkeystore", "-noprompt", "-srckeystore", "broker-openssl.p12", "-srcstoretype", "PKCS12",
            "-srcstorepass", SECRET, "-destkeystore", "broker.p12", "-deststoretype", "PKCS12",
            "-deststorepass", SECRET, cwd=d)
    keytool("-importcert", "-noprompt", "-alias", "ca", "-file", "ca.pem", "-keystore", "trust.p12",
            "-storetype", "PKCS12", "-storepass", SECRET, cwd=d)
    mutual = ssl_client(certs, **{"ssl.certificate.location": str(certs.client_cert),
                                  "ssl.key.location": str(certs.client_key)})
    b = Broker(cores=1, num_partitions=2, name="tls-pkcs12", listener_name="CLIENT", client_config=mutual,
               extra_args=["--listener-security-protocol-map", "CLIENT:SSL,CONTROLLER:PLAINTEXT",
                           "--override", "ssl.keystore.type=PKCS12",
                           "--ssl-keystore-location", str(d / "broker.p12"),
                           "--ssl-keystore-password", SECRET,
                           "--override", "ssl.truststore.type=PKCS12",
                           "--ssl-truststore-location", str(d / "trust.p12"),
                           "--override", f"ssl.truststore.password={SECRET}",
                           "--ssl-client-auth", "required"])
    b.start()
    try:
        sent = produce(b.bootstrap, mutual, "p12", messages(100))
        read_back(b.bootstrap, mutual, "p12", sent)
        # The truststore is what decides: a certificate of another authority is refused.
        refused(b.bootstrap, ssl_client(certs, **{"ssl.certificate.location": str(certs.rogue_client_cert),
                                                  "ssl.key.location": str(certs.rogue_client_key)}))
        # The whole chain is served: a client checks it against the authority.
        version, _, _ = handshake(b.port, certs.ca, certfile=str(certs.client_cert), keyfile=str(certs.client_key))
        assert version == "TLSv1.3"
    finally:
        b.stop()
        b.remove()
    certs_mod._openssl("pkcs8", "-topk8", "-in", "broker.key", "-v2", "aes-256-cbc", "-passout", f"pass:{SECRET}",
                       "-out", "broker-encrypted.key", cwd=d)
    encrypted = d / "broker-encrypted-keystore.pem"
    encrypted.write_bytes((d / "broker-encrypted.key").read_bytes() + (d / "broker.crt").read_bytes())
    b = Broker(cores=1, num_partitions=2, name="tls-encrypted-pem", listener_name="CLIENT",
               client_config=ssl_client(certs),
               extra_args=["--listener-security-protocol-map", "CLIENT:SSL,CONTROLLER:PLAINTEXT",
                           "--ssl-keystore-location", str(encrypted), "--ssl-key-password", SECRET])
    b.start()
    try:
        sent = produce(b.bootstrap, ssl_client(certs), "enc", messages(50))
        read_back(b.bootstrap, ssl_client(certs), "enc", sent)
    finally:
        b.stop()
        b.remove()
    listeners = ["--listeners", "CLIENT://127.0.0.1:0", "--listener-security-protocol-map", "CLIENT:SSL"]
    wrong = "not-the-" + SECRET
    for args, says in [
        (["--ssl-keystore-location", str(encrypted), "--ssl-key-password", wrong], "does not decrypt"),
        (["--ssl-keystore-location", str(encrypted)], "set ssl.key.password"),
        (["--override", "ssl.keystore.type=PKCS12", "--ssl-keystore-location", str(d / "broker.p12"),
          "--ssl-keystore-password", wrong], "does not open with ssl.keystore.password"),
        (["--override", "ssl.keystore.type=JKS"], "use PEM or PKCS12"),
    ]:
        r = run_sluice(*listeners, *args)
        out = r.stderr + r.stdout
        assert r.returncode != 0 and says in out, out
        assert SECRET not in out, out
