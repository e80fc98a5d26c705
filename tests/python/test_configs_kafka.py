"""DescribeConfigs and dynamic broker configs, checked against Apache Kafka 4.x.

- A broker lists every config Kafka 4.x lists, with Kafka's type (KIP-569), a documentation
  string, synonyms, and Kafka's default wherever Sluice only accepts the setting (for example
  `log.flush.interval.messages`); topic configs carry Kafka's types and broker synonyms.
- IncrementalAlterConfigs and AlterConfigs on broker resources (this broker, and the cluster-wide
  default under the empty name, as `kafka-configs --entity-type brokers`) are stored durably and
  applied without a restart where Kafka applies them: a `log.*` default reaches every topic
  without an override, `max.connections.per.ip` the next connection; configs Kafka reads only at
  start are refused as Kafka refuses them. Kafka's own `kafka-configs` sets, describes and
  deletes them; the legacy AlterConfigs replaces a resource's whole set of dynamic configs.
"""

from __future__ import annotations

import socket
import time

from confluent_kafka import TopicPartition
from confluent_kafka.admin import AlterConfigOpType, ConfigEntry, ResourceType

from kafka.protocol.admin.configs import AlterConfigsRequest, DescribeConfigsRequest, IncrementalAlterConfigsRequest

from harness import consumer, create_topic, producer, produce_all, assert_all_delivered
from reference import kafka_tool
from wire import Pipeline, build

BROKER_ARGS = ["--log-retention-check-interval-ms", "200"]
KAFKA_PROPS = {"log.retention.check.interval.ms": "200", "log.initial.task.delay.ms": "0"}

# DescribeConfigs config_source values.
TOPIC_CONFIG, DYNAMIC_BROKER_CONFIG, DYNAMIC_DEFAULT_BROKER_CONFIG, DEFAULT_CONFIG = 1, 2, 3, 5

# Set on the reference Kafka's command line or by the test harness (ports, paths, ids, test
# speed-ups), or different in Sluice by design (its defaults): values not compared.
DIFFERENT_BY_SETUP = {
    "advertised.listeners", "listeners", "log.dirs", "controller.quorum.bootstrap.servers",
    "controller.listener.names", "listener.security.protocol.map", "inter.broker.listener.name",
    "process.roles", "offsets.topic.num.partitions", "offsets.topic.replication.factor",
    "transaction.state.log.replication.factor", "transaction.state.log.min.isr",
    "share.coordinator.state.topic.replication.factor", "share.coordinator.state.topic.min.isr",
    "group.initial.rebalance.delay.ms", "log.retention.check.interval.ms", "log.initial.task.delay.ms",
    "num.partitions", "broker.id", "node.id",
    # Sluice's own default, 2 MiB (broker/src/config.rs says why).
    "fetch.max.bytes",
}


class Entry:
    """One config of a DescribeConfigs v4 answer."""

    def __init__(self, c: dict):
        self.value = c["value"]
        self.source = c["config_source"]
        self.type = c["config_type"]
        self.documentation = c["documentation"]
        self.is_sensitive = c["is_sensitive"]
        self.read_only = c["read_only"]
        self.synonyms = [(s["name"], s["value"], s["source"]) for s in c["synonyms"]]


def describe(bootstrap: str, rtype: ResourceType, name: str) -> dict[str, Entry]:
    """DescribeConfigs v4 with synonyms and documentation, as `kafka-configs --describe --all`."""
    pipe = Pipeline(bootstrap)
    pipe.send(build(DescribeConfigsRequest, 4, resources=[{
        "resource_type": int(rtype.value), "resource_name": name, "configuration_keys": None}],
        include_synonyms=True, include_documentation=True))
    (r,) = pipe.responses()
    pipe.close()
    (result,) = r["results"]
    assert result["error_code"] == 0, result
    return {c["name"]: Entry(c) for c in result["configs"]}


def alter(bootstrap: str, rtype: ResourceType, name: str, entries: list[ConfigEntry]) -> int:
    """IncrementalAlterConfigs v1; the resource's error code."""
    pipe = Pipeline(bootstrap)
    pipe.send(build(IncrementalAlterConfigsRequest, 1, validate_only=False, resources=[{
        "resource_type": int(rtype.value), "resource_name": name, "configs": [{
            "name": e.name, "config_operation": int(e.incremental_operation.value), "value": e.value}
            for e in entries]}]))
    (r,) = pipe.responses()
    pipe.close()
    return r["responses"][0]["error_code"]


def legacy_alter(bootstrap: str, rtype: ResourceType, name: str, configs: dict[str, str]) -> int:
    """AlterConfigs v1, Kafka's legacy call that replaces the resource's whole set of dynamic
    configs with `configs`; the resource's error code."""
    pipe = Pipeline(bootstrap)
    pipe.send(build(AlterConfigsRequest, 1, validate_only=False, resources=[{
        "resource_type": int(rtype.value), "resource_name": name,
        "configs": [{"name": k, "value": v} for k, v in configs.items()]}]))
    (r,) = pipe.responses()
    pipe.close()
    return r["responses"][0]["error_code"]


def dynamic(bootstrap: str, name: str) -> dict[str, str]:
    """The dynamic configs of broker resource `name` ("" for the cluster-wide default)."""
    source = DYNAMIC_DEFAULT_BROKER_CONFIG if name == "" else DYNAMIC_BROKER_CONFIG
    return {k: e.value for k, e in describe(bootstrap, ResourceType.BROKER, name).items() if e.source == source}


def eventually(read, want, timeout: float = 20.0):
    """What `read()` gives once it gives `want` (or satisfies it, if a function), or at the
    deadline: Kafka applies dynamic configs after it has answered the change."""
    deadline = time.monotonic() + timeout
    while True:
        got = read()
        if (want(got) if callable(want) else got == want) or time.monotonic() > deadline:
            return got
        time.sleep(0.2)


def topic_config(bootstrap: str, topic: str, key: str) -> tuple[str, int]:
    """A topic config's value and source."""
    e = describe(bootstrap, ResourceType.TOPIC, topic)[key]
    return e.value, e.source


def test_every_kafka_broker_config_is_listed_with_kafkas_type_and_default(broker, kafka_reference):
    ours = describe(broker.bootstrap, ResourceType.BROKER, "1")
    theirs = describe(kafka_reference.bootstrap, ResourceType.BROKER, "1")
    # Internal settings Kafka lists only when set (the test sets log.initial.task.delay.ms).
    missing = sorted(set(theirs) - set(ours) - set(KAFKA_PROPS))
    assert not missing, f"{len(missing)} Kafka broker configs not listed: {missing[:20]}"
    assert len(theirs) > 300, len(theirs)
    wrong_type = {k: (ours[k].type, theirs[k].type) for k in theirs if k in ours and ours[k].type != theirs[k].type}
    assert not wrong_type, wrong_type
    for name, t in theirs.items():
        if name in KAFKA_PROPS and name not in ours:
            continue
        o = ours[name]
        assert o.is_sensitive == t.is_sensitive, name
        if name in DIFFERENT_BY_SETUP or t.source != DEFAULT_CONFIG:
            continue
        # Sluice's own values differ from Kafka's defaults only where Sluice reads the setting.
        if o.source == DEFAULT_CONFIG:
            assert o.value == t.value, (name, o.value, t.value)
    # Accepted-only settings show Kafka's default, e.g. the message-count flush.
    assert ours["log.flush.interval.messages"].value == "9223372036854775807"
    assert ours["log.flush.interval.messages"].source == DEFAULT_CONFIG
    # Documentation and synonyms are filled in (DescribeConfigs v3+ and v1+).
    assert all(c.documentation for c in ours.values()), [k for k, c in ours.items() if not c.documentation][:5]
    assert ours["log.retention.check.interval.ms"].synonyms
    # Sluice's own settings come last, under their own names.
    assert ours["fetch.zero.copy"].value == "true"


def test_topic_configs_carry_kafkas_types_and_broker_synonyms(broker, kafka_reference):
    for b in (broker.bootstrap, kafka_reference.bootstrap):
        create_topic(b, "described", 1, {"retention.ms": "3600000"})
    ours = describe(broker.bootstrap, ResourceType.TOPIC, "described")
    theirs = describe(kafka_reference.bootstrap, ResourceType.TOPIC, "described")
    shared = set(ours) & set(theirs)
    assert {"retention.ms", "segment.bytes", "cleanup.policy", "max.message.bytes"} <= shared
    assert {k: ours[k].type for k in shared} == {k: theirs[k].type for k in shared}
    for key in ("retention.ms",):
        assert ours[key].value == theirs[key].value == "3600000"
        assert ours[key].source == theirs[key].source == TOPIC_CONFIG
    # The broker synonym of a topic default, as Kafka names it.
    seg = [s[0] for s in ours["segment.bytes"].synonyms]
    assert seg == [s[0] for s in theirs["segment.bytes"].synonyms] == ["log.segment.bytes"], seg


def test_every_kafka_topic_config_is_described_accepted_and_kept(broker, kafka_reference):
    """A topic lists every config Kafka 4.4 lists for it (37), with Kafka's types, and Sluice's
    own `flush.mode`; `min.insync.replicas` among them, so `kafka-configs --describe` shows a value
    set on it and `kafka-topics --describe --at-min-isr-partitions` (which reads it) works on both
    and names the same partitions. A setting Sluice only accepts (`file.delete.delay.ms`) is
    accepted, kept and described like an honoured one; one whose value Sluice cannot honour
    (`min.compaction.lag.ms` above 0) is refused with INVALID_CONFIG and a message saying so."""
    for b in (broker.bootstrap, kafka_reference.bootstrap):
        create_topic(b, "all-configs", 2, {"file.delete.delay.ms": "1000"})
    ours = describe(broker.bootstrap, ResourceType.TOPIC, "all-configs")
    theirs = describe(kafka_reference.bootstrap, ResourceType.TOPIC, "all-configs")
    assert len(theirs) >= 37, sorted(theirs)
    assert set(ours) == set(theirs) | {"flush.mode"}, (set(ours) ^ set(theirs))
    assert {k: ours[k].type for k in theirs} == {k: theirs[k].type for k in theirs}
    assert all(ours[k].documentation for k in ours), [k for k in ours if not ours[k].documentation]
    assert ours["file.delete.delay.ms"].value == theirs["file.delete.delay.ms"].value == "1000"
    assert ours["file.delete.delay.ms"].source == theirs["file.delete.delay.ms"].source == TOPIC_CONFIG

    topics_cli = lambda b, *args: kafka_tool("org.apache.kafka.tools.TopicCommand", "--bootstrap-server", b,
                                             "--describe", *args)
    for b in (broker.bootstrap, kafka_reference.bootstrap):
        out = kafka_tool("org.apache.kafka.tools.ConfigCommand", "--bootstrap-server", b, "--entity-type", "topics",
                         "--entity-name", "all-configs", "--alter", "--add-config", "min.insync.replicas=1")
        assert "Completed updating config" in out, out
    shown = {}
    at_min = {}
    for name, b in (("sluice", broker.bootstrap), ("kafka", kafka_reference.bootstrap)):
        out = kafka_tool("org.apache.kafka.tools.ConfigCommand", "--bootstrap-server", b, "--entity-type", "topics",
                         "--entity-name", "all-configs", "--describe")
        shown[name] = sorted(w for w in out.split() if w.startswith(("min.insync.replicas=", "file.delete.delay.ms=")))
        # One replica, min.insync.replicas 1: every partition is at its minimum ISR.
        listed = topics_cli(b, "--topic", "all-configs", "--at-min-isr-partitions")
        at_min[name] = sorted(line.split("Partition:")[1].split()[0] for line in listed.splitlines()
                              if "Partition:" in line)
    assert shown["sluice"] == shown["kafka"] == ["file.delete.delay.ms=1000", "min.insync.replicas=1"], shown
    assert at_min["sluice"] == at_min["kafka"] == ["0", "1"], at_min

    # What Sluice cannot honour is refused, not stored and ignored.
    refused = alter(broker.bootstrap, ResourceType.TOPIC, "all-configs", [
        ConfigEntry("min.compaction.lag.ms", "60000", incremental_operation=AlterConfigOpType.SET)])
    assert refused == 40, refused  # INVALID_CONFIG
    assert describe(broker.bootstrap, ResourceType.TOPIC, "all-configs")["min.compaction.lag.ms"].value == "0"
    bad = alter(broker.bootstrap, ResourceType.TOPIC, "all-configs", [
        ConfigEntry("segment.index.bytes", "lots", incremental_operation=AlterConfigOpType.SET)])
    assert bad == 40, bad


def test_dynamic_broker_configs_apply_at_once_and_persist(broker, kafka_reference):
    results = {}
    for name, b in (("kafka", kafka_reference.bootstrap), ("sluice", broker.bootstrap)):
        create_topic(b, "dynamic-default", 1)
        r = {
            # This broker's own default for topics without an override.
            "set": alter(b, ResourceType.BROKER, "1", [ConfigEntry("log.retention.ms", "1500",
                                                                   incremental_operation=AlterConfigOpType.SET)]),
            # The cluster-wide default.
            "set_default": alter(b, ResourceType.BROKER, "", [ConfigEntry("log.segment.bytes", "2097152",
                                                                          incremental_operation=AlterConfigOpType.SET)]),
            # Kafka reads these only at start-up.
            "read_only": alter(b, ResourceType.BROKER, "1", [ConfigEntry("log.retention.check.interval.ms", "1000",
                                                                          incremental_operation=AlterConfigOpType.SET)]),
            # Kafka keeps broker configs it does not know (plugins read their own).
        "unknown": alter(b, ResourceType.BROKER, "1", [ConfigEntry("no.such.config", "1",
                                                                        incremental_operation=AlterConfigOpType.SET)]),
            "bad_value": alter(b, ResourceType.BROKER, "1", [ConfigEntry("log.retention.ms", "soon",
                                                                          incremental_operation=AlterConfigOpType.SET)]),
        }
        # Kafka applies dynamic configs asynchronously: wait for the topic to show it.
        deadline = time.monotonic() + 20
        while True:
            topic = describe(b, ResourceType.TOPIC, "dynamic-default")
            if topic["retention.ms"].value == "1500" or time.monotonic() > deadline:
                break
            time.sleep(0.2)
        r["topic_retention"] = (topic["retention.ms"].value, topic["retention.ms"].source)
        r["topic_segment"] = (topic["segment.bytes"].value, topic["segment.bytes"].source)
        r["broker_view"] = describe(b, ResourceType.BROKER, "1")["log.retention.ms"].value
        r["cluster_default"] = {k: v.value for k, v in describe(b, ResourceType.BROKER, "").items()
                                if k == "log.segment.bytes"}
        results[name] = r
    assert results["sluice"] == results["kafka"], results
    assert results["sluice"]["topic_retention"] == ("1500", DYNAMIC_BROKER_CONFIG)
    assert results["sluice"]["topic_segment"] == ("2097152", DYNAMIC_DEFAULT_BROKER_CONFIG)
    # Applied without a restart: records produced now are gone once 1.5 s old.
    p = producer(broker.bootstrap)
    assert_all_delivered(produce_all(p, "dynamic-default", [{"value": b"x"}] * 10))
    c = consumer(broker.bootstrap)
    deadline = time.monotonic() + 20
    while c.get_watermark_offsets(TopicPartition("dynamic-default", 0), timeout=10, cached=False) != (10, 10):
        assert time.monotonic() < deadline, "the dynamic log.retention.ms was not applied"
        time.sleep(0.25)
    c.close()
    # Durable: the broker keeps them across a restart.
    broker.restart()
    assert describe(broker.bootstrap, ResourceType.BROKER, "1")["log.retention.ms"].value == "1500"
    # The cluster-wide default too, and it still reaches the topic.
    assert describe(broker.bootstrap, ResourceType.BROKER, "")["log.segment.bytes"].value == "2097152"
    segment = describe(broker.bootstrap, ResourceType.TOPIC, "dynamic-default")["segment.bytes"]
    assert (segment.value, segment.source) == ("2097152", DYNAMIC_DEFAULT_BROKER_CONFIG)
    # Deleting the override brings the default back.
    assert alter(broker.bootstrap, ResourceType.BROKER, "1", [ConfigEntry("log.retention.ms", None,
                                                                          incremental_operation=AlterConfigOpType.DELETE)]) == 0
    assert describe(broker.bootstrap, ResourceType.TOPIC, "dynamic-default")["retention.ms"].value == "604800000"


def test_max_connections_per_ip_changes_without_a_restart(broker):
    assert alter(broker.bootstrap, ResourceType.BROKER, "1", [ConfigEntry("max.connections.per.ip", "3",
                                                                          incremental_operation=AlterConfigOpType.SET)]) == 0
    host, port = broker.bootstrap.split(":")
    time.sleep(0.5)
    # From an address no other client of this broker uses, so only these count.
    source = ("127.0.0.2", 0)
    held = [socket.create_connection((host, int(port)), timeout=5, source_address=source) for _ in range(3)]
    for s in held:
        s.settimeout(0.5)
        try:
            assert s.recv(1) != b"", "one of the first three connections was closed"
        except TimeoutError:
            pass
    extra = socket.create_connection((host, int(port)), timeout=5, source_address=source)
    extra.settimeout(5)
    assert extra.recv(1) == b"", "a fourth connection from one address stays open"
    for s in held + [extra]:
        s.close()
    assert alter(broker.bootstrap, ResourceType.BROKER, "1", [ConfigEntry("max.connections.per.ip", None,
                                                                          incremental_operation=AlterConfigOpType.DELETE)]) == 0


def test_legacy_alter_configs_replaces_a_brokers_dynamic_configs(broker, kafka_reference):
    results = {}
    for name, b in (("kafka", kafka_reference.bootstrap), ("sluice", broker.bootstrap)):
        create_topic(b, "legacy-default", 1)
        set_op = AlterConfigOpType.SET
        r = {"incremental": alter(b, ResourceType.BROKER, "1", [
                ConfigEntry("log.retention.bytes", "1073741824", incremental_operation=set_op),
                ConfigEntry("max.connections", "1000", incremental_operation=set_op)]),
             "incremental_default": alter(b, ResourceType.BROKER, "", [
                ConfigEntry("log.cleaner.backoff.ms", "20000", incremental_operation=set_op)])}
        eventually(lambda: dynamic(b, "1").get("max.connections"), "1000")
        # Names one of the two: the other goes.
        r["replace"] = legacy_alter(b, ResourceType.BROKER, "1", {"log.retention.bytes": "2147483648"})
        r["after_replace"] = eventually(lambda: dynamic(b, "1"), {"log.retention.bytes": "2147483648"})
        r["topic_after_replace"] = eventually(lambda: topic_config(b, "legacy-default", "retention.bytes"),
                                              ("2147483648", DYNAMIC_BROKER_CONFIG))
        # Refused as a whole, changing nothing.
        r["read_only"] = legacy_alter(b, ResourceType.BROKER, "1", {"log.retention.check.interval.ms": "1000"})
        r["bad_value"] = legacy_alter(b, ResourceType.BROKER, "1", {"log.retention.bytes": "lots"})
        r["after_refusals"] = dynamic(b, "1")
        # Another broker's configs go to that broker, as Kafka's clients send them.
        r["other_broker"] = legacy_alter(b, ResourceType.BROKER, "2", {"log.retention.bytes": "5"})
        r["other_broker_incremental"] = alter(b, ResourceType.BROKER, "2", [
            ConfigEntry("log.retention.bytes", "5", incremental_operation=set_op)])
        # The cluster-wide default is a resource of its own, replaced the same way. Kafka, with
        # eligible leader replicas on, keeps a cluster-wide `min.insync.replicas` and refuses to
        # remove it (INVALID_CONFIG), so every replacement names it.
        kept = {"min.insync.replicas": "1"}
        r["replace_default"] = legacy_alter(b, ResourceType.BROKER, "", {"log.segment.bytes": "4194304", **kept})
        r["default_after_replace"] = eventually(lambda: dynamic(b, ""), {"log.segment.bytes": "4194304", **kept})
        r["broker_after_default_replace"] = dynamic(b, "1")
        # Nothing named: every dynamic config of the resource goes, and the defaults are back.
        r["clear"] = legacy_alter(b, ResourceType.BROKER, "1", {})
        r["clear_default"] = legacy_alter(b, ResourceType.BROKER, "", kept)
        r["after_clear"] = eventually(lambda: (dynamic(b, "1"), dynamic(b, "")), ({}, kept))
        r["topic_after_clear"] = eventually(lambda: topic_config(b, "legacy-default", "retention.bytes"),
                                            ("-1", DEFAULT_CONFIG))
        results[name] = r
    assert results["sluice"] == results["kafka"], results
    r = results["sluice"]
    assert [r[k] for k in ("incremental", "incremental_default", "replace", "replace_default", "clear",
                           "clear_default")] == [0] * 6, r
    assert r["default_after_replace"] == {"log.segment.bytes": "4194304", "min.insync.replicas": "1"}, r
    assert r["after_replace"] == r["after_refusals"] == r["broker_after_default_replace"] == \
        {"log.retention.bytes": "2147483648"}, r
    assert r["topic_after_replace"] == ("2147483648", DYNAMIC_BROKER_CONFIG), r
    # INVALID_REQUEST.
    assert [r[k] for k in ("read_only", "bad_value", "other_broker", "other_broker_incremental")] == [42] * 4, r
    assert r["after_clear"] == ({}, {"min.insync.replicas": "1"}), r
    assert r["topic_after_clear"] == ("-1", DEFAULT_CONFIG), r


def configs_cli(bootstrap: str, *args) -> str:
    """Apache Kafka's `kafka-configs` on the broker entities; its output."""
    return kafka_tool("org.apache.kafka.tools.ConfigCommand", "--bootstrap-server", bootstrap,
                      "--entity-type", "brokers", *args)


def connections_kept(bootstrap: str, source_ip: str, count: int) -> int:
    """Opens `count` connections at once from `source_ip`: how many the broker keeps open."""
    host, port = bootstrap.split(":")
    held = [socket.create_connection((host, int(port)), timeout=5, source_address=(source_ip, 0))
            for _ in range(count)]
    try:
        # A refused connection is closed as soon as it is accepted.
        time.sleep(0.5)
        kept = 0
        for s in held:
            s.setblocking(False)
            try:
                s.recv(1)
            except BlockingIOError:
                kept += 1
            except ConnectionResetError:
                pass
        return kept
    finally:
        for s in held:
            s.close()


def test_kafka_configs_cli_sets_broker_configs_that_apply_at_once(broker, kafka_reference):
    """`kafka-configs --entity-type brokers` for this broker and the cluster-wide default, on
    both brokers; `max.connections.per.ip` applies to the next connection."""
    setting = "max.connections.per.ip"
    outputs = {}
    for name, b in (("kafka", kafka_reference.bootstrap), ("sluice", broker.bootstrap)):
        out = [configs_cli(b, "--entity-default", "--alter", "--add-config", f"{setting}=24"),
               configs_cli(b, "--entity-name", "1", "--alter", "--add-config", f"{setting}=16"),
               eventually(lambda: configs_cli(b, "--entity-name", "1", "--describe"),
                          lambda got: f"  {setting}=16 " in got),
               configs_cli(b, "--entity-default", "--describe")]
        if name == "sluice":
            # This broker's own value before the cluster's; from an address no other client uses.
            assert eventually(lambda: connections_kept(b, "127.0.0.3", 17), 16) == 16
        out.append(configs_cli(b, "--entity-name", "1", "--alter", "--delete-config", setting))
        if name == "sluice":
            assert eventually(lambda: connections_kept(b, "127.0.0.3", 25), 24) == 24
        out += [configs_cli(b, "--entity-default", "--alter", "--delete-config", setting),
                configs_cli(b, "--entity-name", "1", "--describe"),
                configs_cli(b, "--entity-default", "--describe")]
        if name == "sluice":
            assert eventually(lambda: connections_kept(b, "127.0.0.3", 25), 25) == 25
        # Other tests' dynamic configs are not this test's to compare.
        outputs[name] = [[line for line in o.splitlines() if not line.startswith("  ") or
                          line.startswith(f"  {setting}=")] for o in out]
    assert outputs["sluice"] == outputs["kafka"], outputs
    o = outputs["sluice"]
    assert o[0] == ["Completed updating default config for brokers in the cluster."], o
    assert o[1] == ["Completed updating config for broker 1."], o
    assert o[2] == ["Dynamic configs for broker 1 are:",
                    f"  {setting}=16 sensitive=false synonyms={{DYNAMIC_BROKER_CONFIG:{setting}=16, "
                    f"DYNAMIC_DEFAULT_BROKER_CONFIG:{setting}=24, DEFAULT_CONFIG:{setting}=2147483647}}"], o
    assert o[3] == ["Default configs for brokers in the cluster are:",
                    f"  {setting}=24 sensitive=false synonyms={{DYNAMIC_DEFAULT_BROKER_CONFIG:{setting}=24}}"], o
    assert o[6] == ["Dynamic configs for broker 1 are:"], o
    assert o[7] == ["Default configs for brokers in the cluster are:"], o


def logger_alter(bootstrap: str, name: str, configs: list[tuple[str, int, str | None]]) -> tuple[int, str | None]:
    """IncrementalAlterConfigs v1 on broker loggers (resource type 8); (error code, message)."""
    pipe = Pipeline(bootstrap)
    pipe.send(build(IncrementalAlterConfigsRequest, 1, validate_only=False, resources=[{
        "resource_type": 8, "resource_name": name, "configs": [
            {"name": n, "config_operation": op, "value": v} for n, op, v in configs]}]))
    (r,) = pipe.responses()
    pipe.close()
    (resource,) = r["responses"]
    return resource["error_code"], resource["error_message"]


def logger_levels(bootstrap: str) -> dict[str, str]:
    pipe = Pipeline(bootstrap)
    pipe.send(build(DescribeConfigsRequest, 4, resources=[{
        "resource_type": 8, "resource_name": "1", "configuration_keys": None}],
        include_synonyms=True, include_documentation=True))
    (r,) = pipe.responses()
    pipe.close()
    (result,) = r["results"]
    assert result["error_code"] == 0, result
    for c in result["configs"]:
        assert (c["config_source"], c["config_type"], c["synonyms"], c["read_only"]) == (6, 0, [], False), c
    return {c["name"]: c["value"] for c in result["configs"]}


def test_broker_loggers_change_log_levels_at_run_time(broker, kafka_reference):
    """`kafka-configs --entity-type broker-loggers` (DescribeConfigs and IncrementalAlterConfigs on
    resource type 8): the same answers as Kafka for a level set on the root logger, an unknown
    level, an unknown logger, deleting the root, APPEND and another broker's id; Kafka's own tool
    describes and changes Sluice's loggers, and a level set at run time takes effect at once (a
    fetch logs its `sluice::fetch` debug line only while the logger `sluice.fetch` is at DEBUG)."""
    SET, DELETE, APPEND = 0, 1, 2
    answers = {}
    for name, b in (("sluice", broker.bootstrap), ("kafka", kafka_reference.bootstrap)):
        r = answers[name] = {}
        r["set_root"] = logger_alter(b, "1", [("root", SET, "WARN")])
        r["root_after"] = logger_levels(b)["root"]
        r["bad_level"] = logger_alter(b, "1", [("root", SET, "LOUD")])
        r["lower_case"] = logger_alter(b, "1", [("root", SET, "debug")])
        r["unknown_logger"] = logger_alter(b, "1", [("no.such.Logger", SET, "DEBUG")])
        r["delete_root"] = logger_alter(b, "1", [("root", DELETE, None)])
        r["append"] = logger_alter(b, "1", [("root", APPEND, "DEBUG")])
        r["twice"] = logger_alter(b, "1", [("root", SET, "INFO"), ("root", SET, "WARN")])
        r["other_broker"] = logger_alter(b, "2", [("root", SET, "INFO")])
        r["reset_root"] = logger_alter(b, "1", [("root", SET, "INFO")])
    assert answers["sluice"] == answers["kafka"], answers
    r = answers["sluice"]
    assert r["set_root"] == r["reset_root"] == (0, None), r
    assert r["root_after"] == "WARN"
    assert [r[k][0] for k in ("bad_level", "lower_case", "unknown_logger")] == [40] * 3, r
    assert [r[k][0] for k in ("delete_root", "append", "twice", "other_broker")] == [42] * 4, r

    # Kafka's tool on Sluice's loggers.
    tool = lambda *args: kafka_tool("org.apache.kafka.tools.ConfigCommand", "--bootstrap-server", broker.bootstrap,
                                    "--entity-type", "broker-loggers", "--entity-name", "1", *args)
    listed = tool("--describe")
    assert listed.splitlines()[0] == "Dynamic configs for broker-logger 1 are:", listed
    assert "  root=INFO sensitive=false synonyms={}" in listed.splitlines(), listed
    assert "Completed updating config for broker-logger 1." in tool("--alter", "--add-config", "sluice.fetch=DEBUG")
    assert "sluice.fetch=DEBUG" in tool("--describe")

    def fetch_some() -> None:
        c = consumer(broker.bootstrap)
        try:
            c.assign([TopicPartition("loggers-probe", 0, 0)])
            c.consume(num_messages=10, timeout=1)
        finally:
            c.close()
        time.sleep(1)  # the last fetch's line is written

    lines = lambda: broker.current_log().count("sluice::fetch")
    create_topic(broker.bootstrap, "loggers-probe", 1)
    before = lines()
    fetch_some()
    assert lines() > before, "no sluice::fetch debug line while that logger is at DEBUG"
    assert "Completed updating config" in tool("--alter", "--delete-config", "sluice.fetch")
    assert "sluice.fetch=INFO" in tool("--describe")
    settled = lines()
    fetch_some()
    assert lines() == settled, "sluice::fetch still logs at DEBUG after its level was deleted"
