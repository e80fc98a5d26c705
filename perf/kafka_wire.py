"""Two Kafka requests over a plain socket, for perf/suite's three-broker mode: Metadata (which
brokers a node lists, and each partition's leader) and DescribeQuorum (the active controller).
The standard library only, so that the suite needs no Kafka client of its own; the same bytes go
to Sluice and to Apache Kafka.

    brokers, topics = metadata("127.0.0.1:9092")
    # brokers: {node id: (host, port)}; topics: {topic: {partition: leader's node id}}
    leader = quorum_leader("127.0.0.1:9192")  # the active controller's node id, or None
"""

import socket
import struct

METADATA = 3  # api key; version 4: not yet flexible, and Kafka 4 answers it
DESCRIBE_QUORUM = 55  # api key; version 0 (flexible)
CLIENT_ID = b"sluice-perf-suite"
# What a failed request raises: no connection, a timeout, or an answer cut short.
ERRORS = (OSError, struct.error, IndexError, UnicodeDecodeError)


def _request(address, api_key, version, body, flexible, timeout):
    host, port = address.rsplit(":", 1)
    header = struct.pack(">hhih", api_key, version, 1, len(CLIENT_ID)) + CLIENT_ID
    if flexible:
        header += b"\x00"  # no tagged fields
    frame = header + body
    with socket.create_connection((host, int(port)), timeout=timeout) as s:
        s.sendall(struct.pack(">i", len(frame)) + frame)
        size = struct.unpack(">i", _read(s, 4))[0]
        return Reader(_read(s, size))


def _read(s, n):
    out = bytearray()
    while len(out) < n:
        chunk = s.recv(n - len(out))
        if not chunk:
            raise ConnectionError("connection closed mid-response")
        out += chunk
    return bytes(out)


class Reader:
    def __init__(self, data):
        self.data = data
        self.at = 0

    def take(self, fmt):
        v = struct.unpack_from(fmt, self.data, self.at)
        self.at += struct.calcsize(fmt)
        return v[0] if len(v) == 1 else v

    def string(self):
        n = self.take(">h")
        if n < 0:
            return None
        s = self.data[self.at:self.at + n].decode()
        self.at += n
        return s

    def uvarint(self):
        shift = value = 0
        while True:
            b = self.data[self.at]
            self.at += 1
            value |= (b & 0x7F) << shift
            if not b & 0x80:
                return value
            shift += 7

    def compact_string(self):
        n = self.uvarint() - 1
        if n < 0:
            return None
        s = self.data[self.at:self.at + n].decode()
        self.at += n
        return s

    def tagged_fields(self):
        for _ in range(self.uvarint()):
            self.uvarint()  # tag
            size = self.uvarint()
            self.at += size  # skip the value


def metadata(address, timeout=5.0):
    """Metadata v4 for every topic, answered by the node at `address`: ({node_id: (host, port)},
    {topic: {partition: leader_id}}); a leader of -1 means none."""
    body = struct.pack(">ib", -1, 0)  # every topic; no auto-creation
    r = _request(address, METADATA, 4, body, flexible=False, timeout=timeout)
    r.take(">i")  # correlation id
    r.take(">i")  # throttle time
    brokers = {}
    for _ in range(r.take(">i")):
        node = r.take(">i")
        host = r.string()
        port = r.take(">i")
        r.string()  # rack
        brokers[node] = (host, port)
    r.string()  # cluster id
    r.take(">i")  # controller id: Sluice's brokers name themselves, Kafka's a random broker
    topics = {}
    for _ in range(r.take(">i")):
        error = r.take(">h")
        name = r.string()
        r.take(">b")  # internal
        partitions = {}
        for _ in range(r.take(">i")):
            r.take(">h")  # partition error
            index, leader = r.take(">ii")
            for _ in range(2):  # replicas, ISR
                n = r.take(">i")
                r.at += 4 * n
            partitions[index] = leader
        if error == 0:
            topics[name] = partitions
    return brokers, topics


def quorum_leader(controller_address, timeout=5.0):
    """The quorum leader of `__cluster_metadata`-0 (the active controller) as the controller at
    `controller_address` sees it (DescribeQuorum v0), or None when it knows none."""
    topic = b"__cluster_metadata"
    body = (bytes([2, len(topic) + 1]) + topic  # one topic
            + bytes([2]) + struct.pack(">i", 0) + b"\x00"  # one partition, 0
            + b"\x00" + b"\x00")  # the topic's and the body's tagged fields
    r = _request(controller_address, DESCRIBE_QUORUM, 0, body, flexible=True, timeout=timeout)
    r.take(">i")  # correlation id
    r.tagged_fields()
    if r.take(">h") != 0:
        return None
    if r.uvarint() - 1 < 1:
        return None
    r.compact_string()
    if r.uvarint() - 1 < 1:
        return None
    r.take(">i")  # partition index
    error, leader = r.take(">hi")
    return leader if error == 0 and leader >= 0 else None
