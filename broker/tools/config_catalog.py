#!/usr/bin/env python3
"""Writes broker/src/config_catalog.rs: every broker config Apache Kafka 4.x lists in
DescribeConfigs, with its type, default and whether Kafka can change it without a restart (the
facts Sluice reports for settings it only accepts), and every topic config, with what Kafka
reports for a topic without an override (value, source, broker synonym), read from a running
reference Kafka.

    target/venv/bin/python broker/tools/config_catalog.py [--dump FILE] > broker/src/config_catalog.rs

Run from the repository root; it starts Kafka from target/java-deps (tests/python/reference.py).
Kafka's own documentation strings are not copied: Sluice writes its own (handlers/configs.rs).
Each topic config's synonyms, as Kafka lists them, go to stderr for checking; `--dump FILE` also
writes them there with Kafka's documentation and what Kafka reports for min.insync.replicas (for
reading only: none of it goes into the Rust file).
"""

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tests" / "python"))

from kafka.protocol.admin.configs import DescribeConfigsRequest  # noqa: E402
from kafka.protocol.admin.topics import CreateTopicsRequest  # noqa: E402

from reference import KafkaReference  # noqa: E402
from wire import Pipeline, build  # noqa: E402

RESOURCE_TOPIC = 2
RESOURCE_BROKER = 4
TOPIC_CONFIG = 1
DEFAULT_CONFIG = 5
SOURCES = {0: "UNKNOWN", 1: "TOPIC_CONFIG", 2: "DYNAMIC_BROKER_CONFIG", 3: "DYNAMIC_DEFAULT_BROKER_CONFIG",
           4: "STATIC_BROKER_CONFIG", 5: "DEFAULT_CONFIG", 6: "DYNAMIC_BROKER_LOGGER_CONFIG",
           7: "CLIENT_METRICS_CONFIG", 8: "GROUP_CONFIG"}
# The topic whose configs are described: created with no configs of its own.
TOPIC = "config-catalog"
UNKNOWN_TOPIC_OR_PARTITION = 3
TOPIC_VISIBLE_TIMEOUT_S = 60.0


def rust_str(s):
    if s is None:
        return "None"
    out = []
    for ch in s:
        if ch == "\\":
            out.append("\\\\")
        elif ch == '"':
            out.append('\\"')
        elif ch == "\n":
            out.append("\\n")
        elif ch == "\r":
            out.append("\\r")
        elif ch == "\t":
            out.append("\\t")
        elif ord(ch) < 0x20 or ord(ch) == 0x7f:
            out.append("\\u{%x}" % ord(ch))
        else:
            out.append(ch)
    return 'Some("' + "".join(out) + '")'


def describe(pipe, resource_type, name, keys=None, documentation=False):
    """One resource's DescribeConfigs v4 result (a dict: error_code, error_message, configs)."""
    pipe.send(build(DescribeConfigsRequest, 4, resources=[{
        "resource_type": resource_type, "resource_name": name, "configuration_keys": keys}],
        include_synonyms=True, include_documentation=documentation))
    (response,) = pipe.responses()
    (result,) = response["results"]
    return result


def create_topic(pipe, name):
    pipe.send(build(CreateTopicsRequest, 7, topics=[{
        "name": name, "num_partitions": 1, "replication_factor": 1, "assignments": [], "configs": []}],
        timeout_ms=30_000, validate_only=False))
    (response,) = pipe.responses()
    (topic,) = response["topics"]
    assert topic["error_code"] == 0, f"CreateTopics {name}: {topic}"


def describe_topic(pipe, name):
    """The topic's configs, once the broker knows the topic (CreateTopics answers when the
    controller has it; the broker's metadata may follow a moment later)."""
    deadline = time.monotonic() + TOPIC_VISIBLE_TIMEOUT_S
    while True:
        result = describe(pipe, RESOURCE_TOPIC, name, documentation=True)
        if result["error_code"] != UNKNOWN_TOPIC_OR_PARTITION or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    assert result["error_code"] == 0, f"DescribeConfigs topic {name}: {result}"
    return result["configs"]


def synonyms_text(config):
    return "\n".join(f'    synonym {s["name"]} = {s["value"]!r} (source {s["source"]} {SOURCES.get(s["source"], "?")})'
                     for s in config["synonyms"]) or "    (no synonyms)"


def config_text(config, documentation=True):
    lines = [f'{config["name"]} = {config["value"]!r} (source {config["config_source"]} '
             f'{SOURCES.get(config["config_source"], "?")}, type {config["config_type"]}, '
             f'read_only {config["read_only"]}, sensitive {config["is_sensitive"]})',
             synonyms_text(config)]
    if documentation:
        lines.append(f'    documentation: {config.get("documentation")!r}')
    return "\n".join(lines)


def broker_synonym(config, broker_names):
    """The broker config Kafka lists as the topic config's synonym: the first synonym under
    another name; else one under the same name that is also a broker config (compression.type),
    or that Kafka reports from a broker-level source; else None."""
    for s in config["synonyms"]:
        if s["name"] != config["name"]:
            return s["name"]
    for s in config["synonyms"]:
        if s["source"] != TOPIC_CONFIG and (s["source"] != DEFAULT_CONFIG or s["name"] in broker_names):
            return s["name"]
    return None


def print_broker_configs(configs):
    print("/// One broker config as Kafka defines it.")
    print("pub struct BrokerConfigDef {")
    print("    pub name: &'static str,")
    print("    /// DescribeConfigs `config_type`: 1 boolean, 2 string, 3 int, 4 short, 5 long, 6 double,")
    print("    /// 7 list, 8 class, 9 password.")
    print("    pub config_type: i8,")
    print("    /// Kafka's default, as DescribeConfigs prints it (`None`: no default).")
    print("    pub default: Option<&'static str>,")
    print("    /// Kafka cannot change it without a restart.")
    print("    pub read_only: bool,")
    print("    pub sensitive: bool,")
    print("}")
    print()
    print("pub const BROKER_CONFIGS: &[BrokerConfigDef] = &[")
    for c in configs:
        default = c["value"] if c["config_source"] == DEFAULT_CONFIG else None
        for s in c["synonyms"]:
            if s["source"] == DEFAULT_CONFIG:
                default = s["value"]
        if c["config_source"] != DEFAULT_CONFIG and not any(s["source"] == DEFAULT_CONFIG for s in c["synonyms"]):
            default = None
        print("    BrokerConfigDef {")
        print(f'        name: "{c["name"]}",')
        print(f'        config_type: {c["config_type"]},')
        print(f'        default: {rust_str(default)},')
        print(f'        read_only: {str(c["read_only"]).lower()},')
        print(f'        sensitive: {str(c["is_sensitive"]).lower()},')
        print("    },")
    print("];")


def print_topic_configs(configs, broker_names):
    print("/// One topic config as Kafka defines it: what DescribeConfigs reports for a topic without an")
    print("/// override.")
    print("pub struct TopicConfigDef {")
    print("    pub name: &'static str,")
    print("    /// DescribeConfigs `config_type` (same codes as BrokerConfigDef).")
    print("    pub config_type: i8,")
    print("    /// The value Kafka reports for a topic without an override (None when Kafka reports null).")
    print("    pub default: Option<&'static str>,")
    print("    /// The broker config Kafka lists as its synonym (the first synonym whose name differs from")
    print("    /// the topic config's name, else the same name if Kafka lists a broker-level synonym with")
    print("    /// the same name such as compression.type), or None when Kafka lists none.")
    print("    pub broker_synonym: Option<&'static str>,")
    print("    pub read_only: bool,")
    print("    pub sensitive: bool,")
    print("}")
    print()
    print("pub const TOPIC_CONFIGS: &[TopicConfigDef] = &[")
    for c in configs:
        print("    TopicConfigDef {")
        print(f'        name: "{c["name"]}",')
        print(f'        config_type: {c["config_type"]},')
        print(f'        default: {rust_str(c["value"])},')
        print(f'        broker_synonym: {rust_str(broker_synonym(c, broker_names))},')
        print(f'        read_only: {str(c["read_only"]).lower()},')
        print(f'        sensitive: {str(c["is_sensitive"]).lower()},')
        print("    },")
    print("];")


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dump", type=Path, help="also write each topic config's synonyms, Kafka's "
                        "documentation and the min.insync.replicas answers here")
    args = parser.parse_args()

    k = KafkaReference({}, name="config-catalog")
    k.start()
    try:
        pipe = Pipeline(k.bootstrap)
        broker = describe(pipe, RESOURCE_BROKER, "1")
        assert broker["error_code"] == 0, f"DescribeConfigs broker 1: {broker}"
        create_topic(pipe, TOPIC)
        topic = describe_topic(pipe, TOPIC)
        min_isr = {
            "topic": describe(pipe, RESOURCE_TOPIC, TOPIC, keys=["min.insync.replicas"], documentation=True),
            "cluster default (broker \"\")": describe(pipe, RESOURCE_BROKER, "", keys=["min.insync.replicas"]),
            "broker \"1\"": describe(pipe, RESOURCE_BROKER, "1", keys=["min.insync.replicas"]),
        }
        pipe.close()
    finally:
        k.stop()
        k.remove()
    broker_configs = sorted(broker["configs"], key=lambda c: c["name"])
    broker_names = {c["name"] for c in broker_configs}
    topic_configs = sorted(topic, key=lambda c: c["name"])

    print(f"{len(topic_configs)} topic configs on a topic created without configs; their synonyms:", file=sys.stderr)
    for c in topic_configs:
        print(config_text(c, documentation=False), file=sys.stderr)
        print(f'    -> broker_synonym {broker_synonym(c, broker_names)}', file=sys.stderr)
    if args.dump:
        parts = [f"DescribeConfigs v4 (include_synonyms, include_documentation) of topic {TOPIC!r}, "
                 f"created with 1 partition, replication factor 1 and no configs: {len(topic_configs)} configs.",
                 "Kafka's documentation strings are here for reading only; they are not copied into Sluice.", ""]
        for c in topic_configs:
            parts.append(config_text(c))
            parts.append(f'    -> broker_synonym {broker_synonym(c, broker_names)}')
        parts += ["", "min.insync.replicas (DescribeConfigs v4, keys [\"min.insync.replicas\"]):"]
        for what, result in min_isr.items():
            parts.append(f'{what}: error_code {result["error_code"]}, error_message {result["error_message"]!r}, '
                         f'{len(result["configs"])} configs')
            parts += [config_text(c, documentation=what == "topic") for c in result["configs"]]
        args.dump.write_text("\n".join(parts) + "\n")

    print("//! Every broker config Apache Kafka 4.x reports in DescribeConfigs: name, type (KIP-569),")
    print("//! Kafka's default, and whether Kafka changes it without a restart; and every topic config,")
    print("//! with the value, source and broker synonym Kafka reports for a topic without an override.")
    print("//! Generated by `broker/tools/config_catalog.py` from a reference Kafka; do not edit by hand.")
    print()
    print_broker_configs(broker_configs)
    print()
    print_topic_configs(topic_configs, broker_names)


if __name__ == "__main__":
    main()
