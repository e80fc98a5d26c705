"""`sluice transactions` (list, describe, describe-producers, abort, find-hanging) against a real
broker, with transactions driven by librdkafka's transactional producer and, for a hanging
transaction, by a raw Produce request: the broker's ListTransactions, DescribeTransactions and
DescribeProducers as the CLI shows them, and WriteTxnMarkers as `abort` sends it.

- an open transaction is listed (filters by state, producer id, duration and id pattern),
  described (state, producer, timeout, partitions) and shown by describe-producers with its
  start offset; once committed it is CompleteCommit, and the partition's producer state has no
  open transaction and the coordinator epoch of the commit marker;
- a transactional batch from a producer id no coordinator knows, timestamped an hour ago, holds
  the last stable offset back: find-hanging lists it (and not an open transaction its
  coordinator knows), abort by start offset writes its abort marker, and read_committed then
  reads past it without any of its records;
- Kafka's own kafka-transactions finds the same kind of hanging transaction (with the columns
  `sluice transactions find-hanging` prints, equal) and aborts it.
"""

from __future__ import annotations

import subprocess
import time
import uuid

from confluent_kafka import Producer
from kafka.record.default_records import DefaultRecordBatchBuilder

from harness import SLUICE_BIN, create_topic
from test_produce_kafka import produce_raw
from test_transactions import read_values, reader, txn_producer

TXN_TIMEOUT_MS = 600_000
HOUR_MS = 3_600_000


def sluice(bootstrap: str, *args, check: bool = True) -> subprocess.CompletedProcess:
    out = subprocess.run([str(SLUICE_BIN), "transactions", "--bootstrap-server", bootstrap, *map(str, args)],
                         capture_output=True, text=True, timeout=60)
    if check:
        assert out.returncode == 0, f"sluice transactions {args}: {out.returncode}\n{out.stderr}"
    return out


def table(out: str) -> list[dict[str, str]]:
    """The rows of a table the CLI printed, as dicts keyed by its header."""
    lines = [line for line in out.splitlines() if line.strip()]
    header = lines[0].split()
    rows = []
    for line in lines[1:]:
        cells = line.split()
        assert len(cells) <= len(header), out
        # An empty last cell (no partitions) leaves the line short.
        rows.append(dict(zip(header, cells + [""] * (len(header) - len(cells)))))
    return rows


def new_topic(bootstrap: str, partitions: int) -> str:
    name = f"txadm-{uuid.uuid4().hex[:8]}"
    create_topic(bootstrap, name, partitions)
    return name


def test_list_describe_and_describe_producers(broker):
    bootstrap = broker.bootstrap
    topic = new_topic(bootstrap, 2)
    tid = f"adm-{uuid.uuid4().hex[:6]}"
    p = txn_producer(bootstrap, tid, **{"transaction.timeout.ms": TXN_TIMEOUT_MS})
    p.init_transactions(30)
    p.begin_transaction()
    for i in range(3):
        p.produce(topic, value=f"v{i}".encode(), partition=0)
    p.flush(30)

    listed = [r for r in table(sluice(bootstrap, "list").stdout) if r["TransactionalId"] == tid]
    assert len(listed) == 1, listed
    row = listed[0]
    assert row["TransactionState"] == "Ongoing"
    producer_id = row["ProducerId"]
    assert int(producer_id) >= 0
    assert int(row["Coordinator"]) >= 0

    def ids(*args) -> set[str]:
        return {r["TransactionalId"] for r in table(sluice(bootstrap, "list", *args).stdout)}

    assert tid in ids("--state", "Ongoing")
    assert tid not in ids("--state", "CompleteCommit")
    assert tid in ids("--producer-id", producer_id)
    assert tid not in ids("--producer-id", int(producer_id) + 1000)
    assert tid in ids("--transactional-id-pattern", "adm-.*")
    assert tid not in ids("--transactional-id-pattern", "dm-.*")  # the whole id must match
    assert tid in ids("--duration-filter", 0)
    assert tid not in ids("--duration-filter", HOUR_MS)
    bad = sluice(bootstrap, "list", "--state", "Running", check=False)
    assert bad.returncode != 0 and "Running" in bad.stderr

    (d,) = table(sluice(bootstrap, "describe", "--transactional-id", tid).stdout)
    assert d["TransactionalId"] == tid
    assert d["ProducerId"] == producer_id
    assert d["ProducerEpoch"] == "0"
    assert d["TransactionState"] == "Ongoing"
    assert d["TransactionTimeoutMs"] == str(TXN_TIMEOUT_MS)
    assert abs(int(d["CurrentTransactionStartTimeMs"]) - time.time() * 1000) < 60_000
    assert d["TopicPartitions"] == f"{topic}-0"
    missing = sluice(bootstrap, "describe", "--transactional-id", "adm-nobody", check=False)
    assert missing.returncode != 0 and "TRANSACTIONAL_ID_NOT_FOUND" in missing.stderr

    (dp,) = table(sluice(bootstrap, "describe-producers", "--topic", topic, "--partition", 0).stdout)
    assert dp["ProducerId"] == producer_id
    assert dp["ProducerEpoch"] == "0"
    assert dp["LastSequence"] == "2"
    assert dp["CurrentTransactionStartOffset"] == "0"
    assert dp["LatestCoordinatorEpoch"] == "-1"  # no marker yet
    assert table(sluice(bootstrap, "describe-producers", "--topic", topic, "--partition", 1).stdout) == []

    p.commit_transaction(30)
    # EndTxn answers once PrepareCommit is durable; the markers and CompleteCommit follow.
    deadline = time.monotonic() + 15
    while True:
        (d,) = table(sluice(bootstrap, "describe", "--transactional-id", tid).stdout)
        if d["TransactionState"] != "PrepareCommit" or time.monotonic() > deadline:
            break
        time.sleep(0.1)
    assert d["TransactionState"] == "CompleteCommit"
    assert d["TopicPartitions"] == ""
    # The marker closed the partition's transaction and carries the coordinator's epoch (the
    # leader epoch of its __transaction_state partition, 0 on a fresh single broker).
    (dp,) = table(sluice(bootstrap, "describe-producers", "--topic", topic, "--partition", 0).stdout)
    assert dp["CurrentTransactionStartOffset"] == "None"
    assert dp["LatestCoordinatorEpoch"] == "0"
    assert tid in ids("--state", "CompleteCommit")


def hanging_batch(producer_id: int, values: list[bytes], timestamp_ms: int) -> bytes:
    """A transactional batch from `producer_id`, which no coordinator has heard of."""
    b = DefaultRecordBatchBuilder(magic=2, compression_type=0, is_transactional=True,
                                  producer_id=producer_id, producer_epoch=0, base_sequence=0,
                                  batch_size=1 << 20)
    for i, v in enumerate(values):
        b.append(i, timestamp=timestamp_ms, key=None, value=v, headers=[])
    return bytes(b.build())


def test_find_hanging_and_abort(broker):
    bootstrap = broker.bootstrap
    topic = new_topic(bootstrap, 2)
    hour_ago = int(time.time() * 1000) - HOUR_MS
    hanging_pid = 987_654_321

    part = produce_raw(bootstrap, topic, hanging_batch(hanging_pid, [b"h0", b"h1"], hour_ago))
    assert part["error_code"] == 0, part
    assert part["base_offset"] == 0

    # A transaction its coordinator knows, as old by its records' timestamps: not hanging.
    tid = f"adm-known-{uuid.uuid4().hex[:6]}"
    known = txn_producer(bootstrap, tid, **{"transaction.timeout.ms": TXN_TIMEOUT_MS})
    known.init_transactions(30)
    known.begin_transaction()
    known.produce(topic, value=b"k0", partition=1, timestamp=hour_ago)
    known.flush(30)

    plain = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": False})
    plain.produce(topic, value=b"after", partition=0)
    assert plain.flush(30) == 0

    # The hanging transaction holds the last stable offset at 0: read_committed reads nothing.
    c = reader(bootstrap, "read_committed", [(topic, 0)])
    try:
        assert read_values(c, 0, timeout=10, settle=3) == []
    finally:
        c.close()

    found = table(sluice(bootstrap, "find-hanging", "--topic", topic, "--max-transaction-timeout", 1).stdout)
    assert [(h["Topic"], h["Partition"], h["ProducerId"], h["StartOffset"]) for h in found] == [
        (topic, "0", str(hanging_pid), "0")]
    assert int(found[0]["Duration(min)"]) >= 59
    # By broker: every partition it leads (the single broker is node 1).
    found = table(sluice(bootstrap, "find-hanging", "--broker-id", 1, "--max-transaction-timeout", 1).stdout)
    assert [(h["Topic"], h["ProducerId"]) for h in found] == [(topic, str(hanging_pid))]
    assert table(sluice(bootstrap, "find-hanging", "--broker-id", 2, "--max-transaction-timeout", 1).stdout) == []
    # Younger than the default 15 minutes? No: an hour old, so the default finds it too.
    found = table(sluice(bootstrap, "find-hanging", "--topic", topic).stdout)
    assert [h["ProducerId"] for h in found] == [str(hanging_pid)]
    # With a limit past its age nothing is a candidate.
    assert table(sluice(bootstrap, "find-hanging", "--topic", topic, "--max-transaction-timeout", 120).stdout) == []

    missing = sluice(bootstrap, "abort", "--topic", topic, "--partition", 0, "--start-offset", 1, check=False)
    assert missing.returncode != 0 and "offset 1" in missing.stderr
    sluice(bootstrap, "abort", "--topic", topic, "--partition", 0, "--start-offset", 0)

    assert table(sluice(bootstrap, "find-hanging", "--topic", topic, "--max-transaction-timeout", 1).stdout) == []
    producers = table(sluice(bootstrap, "describe-producers", "--topic", topic, "--partition", 0).stdout)
    (h,) = [p for p in producers if p["ProducerId"] == str(hanging_pid)]
    assert h["CurrentTransactionStartOffset"] == "None"
    assert h["LatestCoordinatorEpoch"] == "0"

    c = reader(bootstrap, "read_committed", [(topic, 0)])
    try:
        assert read_values(c, 1, timeout=20) == [b"after"]
    finally:
        c.close()

    known.abort_transaction(30)


def test_kafka_transactions_finds_and_aborts_a_hanging_transaction(broker):
    """Kafka's own kafka-transactions on the same kind of hanging transaction: its find-hanging
    (DescribeProducers, ListTransactions, DescribeTransactions as Kafka's admin client reads
    them) finds it, with the columns `sluice transactions find-hanging` prints, and its abort
    (WriteTxnMarkers with the epochs DescribeProducers gave) lets read_committed past it."""
    from reference import kafka_tool

    bootstrap = broker.bootstrap
    topic = new_topic(bootstrap, 1)
    hanging_pid = 987_000_001
    hour_ago = int(time.time() * 1000) - HOUR_MS
    part = produce_raw(bootstrap, topic, hanging_batch(hanging_pid, [b"x0", b"x1", b"x2"], hour_ago))
    assert part["error_code"] == 0 and part["base_offset"] == 0, part
    plain = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": False})
    plain.produce(topic, value=b"after", partition=0)
    assert plain.flush(30) == 0

    def kafka_transactions(*args) -> str:
        return kafka_tool("org.apache.kafka.tools.TransactionsCommand", "--bootstrap-server", bootstrap, *args)

    theirs = table(kafka_transactions("find-hanging", "--topic", topic, "--max-transaction-timeout", "1"))
    ours = table(sluice(bootstrap, "find-hanging", "--topic", topic, "--max-transaction-timeout", 1).stdout)
    assert [(h["Topic"], h["Partition"], h["ProducerId"], h["ProducerEpoch"], h["StartOffset"]) for h in theirs] == [
        (topic, "0", str(hanging_pid), "0", "0")]
    for h in theirs + ours:
        h.pop("Duration(min)")  # may tick between the two
    assert ours == theirs

    kafka_transactions("abort", "--topic", topic, "--partition", "0", "--start-offset", "0")
    assert table(kafka_transactions("find-hanging", "--topic", topic, "--max-transaction-timeout", "1")) == []
    c = reader(bootstrap, "read_committed", [(topic, 0)])
    try:
        assert read_values(c, 1, timeout=20) == [b"after"]
    finally:
        c.close()
