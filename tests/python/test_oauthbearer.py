"""SASL OAUTHBEARER as Kafka's broker runs it: unsecured tokens (Kafka's default validator, its
options in the listener's `OAuthBearerLoginModule` JAAS entry) from librdkafka's own token
builder and from the Java client's unsecured login module, and tokens signed with RS256 that
the broker checks against a JWKS file (`sasl.oauthbearer.jwks.endpoint.url`, expected audience
and issuer) from librdkafka's `oauth_cb` and kafka-python's token provider. Refusals (expired,
missing scope, signed by another key, another audience, unsigned where a signature is due) get
RFC 7628's `{"status":"invalid_token"}`, then SASL_AUTHENTICATION_FAILED after the client's
\\x01, a log line with the reason and never the token. Tokens are made here with the openssl
command (RSA keys, PKCS#1 v1.5 signatures)."""

from __future__ import annotations

import base64
import http.server
import json
import socket
import struct
import ssl
import subprocess
import tempfile
import threading
import time
from pathlib import Path

import pytest
from kafka import KafkaConsumer, KafkaProducer, TopicPartition as KpTopicPartition
from kafka.net.sasl.oauth import AbstractTokenProvider

from harness import SLUICE_BIN, TEST_DIR, Broker, consumer, free_port, produce_all, producer, read_to_end, assert_all_delivered
from reference import java
from test_sasl import handshake, read_frames, request
from confluent_kafka import TopicPartition

import certs as certs_mod

AUTHORIZER = "org.apache.kafka.metadata.authorizer.StandardAuthorizer"
ISSUER = "https://issuer.sluice.test"
AUDIENCE = "sluice"


def b64url(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def unsecured_token(sub: str, lifetime: int = 3600, **claims) -> str:
    now = int(time.time())
    body = {"sub": sub, "iat": now, "exp": now + lifetime, **claims}
    header = b64url(json.dumps({"alg": "none"}).encode())
    return f"{header}.{b64url(json.dumps(body).encode())}."


class Signer:
    """An RSA key made with openssl, its JWKS entry, and RS256 tokens it signs."""

    def __init__(self, directory: Path, kid: str):
        self.kid = kid
        self.key = directory / f"{kid}.pem"
        subprocess.run(["openssl", "genpkey", "-algorithm", "RSA", "-pkeyopt", "rsa_keygen_bits:2048",
                        "-out", str(self.key)], check=True, capture_output=True)
        modulus = subprocess.run(["openssl", "rsa", "-in", str(self.key), "-noout", "-modulus"],
                                 check=True, capture_output=True, text=True).stdout.strip().split("=", 1)[1]
        self.jwk = {"kty": "RSA", "kid": kid, "use": "sig", "alg": "RS256",
                    "n": b64url(bytes.fromhex(modulus)), "e": "AQAB"}

    def token(self, sub: str, lifetime: int = 3600, aud: str = AUDIENCE, iss: str = ISSUER, kid: str | None = None) -> str:
        now = int(time.time())
        header = b64url(json.dumps({"alg": "RS256", "typ": "JWT", "kid": kid or self.kid}).encode())
        claims = b64url(json.dumps({"sub": sub, "iat": now, "exp": now + lifetime, "aud": aud, "iss": iss}).encode())
        signing_input = f"{header}.{claims}"
        signature = subprocess.run(["openssl", "dgst", "-sha256", "-sign", str(self.key)],
                                   input=signing_input.encode(), check=True, capture_output=True).stdout
        return f"{signing_input}.{b64url(signature)}"


def write_jwks(path: Path, *signers: Signer) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps({"keys": [s.jwk for s in signers]}))
    tmp.rename(path)


def oauth_broker(name: str, *args: str, jaas_options: str = "") -> Broker:
    jaas = f"org.apache.kafka.common.security.oauthbearer.OAuthBearerLoginModule required {jaas_options};"
    return Broker(
        cores=1, num_partitions=2, name=name, listener_name="CLIENT",
        client_config={"security.protocol": "SASL_PLAINTEXT", "sasl.mechanism": "OAUTHBEARER",
                       "enable.sasl.oauthbearer.unsecure.jwt": True,
                       "sasl.oauthbearer.config": "principal=alice scope=kafka"},
        extra_args=["--listener-security-protocol-map", "CLIENT:SASL_PLAINTEXT",
                    "--sasl-enabled-mechanisms", "OAUTHBEARER",
                    "--override", f"listener.name.client.oauthbearer.sasl.jaas.config={jaas}",
                    "--connection-failed-authentication-delay-ms", "100", *args],
    )


def sasl_authenticate(corr: int, token: bytes) -> bytes:
    # SaslAuthenticate v1: auth_bytes as BYTES.
    return request(36, 1, corr, struct.pack(">i", len(token)) + token)


def exchange(port: int, message: bytes) -> tuple[tuple[int, bytes], tuple[int, str] | None]:
    """Handshake, the client-first message, then `\\x01` if the broker answered with an error:
    (first answer's error code and bytes), (second answer's error code and message) or None."""
    with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
        s.sendall(handshake(1, "OAUTHBEARER") + sasl_authenticate(2, message))
        frames = read_frames(s, 2)
        assert len(frames) == 2, frames
        corr, code, msg_len = struct.unpack(">ihh", frames[1][:8])
        at = 8 + max(msg_len, 0)
        (n,) = struct.unpack(">i", frames[1][at:at + 4])
        first = (code, frames[1][at + 4:at + 4 + n])
        if code != 0 or first[1] == b"":
            return first, None
        s.sendall(sasl_authenticate(3, b"\x01"))
        (f,) = read_frames(s, 1)
        corr, code, msg_len = struct.unpack(">ihh", f[:8])
        return first, (code, f[8:8 + max(msg_len, 0)].decode())


def bearer(token: str) -> bytes:
    return f"n,,\x01auth=Bearer {token}\x01\x01".encode()


@pytest.fixture(scope="module")
def unsecured():
    b = oauth_broker("oauth-unsecured",
                     "--override", f"authorizer.class.name={AUTHORIZER}",
                     "--override", "super.users=User:alice",
                     jaas_options='unsecuredValidatorRequiredScope="kafka"')
    b.start()
    yield b
    b.stop()
    b.remove()


def roundtrip(bootstrap: str, config: dict, topic: str, n: int) -> None:
    messages = [{"key": f"k{i}".encode(), "value": f"v{i}".encode()} for i in range(n)]
    reports = produce_all(producer(bootstrap, **config), topic, messages)
    assert_all_delivered(reports)
    c = consumer(bootstrap, **config)
    parts = sorted({r.partition for r in reports})
    c.assign([TopicPartition(topic, p, 0) for p in parts])
    ends = {(topic, p): max(r.offset for r in reports if r.partition == p) + 1 for p in parts}
    got = read_to_end(c, ends)
    c.close()
    assert sorted(m.value() for m in got) == sorted(m["value"] for m in messages)


def test_librdkafka_unsecured_tokens_name_the_principal(unsecured):
    roundtrip(unsecured.bootstrap, unsecured.client_config, "oauth-unsecured", 200)
    # carol has the scope but no ACL: she is in, as User:carol, and sees no topic.
    carol = {**unsecured.client_config, "sasl.oauthbearer.config": "principal=carol scope=kafka"}
    from confluent_kafka.admin import AdminClient
    md = AdminClient({"bootstrap.servers": unsecured.bootstrap, **carol}).list_topics(timeout=10)
    assert "oauth-unsecured" not in md.topics
    # dave's token lacks the scope the listener requires: refused.
    dave = {**unsecured.client_config, "sasl.oauthbearer.config": "principal=dave scope=other"}
    with pytest.raises(Exception):
        AdminClient({"bootstrap.servers": unsecured.bootstrap, **dave}).list_topics(timeout=5)
    log = unsecured.log_path.read_text()
    assert "lacks the required scope kafka" in log


def test_refusals_follow_rfc_7628(unsecured):
    first, second = exchange(unsecured.port, bearer(unsecured_token("alice", scope="kafka")))
    assert first == (0, b"") and second is None
    for token, why in [(unsecured_token("alice", lifetime=-120, scope="kafka"), "expired"),
                       (unsecured_token("alice"), "lacks the required scope"),
                       (unsecured_token("alice", scope="kafka") + "c2ln", "no signature")]:
        first, second = exchange(unsecured.port, bearer(token))
        assert first == (0, b'{"status":"invalid_token"}'), first
        assert second is not None and second[0] == 58 and second[1].startswith("Authentication failed"), second
        log = unsecured.log_path.read_text()
        assert why in log and token not in log
    first, _ = exchange(unsecured.port, b"n,,auth=Bearer x")
    assert first == (0, b'{"status":"invalid_token"}')


def test_the_java_client_logs_in_with_its_unsecured_login_module(unsecured, tmp_path):
    props = tmp_path / "oauth.properties"
    props.write_text(
        "security.protocol=SASL_PLAINTEXT\nsasl.mechanism=OAUTHBEARER\n"
        "sasl.jaas.config=org.apache.kafka.common.security.oauthbearer.OAuthBearerLoginModule required "
        'unsecuredLoginStringClaim_sub="alice" unsecuredLoginListClaim_scope=",kafka";\n')
    lines = "".join(f"java-{i}\n" for i in range(50))
    done = java("org.apache.kafka.tools.ConsoleProducer", "--bootstrap-server", unsecured.bootstrap,
                "--topic", "oauth-java", "--command-config", str(props), stdin=lines)
    assert done.returncode == 0, done.stderr[-2000:]
    read = java("org.apache.kafka.tools.consumer.ConsoleConsumer", "--bootstrap-server", unsecured.bootstrap,
                "--topic", "oauth-java", "--from-beginning", "--max-messages", "50", "--timeout-ms", "20000",
                "--command-config", str(props))
    assert sorted(read.stdout.split()) == sorted(f"java-{i}" for i in range(50)), read.stderr[-2000:]


@pytest.fixture(scope="module")
def signed():
    d = Path(tempfile.mkdtemp(prefix="pytest-oauth-keys-", dir=TEST_DIR))
    first, other = Signer(d, "key-1"), Signer(d, "key-2")
    jwks = d / "jwks.json"
    write_jwks(jwks, first)
    b = oauth_broker("oauth-signed",
                     "--override", f"sasl.oauthbearer.jwks.endpoint.url=file://{jwks}",
                     "--override", f"sasl.oauthbearer.expected.audience={AUDIENCE}",
                     "--override", f"sasl.oauthbearer.expected.issuer={ISSUER}",
                     "--override", "listener.name.client.oauthbearer.sasl.server.callback.handler.class="
                                   "org.apache.kafka.common.security.oauthbearer.OAuthBearerValidatorCallbackHandler")
    b.client_config = {"security.protocol": "SASL_PLAINTEXT", "sasl.mechanism": "OAUTHBEARER",
                       "oauth_cb": lambda _: (first.token("alice"), time.time() + 3600)}
    b.signers = (first, other)
    b.jwks = jwks
    b.start()
    yield b
    b.stop()
    b.remove()


def test_signed_tokens_from_librdkafka_and_kafka_python(signed):
    roundtrip(signed.bootstrap, signed.client_config, "oauth-signed", 200)
    first, _ = signed.signers

    class Provider(AbstractTokenProvider):
        def token(self):
            return first.token("bob")

    config = {"bootstrap_servers": signed.bootstrap, "security_protocol": "SASL_PLAINTEXT",
              "sasl_mechanism": "OAUTHBEARER", "sasl_oauth_token_provider": Provider()}
    p = KafkaProducer(**config)
    for i in range(50):
        p.send("oauth-python", value=f"py-{i}".encode(), partition=0)
    p.flush(30)
    p.close()
    c = KafkaConsumer(**config, consumer_timeout_ms=10_000, auto_offset_reset="earliest")
    c.assign([KpTopicPartition("oauth-python", 0)])
    got = []
    for m in c:
        got.append(m.value.decode())
        if len(got) == 50:
            break
    c.close()
    assert got == [f"py-{i}" for i in range(50)]


def test_signed_tokens_are_checked_against_the_jwks(signed):
    first, other = signed.signers
    assert exchange(signed.port, bearer(first.token("alice")))[0] == (0, b"")
    for token, why in [(other.token("alice", kid="key-1"), "InvalidSignature"),
                       (first.token("alice", aud="elsewhere"), "InvalidAudience"),
                       (first.token("alice", iss="https://other.test"), "InvalidIssuer"),
                       (first.token("alice", lifetime=-600), "ExpiredSignature"),
                       (other.token("alice"), 'no key "key-2"'),
                       (unsecured_token("alice"), "the token's header")]:
        first_answer, second = exchange(signed.port, bearer(token))
        assert first_answer == (0, b'{"status":"invalid_token"}'), (why, first_answer)
        assert second is not None and second[0] == 58, second
        log = signed.log_path.read_text()
        assert why in log, why
        assert token not in log
    # The key set rotated on disk: the new key's tokens get in, without a restart.
    write_jwks(signed.jwks, other)
    deadline = time.monotonic() + 10
    while exchange(signed.port, bearer(other.token("alice")))[0] != (0, b""):
        assert time.monotonic() < deadline, "the rotated key set was not read"
        time.sleep(0.2)
    assert exchange(signed.port, bearer(first.token("alice")))[0] == (0, b'{"status":"invalid_token"}')
    write_jwks(signed.jwks, first)


def test_bad_oauth_settings_stop_the_start():
    d = Path(tempfile.mkdtemp(prefix="pytest-oauth-bad-", dir=TEST_DIR))
    args = [str(SLUICE_BIN), "--data-dir", str(d), "--cores", "1", "--listeners", f"CLIENT://127.0.0.1:{free_port()}",
            "--listener-security-protocol-map", "CLIENT:SASL_PLAINTEXT", "--sasl-enabled-mechanisms", "OAUTHBEARER"]
    for extra, said in [(["--override", "sasl.oauthbearer.jwks.endpoint.url=https://idp.sluice.invalid/jwks"],
                         "the JWKS at https://idp.sluice.invalid/jwks"),
                        (["--override", f"sasl.oauthbearer.jwks.endpoint.url=file://{d}/missing.json"], "missing.json"),
                        (["--override", "listener.name.client.oauthbearer.sasl.jaas.config="
                                        "org.apache.kafka.common.security.plain.PlainLoginModule required;"],
                         "OAuthBearerLoginModule")]:
        r = subprocess.run([*args, *extra], capture_output=True, text=True, timeout=30)
        assert r.returncode != 0 and said in r.stderr + r.stdout, r.stderr[-1000:]


class JwksServer:
    """An identity provider's JWKS endpoint over HTTPS (a certificate of the test authority),
    serving whatever key set is current and counting the fetches."""

    def __init__(self, certs):
        self.keys: list[dict] = []
        self.fetches = 0
        server = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self):
                server.fetches += 1
                body = json.dumps({"keys": server.keys}).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args):
                pass

        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.load_cert_chain(certs.dir / "broker.crt", certs.dir / "broker.key")
        self.httpd.socket = context.wrap_socket(self.httpd.socket, server_side=True)
        self.url = f"https://127.0.0.1:{self.httpd.server_address[1]}/jwks"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def close(self):
        self.httpd.shutdown()


def test_signed_tokens_against_a_jwks_served_over_https():
    """sasl.oauthbearer.jwks.endpoint.url naming an https endpoint (trusted through
    ssl.truststore.location): fetched once at start, whichever shard checks the token; a token
    naming a key the set lacks (the provider rotated its keys) makes the broker fetch it again
    early, so the new key's tokens get in without a restart, and a flood of unknown keys fetches
    at most about once a second."""
    d = Path(tempfile.mkdtemp(prefix="pytest-oauth-https-", dir=TEST_DIR))
    certs = certs_mod.make(d / "certs")
    first, second = Signer(d, "key-1"), Signer(d, "key-2")
    idp = JwksServer(certs)
    idp.keys = [first.jwk]
    b = oauth_broker("oauth-https",
                     "--override", f"sasl.oauthbearer.jwks.endpoint.url={idp.url}",
                     "--ssl-truststore-location", str(certs.ca),
                     "--override", f"sasl.oauthbearer.expected.audience={AUDIENCE}",
                     "--override", f"sasl.oauthbearer.expected.issuer={ISSUER}")
    b.client_config = {"security.protocol": "SASL_PLAINTEXT", "sasl.mechanism": "OAUTHBEARER",
                       "oauth_cb": lambda _: (first.token("alice"), time.time() + 3600)}
    try:
        b.start()
        assert idp.fetches == 1
        assert exchange(b.port, bearer(first.token("alice")))[0] == (0, b"")
        roundtrip(b.bootstrap, b.client_config, "oauth-https", 50)
        assert idp.fetches == 1
        # The provider rotates to a second key: its first token is refused and asks for the
        # set again; soon after, its tokens get in.
        idp.keys = [first.jwk, second.jwk]
        token = second.token("alice")
        deadline = time.monotonic() + 10
        while exchange(b.port, bearer(token))[0] != (0, b""):
            assert time.monotonic() < deadline, "the rotated key set was not fetched"
            time.sleep(0.2)
        assert idp.fetches == 2
        # Tokens naming keys no one has: fetches stay about one a second.
        before, start = idp.fetches, time.monotonic()
        for i in range(30):
            exchange(b.port, bearer(first.token("alice", kid=f"nobody-{i}")))
        elapsed = time.monotonic() - start
        assert idp.fetches - before <= elapsed + 2, (idp.fetches - before, elapsed)
        # Without a truststore that holds its authority, the endpoint is not trusted: no start.
        r = subprocess.run([str(SLUICE_BIN), "--data-dir", str(d / "untrusted"), "--cores", "1",
                            "--listeners", f"CLIENT://127.0.0.1:{free_port()}",
                            "--listener-security-protocol-map", "CLIENT:SASL_PLAINTEXT",
                            "--sasl-enabled-mechanisms", "OAUTHBEARER",
                            "--override", f"sasl.oauthbearer.jwks.endpoint.url={idp.url}"],
                           capture_output=True, text=True, timeout=60)
        out = r.stderr + r.stdout
        assert r.returncode != 0 and f"the JWKS at {idp.url}" in out and "UnknownIssuer" in out, out[-1000:]
    finally:
        b.stop()
        b.remove()
        idp.close()
