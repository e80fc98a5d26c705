"""The single-node default is a quorum of one: its metadata is the `__cluster_metadata` log, which
Kafka's `kafka-metadata-quorum` and `sluice cluster --quorum` show through its one listener, and
every metadata change is a committed record in it."""

from __future__ import annotations

import json
import subprocess
import time

import pytest
from confluent_kafka import KafkaError, KafkaException

from harness import SLUICE_BIN, admin, create_topic
from test_cluster import java


def quorum_status(bootstrap: str) -> dict:
    out = java("org.apache.kafka.tools.MetadataQuorumCommand", "--bootstrap-server", bootstrap, "describe", "--status")
    assert out.returncode == 0, out.stderr[-2000:]
    return {k.strip(): v.strip() for k, v in (line.split(":", 1) for line in out.stdout.splitlines() if ":" in line)}


def test_the_single_node_is_a_quorum_of_one_that_kafkas_tools_describe(fresh_broker):
    broker = fresh_broker
    assert (broker.data_dir / "__cluster_metadata-0").is_dir()
    assert not (broker.data_dir / ".sluice-metadata.json").exists()
    before = quorum_status(broker.bootstrap)
    assert before["LeaderId"] == "1", before
    # A new data directory gets a random cluster id as kafka-storage random-uuid makes one
    # (22 characters of base64url), written to meta.properties and kept across restarts.
    cluster_id = before["ClusterId"]
    assert len(cluster_id) == 22 and cluster_id != "sluice-single-node", before
    props = dict(line.split("=", 1) for line in (broker.data_dir / "meta.properties").read_text().splitlines()
                 if "=" in line and not line.startswith("#"))
    assert props["cluster.id"] == cluster_id, props
    assert admin(broker.bootstrap).describe_cluster(request_timeout=10).result(timeout=20).cluster_id == cluster_id
    assert [v["id"] for v in json.loads(before["CurrentVoters"])] == [1], before
    assert before["CurrentObservers"] == "[]", before
    # A topic is a committed change: the high watermark moves.
    create_topic(broker.bootstrap, "quorum-of-one", 3)
    after = quorum_status(broker.bootstrap)
    assert int(after["HighWatermark"]) > int(before["HighWatermark"]), (before, after)

    replication = java("org.apache.kafka.tools.MetadataQuorumCommand", "--bootstrap-server", broker.bootstrap,
                       "describe", "--replication")
    assert replication.returncode == 0, replication.stderr[-2000:]
    rows = [line.split() for line in replication.stdout.splitlines() if line[:1].isdigit()]
    assert [(r[0], r[-1]) for r in rows] == [("1", "Leader")], replication.stdout
    # The leader hears itself now: its last fetch and caught-up times are the present.
    now_ms = time.time() * 1000
    assert all(abs(int(t) - now_ms) < 60_000 for t in rows[0][4:6]), replication.stdout

    ours = subprocess.run([str(SLUICE_BIN), "cluster", "--quorum", "--bootstrap-server", broker.bootstrap],
                          capture_output=True, text=True, timeout=30)
    assert ours.returncode == 0, ours.stderr
    lines = dict(line.split(": ", 1) for line in ours.stdout.splitlines() if ": " in line)
    assert (lines["LeaderId"], lines["CurrentVoters"]) == ("1", "[1]"), ours.stdout

    # A kill -9 and a start: the new incarnation registers at once (its own controller knows
    # the old one is gone), and the topic is there with its leader.
    broker.kill()
    broker.start()
    assert quorum_status(broker.bootstrap)["ClusterId"] == cluster_id
    log = broker.current_log()
    assert "refused the registration" not in log, broker.log_tail()
    md = admin(broker.bootstrap).list_topics(timeout=10)
    assert sorted(md.topics["quorum-of-one"].partitions) == [0, 1, 2]
    assert all(p.leader == 1 for p in md.topics["quorum-of-one"].partitions.values())
    # Internal topics cannot be deleted, as in Kafka.
    a = admin(broker.bootstrap)
    futures = a.delete_topics(["__consumer_offsets"], operation_timeout=10)
    with pytest.raises(KafkaException) as refused:
        futures["__consumer_offsets"].result()
    assert refused.value.args[0].code() == KafkaError.TOPIC_EXCEPTION, refused.value
    assert "__consumer_offsets" in a.list_topics(timeout=10).topics
