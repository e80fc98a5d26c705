"""SASL SCRAM-SHA-256 and SCRAM-SHA-512 with the credentials in the metadata log: users made
with Kafka's `kafka-configs --entity-type users`, with the AdminClient's
AlterUserScramCredentials and with `sluice storage format --add-scram`, then logging in with
librdkafka, kafka-python and the Java client; wrong passwords, unknown and deleted users
refused with Kafka's error; credentials kept without any SASL listener, as Kafka keeps them."""

from __future__ import annotations

import subprocess
import tempfile
import uuid
from pathlib import Path

import pytest
from confluent_kafka import Consumer, KafkaException, Producer
from confluent_kafka.admin import (NewTopic, ScramCredentialInfo, ScramMechanism, UserScramCredentialDeletion,
                                   UserScramCredentialUpsertion)

from harness import SLUICE_BIN, TEST_DIR, Broker, admin
from reference import java

ADMIN_PW = "admin-Pw-5e1a"
JAAS = ('org.apache.kafka.common.security.plain.PlainLoginModule required '
        f'username="admin" password="{ADMIN_PW}" user_admin="{ADMIN_PW}";')
MECHANISMS = ["SCRAM-SHA-256", "SCRAM-SHA-512"]
REFUSED = "Authentication failed during authentication due to invalid credentials with SASL mechanism"


def client(user: str, password: str, mechanism: str = "SCRAM-SHA-256", **extra) -> dict:
    return {"security.protocol": "SASL_PLAINTEXT", "sasl.mechanism": mechanism, "sasl.username": user,
            "sasl.password": password, **extra}


ADMIN = client("admin", ADMIN_PW, "PLAIN")


@pytest.fixture(scope="module")
def broker():
    b = Broker(cores=2, num_partitions=2, name="scram", listener_name="CLIENT", client_config=ADMIN,
               extra_args=["--listener-security-protocol-map", "CLIENT:SASL_PLAINTEXT",
                           "--sasl-enabled-mechanisms", "PLAIN,SCRAM-SHA-256,SCRAM-SHA-512",
                           "--override", f"listener.name.client.plain.sasl.jaas.config={JAAS}",
                           "--connection-failed-authentication-delay-ms", "200"])
    b.start()
    yield b
    b.stop()
    b.remove()


def admin_properties(directory: Path) -> Path:
    path = Path(tempfile.mkstemp(prefix="admin-", suffix=".properties", dir=directory)[1])
    path.write_text("security.protocol=SASL_PLAINTEXT\nsasl.mechanism=PLAIN\n"
                    "sasl.jaas.config=org.apache.kafka.common.security.plain.PlainLoginModule required "
                    f'username="admin" password="{ADMIN_PW}";\n')
    return path


def produce_and_consume(bootstrap: str, config: dict, topic: str, n: int = 200) -> list[bytes]:
    """Produces `n` records and reads them back in a group, both as the client `config` logs in."""
    p = Producer({"bootstrap.servers": bootstrap, "acks": "all", "enable.idempotence": True, **config})
    for i in range(n):
        p.produce(topic, key=b"k%d" % (i % 7), value=b"v%d" % i)
    assert p.flush(30) == 0
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": f"g-{uuid.uuid4().hex[:8]}",
                  "auto.offset.reset": "earliest", **config})
    c.subscribe([topic])
    got = []
    try:
        for _ in range(300):
            m = c.poll(0.5)
            if m is not None and not m.error():
                got.append(m.value())
            if len(got) >= n:
                break
    finally:
        c.close()
    return got


def refused(bootstrap: str, config: dict) -> str:
    """The errors a librdkafka client that cannot log in reports, one per line."""
    errors = []
    a = admin(bootstrap, **config, error_cb=lambda e: errors.append(str(e)))
    with pytest.raises(KafkaException):
        a.list_topics(timeout=2)
    a.poll(0.5)  # serves error_cb
    return "\n".join(errors)


def test_kafka_configs_makes_users_who_log_in_with_every_client(broker):
    b = broker
    props = admin_properties(b.root)
    # One mechanism per request: Kafka 4.4 refuses a user named twice in one request
    # (DUPLICATE_RESOURCE), both mechanisms of one --add-config included, and so does Sluice.
    for config in ["SCRAM-SHA-256=[iterations=8192,password=carol-256]", "SCRAM-SHA-512=[password=carol-512]"]:
        alter = java("org.apache.kafka.tools.ConfigCommand", "--bootstrap-server", b.bootstrap,
                     "--command-config", str(props), "--alter", "--entity-type", "users", "--entity-name", "carol",
                     "--add-config", config)
        assert alter.returncode == 0, alter.stdout[-2000:] + alter.stderr[-2000:]
    both = java("org.apache.kafka.tools.ConfigCommand", "--bootstrap-server", b.bootstrap, "--command-config",
                str(props), "--alter", "--entity-type", "users", "--entity-name", "carol", "--add-config",
                "SCRAM-SHA-256=[password=x-256],SCRAM-SHA-512=[password=x-512]")
    assert both.returncode != 0 and "A user credential cannot be altered twice in the same request" in both.stderr
    described = java("org.apache.kafka.tools.ConfigCommand", "--bootstrap-server", b.bootstrap, "--command-config", str(props),
                     "--describe", "--entity-type", "users", "--entity-name", "carol")
    assert described.returncode == 0, described.stderr[-2000:]
    assert "SCRAM-SHA-256=iterations=8192" in described.stdout, described.stdout
    assert "SCRAM-SHA-512=iterations=4096" in described.stdout, described.stdout
    assert "carol-256" not in described.stdout + b.log_path.read_text()
    a = admin(b.bootstrap, **ADMIN)
    a.create_topics([NewTopic("scram", 2, 1)])["scram"].result(15)

    # librdkafka, each mechanism with its own password.
    for mechanism, password in [("SCRAM-SHA-256", "carol-256"), ("SCRAM-SHA-512", "carol-512")]:
        got = produce_and_consume(b.bootstrap, client("carol", password, mechanism), f"scram-{mechanism}")
        assert sorted(got, key=lambda v: int(v[1:])) == [b"v%d" % i for i in range(200)]
    # The other mechanism's password, a wrong one, an unknown user: Kafka's refusal.
    for config in [client("carol", "carol-512", "SCRAM-SHA-256"), client("carol", "nope", "SCRAM-SHA-512"),
                   client("nobody", "carol-256", "SCRAM-SHA-256")]:
        assert REFUSED in refused(b.bootstrap, config)
    log = b.log_path.read_text()
    assert "failed SASL authentication" in log and "carol-256" not in log and "carol-512" not in log

    # kafka-python, SCRAM-SHA-512.
    from kafka import KafkaConsumer, KafkaProducer, TopicPartition
    common = dict(bootstrap_servers=b.bootstrap, security_protocol="SASL_PLAINTEXT",
                  sasl_mechanism="SCRAM-SHA-512", sasl_plain_username="carol", sasl_plain_password="carol-512")
    kp = KafkaProducer(acks="all", **common)
    for i in range(100):
        kp.send("scram", value=b"py%d" % i, partition=1)
    kp.flush()
    kp.close()
    k = KafkaConsumer(auto_offset_reset="earliest", consumer_timeout_ms=15000, **common)
    k.assign([TopicPartition("scram", 1)])
    got = [m.value for m in k if m.value.startswith(b"py")]
    k.close()
    assert got == [b"py%d" % i for i in range(100)]

    # The Java client, through the console tools, with ScramLoginModule.
    def properties(password: str) -> Path:
        path = Path(tempfile.mkstemp(prefix="carol-", suffix=".properties", dir=b.root)[1])
        path.write_text("security.protocol=SASL_PLAINTEXT\nsasl.mechanism=SCRAM-SHA-256\n"
                        "sasl.jaas.config=org.apache.kafka.common.security.scram.ScramLoginModule required "
                        f'username="carol" password="{password}";\n')
        return path

    lines = "".join(f"java-{i}\n" for i in range(100))
    done = java("org.apache.kafka.tools.ConsoleProducer", "--bootstrap-server", b.bootstrap, "--topic", "java-scram",
                "--command-config", str(properties("carol-256")), stdin=lines)
    assert done.returncode == 0, done.stderr[-2000:]
    read = java("org.apache.kafka.tools.consumer.ConsoleConsumer", "--bootstrap-server", b.bootstrap,
                "--topic", "java-scram", "--from-beginning", "--max-messages", "100", "--timeout-ms", "20000",
                "--command-config", str(properties("carol-256")))
    assert read.stdout.split() == [f"java-{i}" for i in range(100)], read.stderr[-2000:]
    bad = java("org.apache.kafka.tools.TopicCommand", "--bootstrap-server", b.bootstrap, "--list",
               "--command-config", str(properties("wrong")), timeout=120)
    assert bad.returncode != 0 and REFUSED in bad.stdout + bad.stderr

    # Deleted with kafka-configs: carol can no longer log in with that mechanism.
    delete = java("org.apache.kafka.tools.ConfigCommand", "--bootstrap-server", b.bootstrap, "--command-config", str(props),
                  "--alter", "--entity-type", "users", "--entity-name", "carol", "--delete-config", "SCRAM-SHA-512")
    assert delete.returncode == 0, delete.stderr[-2000:]
    assert REFUSED in refused(b.bootstrap, client("carol", "carol-512", "SCRAM-SHA-512"))
    got = produce_and_consume(b.bootstrap, client("carol", "carol-256"), "scram", n=10)
    assert len(got) >= 10


def test_the_admin_client_alters_and_describes_with_kafkas_errors(broker):
    a = admin(broker.bootstrap, **ADMIN)
    sha256, sha512 = ScramMechanism.SCRAM_SHA_256, ScramMechanism.SCRAM_SHA_512
    done = a.alter_user_scram_credentials([
        UserScramCredentialUpsertion("dave", ScramCredentialInfo(sha512, 10000), b"dave-pw", b"dave-salt"),
        UserScramCredentialUpsertion("erin", ScramCredentialInfo(sha256, 100), b"erin-pw"),
        UserScramCredentialDeletion("frank", sha256),
    ])
    done["dave"].result(15)
    with pytest.raises(KafkaException) as e:
        done["erin"].result(15)
    assert e.value.args[0].name() == "UNACCEPTABLE_CREDENTIAL" and "Too few iterations" in str(e.value)
    with pytest.raises(KafkaException) as e:
        done["frank"].result(15)
    assert e.value.args[0].name() == "RESOURCE_NOT_FOUND"
    described = a.describe_user_scram_credentials(["dave"])["dave"].result(15)
    assert [(i.mechanism, i.iterations) for i in described.scram_credential_infos] == [(sha512, 10000)]
    with pytest.raises(KafkaException) as e:
        a.describe_user_scram_credentials(["erin"])["erin"].result(15)
    assert e.value.args[0].name() == "RESOURCE_NOT_FOUND"
    everyone = a.describe_user_scram_credentials().result(15)
    assert "dave" in everyone and "erin" not in everyone
    got = produce_and_consume(broker.bootstrap, client("dave", "dave-pw", "SCRAM-SHA-512"), "admin-made", n=20)
    assert sorted(got, key=lambda v: int(v[1:])) == [b"v%d" % i for i in range(20)]
    # Deleted: refused from then on, on a new connection.
    a.alter_user_scram_credentials([UserScramCredentialDeletion("dave", sha512)])["dave"].result(15)
    assert REFUSED in refused(broker.bootstrap, client("dave", "dave-pw", "SCRAM-SHA-512"))


def test_storage_format_add_scram_bootstraps_users_that_survive_a_restart():
    b = Broker(cores=1, name="scram-boot", listener_name="CLIENT",
               client_config=client("alice", "alice-secret"),
               extra_args=["--listener-security-protocol-map", "CLIENT:SASL_PLAINTEXT",
                           "--sasl-enabled-mechanisms", "SCRAM-SHA-256",
                           "--connection-failed-authentication-delay-ms", "200"])
    formatted = subprocess.run(
        [str(SLUICE_BIN), "storage", "format", "-t", "q1Sh-9_ISia_zwGINzRvyQ", "--node-id", "1",
         "--data-dir", str(b.data_dir), "--add-scram", "SCRAM-SHA-256=[name=alice,password=alice-secret]",
         "--add-scram", 'SCRAM-SHA-256=[name=bob,password="b, o=b]",iterations=5000]'],
        capture_output=True, text=True, timeout=30)
    assert formatted.returncode == 0, formatted.stderr
    assert "alice-secret" not in formatted.stdout + formatted.stderr
    assert "alice-secret" not in (b.data_dir / "bootstrap.checkpoint").read_bytes().decode("latin-1")
    try:
        b.start()
        for round_ in range(2):
            got = produce_and_consume(b.bootstrap, client("alice", "alice-secret"), f"boot-{round_}", n=50)
            assert sorted(got, key=lambda v: int(v[1:])) == [b"v%d" % i for i in range(50)]
            got = produce_and_consume(b.bootstrap, client("bob", "b, o=b]"), f"bob-{round_}", n=5)
            assert len(got) == 5
            if round_ == 0:
                assert REFUSED in refused(b.bootstrap, client("alice", "alice-secreT"))
                assert "SCRAM-SHA-256" in refused(b.bootstrap, client("alice", "alice-secret", "PLAIN"))
                b.stop()
                b.start()
    finally:
        b.stop()
        b.remove()


def test_credentials_are_kept_without_a_sasl_listener():
    """As Kafka: a PLAINTEXT broker stores and describes SCRAM credentials."""
    b = Broker(cores=1, name="scram-plain")
    b.start()
    try:
        a = admin(b.bootstrap)
        a.alter_user_scram_credentials([UserScramCredentialUpsertion(
            "gina", ScramCredentialInfo(ScramMechanism.SCRAM_SHA_256, 4096), b"gina-pw")])["gina"].result(15)
        b.stop()
        b.start()
        a = admin(b.bootstrap)
        info = a.describe_user_scram_credentials(["gina"])["gina"].result(15)
        assert [(i.mechanism, i.iterations) for i in info.scram_credential_infos] == \
            [(ScramMechanism.SCRAM_SHA_256, 4096)]
    finally:
        b.stop()
        b.remove()


@pytest.mark.parametrize("legacy", [False, True])
def test_kcat_logs_in_with_scram(broker, legacy):
    """kcat's librdkafka (1.7, older than the Python client's): it echoes a nonce with its own in
    front twice, which Kafka accepts and so does Sluice; with ApiVersions off, SaslHandshake v0
    and SCRAM's two messages as bare tokens."""
    a = admin(broker.bootstrap, **ADMIN)
    a.alter_user_scram_credentials([UserScramCredentialUpsertion(
        "kim", ScramCredentialInfo(ScramMechanism.SCRAM_SHA_512, 4096), b"kim-pw")])["kim"].result(15)

    def kcat(password: str, *args: str, stdin: str | None = None) -> subprocess.CompletedProcess:
        extra = ["-X", "api.version.request=false", "-X", "broker.version.fallback=0.10.0"] if legacy else []
        return subprocess.run(["kcat", "-b", broker.bootstrap, "-X", "security.protocol=SASL_PLAINTEXT",
                               "-X", "sasl.mechanism=SCRAM-SHA-512", "-X", "sasl.username=kim",
                               "-X", f"sasl.password={password}", *extra, *args],
                              input=stdin, capture_output=True, text=True, timeout=60)

    listed = kcat("kim-pw", "-m", "10", "-L")
    assert listed.returncode == 0 and " 1 brokers:" in listed.stdout, listed.stderr
    assert kcat("kim-Pw", "-m", "3", "-L").returncode != 0
    if not legacy:
        lines = [f"kcat-{i}" for i in range(50)]
        produced = kcat("kim-pw", "-P", "-t", "kcat-scram", "-p", "0", stdin="\n".join(lines) + "\n")
        assert produced.returncode == 0, produced.stderr
        consumed = kcat("kim-pw", "-C", "-t", "kcat-scram", "-p", "0", "-o", "beginning", "-e", "-q")
        assert consumed.stdout.split() == lines, consumed.stderr
