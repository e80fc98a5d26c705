"""Raw Kafka requests on one connection, pipelined, with kafka-python's protocol classes.

`Pipeline(bootstrap)` queues requests with `send` and writes them all at once with
`responses()`, which reads every answer in order and returns them as plain dicts (kafka-python's
`to_dict`), so that a test can send the same sequence to Sluice and to Apache Kafka and compare.
"""

from __future__ import annotations

import socket
import time

from kafka.protocol.parser import KafkaProtocol
from kafka.record.default_records import DefaultRecordBatchBuilder

READ_TIMEOUT_S = 30.0


def batch(values: list[bytes], timestamp_ms: int | None = None, keys=None, compression: int = 0) -> bytes:
    """A record batch (magic 2, no producer id) of `values`, uncompressed unless `compression`
    names kafka-python's codec id (1 gzip and 3 lz4 need no extra package)."""
    ts = int(time.time() * 1000) if timestamp_ms is None else timestamp_ms
    b = DefaultRecordBatchBuilder(magic=2, compression_type=compression, is_transactional=False,
                                  producer_id=-1, producer_epoch=-1, base_sequence=-1,
                                  batch_size=1 << 20)
    for i, v in enumerate(values):
        key = keys[i] if keys else None
        b.append(i, timestamp=ts, key=key, value=v, headers=[])
    return bytes(b.build())


def _convert(fields, values: dict) -> dict:
    out = {}
    for name, value in values.items():
        field = fields[name]
        if field.is_struct_array() and value is not None:
            value = [field.data_class(**_convert(field.data_class.fields, v)) if isinstance(v, dict) else v
                     for v in value]
        elif field.is_struct() and isinstance(value, dict):
            value = field.data_class(**_convert(field.data_class.fields, value))
        out[name] = value
    return out


def build(cls, version: int, **values):
    """A request of kafka-python's message class `cls` at `version`, nested lists of dicts
    turned into its nested structs."""
    return cls[version](**_convert(cls.fields, values))


class Pipeline:
    def __init__(self, bootstrap: str, client_id: str = "sluice-wire-test"):
        host, port = bootstrap.rsplit(":", 1)
        self.sock = socket.create_connection((host, int(port)), timeout=READ_TIMEOUT_S)
        self.protocol = KafkaProtocol(client_id=client_id)
        self.sent = 0

    def send(self, request) -> None:
        self.protocol.send_request(request)
        if request.expect_response():
            self.sent += 1

    def responses(self) -> list[dict]:
        """Writes every queued request in one go, then reads all their responses in order."""
        self.sock.sendall(self.protocol.send_bytes())
        out = []
        while len(out) < self.sent:
            data = self.sock.recv(1 << 20)
            assert data, f"connection closed after {len(out)} of {self.sent} responses"
            for _correlation_id, response in self.protocol.receive_bytes(data):
                out.append(response.to_dict(json=False))
        self.sent = 0
        return out

    def close(self) -> None:
        self.sock.close()
