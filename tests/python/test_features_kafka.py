"""Feature levels and the protocol versions Kafka 4.4 added, checked against Apache Kafka 4.4.

- `kafka-features describe` lists the same seven features on both; Sluice's levels say what it
  implements. UpdateFeatures (`kafka-features upgrade|downgrade|disable`) changes
  `transaction.version`, durably, and Kafka's Java client follows the level it finalizes: at
  level 1 a transactional producer keeps its epoch through its transactions, as on Kafka; at 2
  every end bumps it. Levels this build does not support are refused as Kafka refuses them.
- `min.insync.replicas` is a cluster-wide dynamic default once eligible leader replicas are on
  (KIP-966): a topic without its own shows it with Kafka's source and synonyms.
- ListOffsets v11 (KIP-1023's earliest pending upload) and every other offset kind the Java
  admin client knows answer as Kafka answers; DescribeLogDirs v5 (KIP-1066's IsCordoned) is what
  `kafka-log-dirs` reads.
"""

from __future__ import annotations

import json
import subprocess
import time

from confluent_kafka.admin import ResourceType

from harness import create_topic, produce_all, producer, assert_all_delivered
from reference import DEPS, kafka_tool
from test_configs_kafka import DYNAMIC_DEFAULT_BROKER_CONFIG, describe

FEATURES = "org.apache.kafka.tools.FeatureCommand"
JAVA_SRC = DEPS.parent.parent / "tests" / "java" / "src" / "sluice"


def features(bootstrap: str) -> dict[str, dict[str, str]]:
    """`kafka-features describe`, by feature: its SupportedMinVersion, SupportedMaxVersion and
    FinalizedVersionLevel."""
    out = kafka_tool(FEATURES, "--bootstrap-server", bootstrap, "describe")
    shown = {}
    for line in out.splitlines():
        words = line.split()
        if words[:1] != ["Feature:"]:
            continue
        fields = dict(zip(words[0::2], words[1::2]))
        shown[fields["Feature:"]] = {k.rstrip(":"): v for k, v in fields.items() if k != "Feature:"}
    return shown


def update(bootstrap: str, *args) -> tuple[int, str]:
    """`kafka-features ARGS`: its exit status and what it printed."""
    done = subprocess.run(["java", "-XX:TieredStopAtLevel=1", "-Dorg.slf4j.simpleLogger.defaultLogLevel=warn",
                           "-cp", f"{DEPS}/*", FEATURES, "--bootstrap-server", bootstrap, *args],
                          capture_output=True, text=True, timeout=120)
    return done.returncode, done.stdout + done.stderr


def java_program(name: str, *args, timeout: float = 180) -> str:
    """Runs tests/java/src/sluice/NAME.java as a single-file program; its stdout."""
    done = subprocess.run(["java", "-XX:TieredStopAtLevel=1", "-Xmx256m",
                           "-Dorg.slf4j.simpleLogger.defaultLogLevel=warn", "-cp", f"{DEPS}/*",
                           str(JAVA_SRC / f"{name}.java"), *args], capture_output=True, text=True, timeout=timeout)
    assert done.returncode == 0, f"{name}: exit {done.returncode}\n{done.stdout}\n{done.stderr[-3000:]}"
    return done.stdout


def producer_epoch(bootstrap: str, transactional_id: str) -> int:
    """The transactional id's producer epoch, as `kafka-transactions describe` shows it."""
    out = kafka_tool("org.apache.kafka.tools.TransactionsCommand", "--bootstrap-server", bootstrap,
                     "describe", "--transactional-id", transactional_id)
    header, row = [line.split() for line in out.strip().splitlines()[:2]]
    return int(row[header.index("ProducerEpoch")])


def back_to_back(bootstrap: str, topic: str, transactional_id: str) -> int:
    """Ten transactions with the Java client (BackToBackTxn); the producer epoch they end at."""
    create_topic(bootstrap, topic, 1)
    out = java_program("BackToBackTxn", bootstrap, topic, transactional_id)
    committed = [f"txn-{i}" for i in range(10) if i % 3 != 1]
    assert out.strip().splitlines()[-1] == "PASS " + ",".join(committed), out
    return producer_epoch(bootstrap, transactional_id)


def test_kafka_features_describes_and_updates_the_levels_sluice_implements(fresh_broker, kafka_reference):
    broker = fresh_broker
    ours, theirs = features(broker.bootstrap), features(kafka_reference.bootstrap)
    assert set(ours) == set(theirs) == {
        "metadata.version", "kraft.version", "eligible.leader.replicas.version", "group.version",
        "transaction.version", "share.version", "streams.version"}, (ours, theirs)
    levels = {name: (f["SupportedMinVersion"], f["SupportedMaxVersion"], f["FinalizedVersionLevel"])
              for name, f in ours.items()}
    assert levels == {
        "metadata.version": ("4.0-IV3", "4.0-IV3", "4.0-IV3"),
        "kraft.version": ("0", "0", "0"),
        "eligible.leader.replicas.version": ("1", "1", "1"),
        "group.version": ("1", "1", "1"),
        "transaction.version": ("0", "2", "2"),
        "share.version": ("0", "1", "1"),
        "streams.version": ("0", "1", "1"),
    }, levels
    for name in ("transaction.version", "group.version", "eligible.leader.replicas.version", "streams.version"):
        assert theirs[name]["FinalizedVersionLevel"] == ours[name]["FinalizedVersionLevel"], (name, theirs[name])

    # Down to transaction.version 1 on both: the Java client then ends transactions without
    # bumping the epoch (KIP-890 part 2 is level 2), on Sluice exactly as on Kafka.
    for b in (broker.bootstrap, kafka_reference.bootstrap):
        rc, out = update(b, "downgrade", "--feature", "transaction.version=1")
        assert rc == 0 and "transaction.version was downgraded to 1." in out, out
        assert features(b)["transaction.version"]["FinalizedVersionLevel"] == "1"
    at_1 = {name: back_to_back(b, "tv1", "tv1-txn")
            for name, b in (("sluice", broker.bootstrap), ("kafka", kafka_reference.bootstrap))}
    assert at_1["sluice"] == at_1["kafka"] == 0, at_1

    # What this build (and Kafka 4.4) does not have is refused, on both, with the same words.
    for b in (broker.bootstrap, kafka_reference.bootstrap):
        rc, out = update(b, "upgrade", "--feature", "transaction.version=3")
        assert rc != 0 and "Could not upgrade transaction.version to 3." in out, out
        rc, out = update(b, "downgrade", "--feature", "transaction.version=2")
        assert rc != 0 and "Could not downgrade transaction.version to 2." in out, out
    rc, out = update(broker.bootstrap, "upgrade", "--feature", "share.version=2")
    assert rc != 0 and "Could not upgrade share.version to 2." in out, out
    # Share groups off and on again: ApiVersions lists their APIs only at share.version 1.
    def share_apis(b: str) -> list[str]:
        out = kafka_tool("org.apache.kafka.tools.BrokerApiVersionsCommand", "--bootstrap-server", b)
        return sorted(line.split("(")[0].strip() for line in out.splitlines()
                      if "Share" in line and "UNSUPPORTED" not in line)
    all_share = ["AlterShareGroupOffsets", "DeleteShareGroupOffsets", "DeleteShareGroupState",
                 "DescribeShareGroupOffsets", "InitializeShareGroupState", "ReadShareGroupState",
                 "ReadShareGroupStateSummary", "ShareAcknowledge", "ShareFetch", "ShareGroupDescribe",
                 "ShareGroupHeartbeat", "WriteShareGroupState"]
    assert share_apis(broker.bootstrap) == all_share
    rc, out = update(broker.bootstrap, "disable", "--feature", "share.version")
    assert rc == 0 and "share.version was disabled." in out, out
    assert share_apis(broker.bootstrap) == []
    rc, out = update(broker.bootstrap, "upgrade", "--feature", "share.version=1")
    assert rc == 0 and "share.version was upgraded to 1." in out, out
    assert share_apis(broker.bootstrap) == all_share

    # The level is in the metadata log: a restart keeps it.
    broker.restart()
    assert features(broker.bootstrap)["transaction.version"]["FinalizedVersionLevel"] == "1"
    rc, out = update(broker.bootstrap, "upgrade", "--feature", "transaction.version=2")
    assert rc == 0 and "transaction.version was upgraded to 2." in out, out
    # At level 2 every end bumps the epoch: ten ends, ten bumps past InitProducerId's 0.
    assert back_to_back(broker.bootstrap, "tv2", "tv2-txn") >= 10
    rc, out = update(broker.bootstrap, "disable", "--feature", "transaction.version")
    assert rc == 0 and "transaction.version was disabled." in out, out
    assert features(broker.bootstrap)["transaction.version"]["FinalizedVersionLevel"] == "0"


def test_min_insync_replicas_is_a_cluster_wide_dynamic_default_as_in_kafka(broker, kafka_reference):
    for b in (broker.bootstrap, kafka_reference.bootstrap):
        create_topic(b, "min-isr-default", 1)
    ours = describe(broker.bootstrap, ResourceType.TOPIC, "min-isr-default")["min.insync.replicas"]
    theirs = describe(kafka_reference.bootstrap, ResourceType.TOPIC, "min-isr-default")["min.insync.replicas"]
    assert (ours.value, ours.source) == (theirs.value, theirs.source) == ("1", DYNAMIC_DEFAULT_BROKER_CONFIG)
    assert ours.synonyms == theirs.synonyms, (ours.synonyms, theirs.synonyms)
    cluster = {}
    for name, b in (("sluice", broker.bootstrap), ("kafka", kafka_reference.bootstrap)):
        out = kafka_tool("org.apache.kafka.tools.ConfigCommand", "--bootstrap-server", b, "--entity-type", "brokers",
                         "--entity-default", "--describe")
        cluster[name] = [w for w in out.split() if w.startswith("min.insync.replicas=")]
    assert cluster["sluice"] == cluster["kafka"] == ["min.insync.replicas=1"], cluster


def test_list_offsets_v11_and_describe_log_dirs_v5_answer_as_kafka(broker, kafka_reference):
    now = int(time.time() * 1000)
    # Old timestamps out of order, then none (the broker's time): max-timestamp and by-timestamp
    # lookups have something to find.
    stamps = [now - 60_000, now - 180_000, now - 120_000]
    for b in (broker.bootstrap, kafka_reference.bootstrap):
        create_topic(b, "offset-kinds", 1)
        reports = produce_all(producer(b), "offset-kinds",
                              [{"value": f"v{i}", "timestamp": t} for i, t in enumerate(stamps)])
        assert_all_delivered(reports)
    lookups = [str(now - 150_000), str(now - 200_000), str(now + 3_600_000)]
    answers = {name: java_program("ListOffsetSpecs", b, "offset-kinds", "0", *lookups).strip().splitlines()
               for name, b in (("sluice", broker.bootstrap), ("kafka", kafka_reference.bootstrap))}
    assert answers["sluice"] == answers["kafka"], answers
    by_kind = dict(line.split(" ", 1) for line in answers["sluice"])
    assert by_kind["earliestPendingUpload"] == "-1 -1 none", by_kind
    assert by_kind["maxTimestamp"] == f"0 {stamps[0]} 0", by_kind
    assert by_kind[f"forTimestamp({now - 150_000})"] == f"0 {stamps[0]} 0", by_kind
    assert by_kind["latest"].split()[0] == "3", by_kind

    sizes = {}
    for name, b in (("sluice", broker.bootstrap), ("kafka", kafka_reference.bootstrap)):
        out = kafka_tool("org.apache.kafka.tools.LogDirsCommand", "--bootstrap-server", b, "--describe",
                         "--topic-list", "offset-kinds")
        described = json.loads(out.strip().splitlines()[-1])
        (only,) = described["brokers"]
        (log_dir,) = only["logDirs"]
        assert log_dir["error"] is None, log_dir
        sizes[name] = [(p["partition"], p["size"] > 0, p["isFuture"]) for p in log_dir["partitions"]]
    assert sizes["sluice"] == sizes["kafka"] == [("offset-kinds-0", True, False)], sizes
