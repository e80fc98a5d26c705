//! The operator subcommands against a real broker: starts the `sluice` binary on a free port
//! with a temporary data directory, then runs `sluice topic`, `produce`, `consume` and
//! `cluster` as processes and checks what they print.
//!
//! Admin APIs the broker may not implement yet (DeleteTopics, DescribeConfigs,
//! IncrementalAlterConfigs) are looked up with an ApiVersions request of the test's own; when
//! one is missing, the test checks that the subcommand says so clearly instead.

use std::collections::{BTreeMap, BTreeSet};
use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use kafka_protocol::messages::{ApiKey, ApiVersionsResponse, RequestHeader};
use kafka_protocol::protocol::{Decodable, Encodable};

mod common;
use common::{now_ms, parse_produce_summary, run_sluice, Broker};

/// One line of `sluice consume` text output.
#[derive(Debug, Clone, PartialEq)]
struct Line {
    partition: i32,
    offset: i64,
    timestamp: i64,
    key: String,
    headers: String,
    value: String,
}

fn parse_text(output: &str) -> Vec<Line> {
    output
        .lines()
        .map(|line| {
            let fields: Vec<&str> = line.splitn(6, '\t').collect();
            assert_eq!(fields.len(), 6, "line {line:?}");
            let field = |i: usize, name: &str| -> String {
                fields[i]
                    .strip_prefix(name)
                    .unwrap_or_else(|| panic!("field {i} of {line:?} is not {name}"))
                    .to_string()
            };
            Line {
                partition: field(0, "Partition:").parse().unwrap(),
                offset: field(1, "Offset:").parse().unwrap(),
                timestamp: field(2, "CreateTime:").parse().unwrap(),
                key: field(3, "Key:"),
                headers: field(4, "Headers:"),
                value: field(5, "Value:"),
            }
        })
        .collect()
}

#[test]
fn operator_subcommands_against_a_real_broker() {
    for args in [
        &["--help"][..],
        &["topic", "--help"],
        &["topic", "create", "--help"],
        &["topic", "alter-config", "--help"],
        &["produce", "--help"],
        &["consume", "--help"],
        &["cluster", "--help"],
    ] {
        let dir = tempfile::tempdir().unwrap();
        let out = run_sluice(dir.path(), args, &[], "");
        assert!(out.success, "sluice {args:?}: {}", out.stderr);
        assert!(out.stdout.contains("Usage: sluice"), "{}", out.stdout);
    }

    let broker = Broker::start();
    let apis = broker.advertised_apis();
    let has = |key: ApiKey| apis.contains(&(key as i16));

    // Nothing but a broker that is not there.
    {
        let dir = tempfile::tempdir().unwrap();
        let out = run_sluice(
            dir.path(),
            &["topic", "list"],
            &["--bootstrap-server", "127.0.0.1:1"],
            "",
        );
        assert!(!out.success);
        assert!(
            out.stderr
                .contains("cannot connect to the broker at 127.0.0.1:1"),
            "{}",
            out.stderr
        );
    }

    // Topics.
    let created = broker.ok(
        &[
            "topic",
            "create",
            "events",
            "--partitions",
            "3",
            "--replication-factor",
            "1",
            "--config",
            "retention.ms=86400000",
            "--config",
            "cleanup.policy=delete",
        ],
        "",
    );
    assert!(created.contains("Created topic events"), "{created}");
    broker.fails(
        &["topic", "create", "events", "--partitions", "3"],
        "",
        "TOPIC_ALREADY_EXISTS",
    );
    broker.ok(&["topic", "create", "events", "--if-not-exists"], "");
    broker.fails(
        &["topic", "create", "bad/name", "--partitions", "1"],
        "",
        "INVALID_TOPIC_EXCEPTION",
    );
    let listed = broker.ok(&["topic", "list"], "");
    assert!(listed.lines().any(|l| l == "events"), "{listed}");
    let listed = broker.ok(&["topic", "list", "--exclude-internal"], "");
    assert_eq!(listed.lines().collect::<Vec<_>>(), vec!["events"]);

    let described = broker.run(&["topic", "describe", "events"], "");
    assert!(described.success, "{}", described.stderr);
    let lines: Vec<&str> = described.stdout.lines().collect();
    assert_eq!(lines.len(), 4, "{}", described.stdout);
    assert!(
        lines[0].starts_with("Topic: events\tTopicId: "),
        "{}",
        lines[0]
    );
    assert!(
        lines[0].contains("\tPartitionCount: 3\tReplicationFactor: 1"),
        "{}",
        lines[0]
    );
    for (p, line) in lines[1..].iter().enumerate() {
        assert_eq!(
            *line,
            format!("\tTopic: events\tPartition: {p}\tLeader: 1\tReplicas: 1\tIsr: 1")
        );
    }
    if has(ApiKey::DescribeConfigs) {
        assert!(
            lines[0].ends_with("\tConfigs: cleanup.policy=delete,retention.ms=86400000"),
            "{}",
            lines[0]
        );
    } else {
        assert!(!lines[0].contains("Configs:"));
        assert!(
            described
                .stderr
                .contains("does not support DescribeConfigs"),
            "{}",
            described.stderr
        );
    }
    broker.fails(
        &["topic", "describe", "missing"],
        "",
        "topic \"missing\": UNKNOWN_TOPIC_OR_PARTITION",
    );

    // Produce 100 keyed lines with headers.
    let before = now_ms();
    let input: String = (0..100).map(|i| format!("key-{i}:value {i}\n")).collect();
    let produced = broker.ok(
        &[
            "produce",
            "events",
            "--key-separator",
            ":",
            "--header",
            "source=cli",
            "--header",
            "n=1",
        ],
        &input,
    );
    let after = now_ms();
    assert!(
        produced.starts_with("Produced 100 records to events in 3 partitions (acks=all)"),
        "{produced}"
    );
    let summary = parse_produce_summary(&produced);
    assert_eq!(summary.len(), 3, "{produced}");
    assert_eq!(summary.values().map(|s| s.0).sum::<u64>(), 100);
    for (count, first, last) in summary.values() {
        assert_eq!(*first, 0, "{produced}");
        assert_eq!(*last, *count as i64 - 1, "{produced}");
    }

    // Consume them back from the beginning.
    let consumed = broker.run(
        &["consume", "events", "--from-beginning", "--exit-at-end"],
        "",
    );
    assert!(consumed.success, "{}", consumed.stderr);
    assert!(
        consumed.stderr.contains("Consumed 100 records from events"),
        "{}",
        consumed.stderr
    );
    let records = parse_text(&consumed.stdout);
    assert_eq!(records.len(), 100, "{}", consumed.stdout);
    let mut by_partition: BTreeMap<i32, Vec<&Line>> = BTreeMap::new();
    let mut keys = BTreeSet::new();
    for r in &records {
        let i: u32 = r.key.strip_prefix("key-").unwrap().parse().unwrap();
        assert_eq!(r.value, format!("value {i}"), "{r:?}");
        assert_eq!(r.headers, "source=cli,n=1", "{r:?}");
        assert!(
            (before..=after).contains(&r.timestamp),
            "{r:?} not in {before}..={after}"
        );
        assert!(keys.insert(i), "key-{i} twice");
        by_partition.entry(r.partition).or_default().push(r);
    }
    assert_eq!(keys.len(), 100);
    for (p, lines) in &by_partition {
        let offsets: Vec<i64> = lines.iter().map(|l| l.offset).collect();
        let expected: Vec<i64> = (0..summary[p].0 as i64).collect();
        assert_eq!(offsets, expected, "partition {p}");
    }
    // Records of one key stay in one partition, so producing the same keys again puts each
    // next to its earlier copy; checked below with --from-timestamp.
    let partition_of: BTreeMap<String, i32> = records
        .iter()
        .map(|r| (r.key.clone(), r.partition))
        .collect();

    // The same as JSON.
    let json = broker.ok(
        &[
            "consume",
            "events",
            "--from-beginning",
            "--exit-at-end",
            "--format",
            "json",
        ],
        "",
    );
    let mut json_records = Vec::new();
    for line in json.lines() {
        let v: serde_json::Value = serde_json::from_str(line).expect("one JSON object a line");
        json_records.push(Line {
            partition: v["partition"].as_i64().unwrap() as i32,
            offset: v["offset"].as_i64().unwrap(),
            timestamp: v["timestamp"].as_i64().unwrap(),
            key: v["key"].as_str().unwrap().to_string(),
            headers: v["headers"]
                .as_array()
                .unwrap()
                .iter()
                .map(|h| {
                    format!(
                        "{}={}",
                        h["key"].as_str().unwrap(),
                        h["value"].as_str().unwrap()
                    )
                })
                .collect::<Vec<_>>()
                .join(","),
            value: v["value"].as_str().unwrap().to_string(),
        });
        assert_eq!(v["topic"], "events");
        assert_eq!(v["timestamp_type"], "CreateTime");
    }
    assert_eq!(json_records, records);

    // From an offset, in one partition.
    let (&p, &(count, _, _)) = summary
        .iter()
        .find(|(_, s)| s.0 >= 5)
        .expect("a partition with 5 records");
    let from_offset = broker.ok(
        &[
            "consume",
            "events",
            "--partition",
            &p.to_string(),
            "--offset",
            "3",
            "--exit-at-end",
        ],
        "",
    );
    let lines = parse_text(&from_offset);
    assert_eq!(
        lines.iter().map(|l| l.offset).collect::<Vec<_>>(),
        (3..count as i64).collect::<Vec<_>>()
    );
    assert!(lines.iter().all(|l| l.partition == p));
    assert_eq!(
        lines,
        by_partition[&p][3..]
            .iter()
            .map(|l| (*l).clone())
            .collect::<Vec<_>>()
    );
    broker.fails(
        &[
            "consume",
            "events",
            "--partition",
            "0",
            "--offset",
            "100000",
        ],
        "",
        "OFFSET_OUT_OF_RANGE",
    );
    broker.fails(
        &["consume", "events", "--partition", "9", "--from-beginning"],
        "",
        "there is no partition 9",
    );

    // --count stops early; --from-latest with --exit-at-end has nothing to print.
    let five = broker.ok(
        &["consume", "events", "--from-beginning", "--count", "5"],
        "",
    );
    assert_eq!(parse_text(&five).len(), 5);
    let latest = broker.run(&["consume", "events", "--from-latest", "--exit-at-end"], "");
    assert!(
        latest.success && latest.stdout.is_empty(),
        "{}",
        latest.stdout
    );

    // From a timestamp: only what was produced after it.
    std::thread::sleep(Duration::from_millis(20));
    let middle = now_ms();
    std::thread::sleep(Duration::from_millis(20));
    let late: String = (0..10).map(|i| format!("key-{i}:late {i}\n")).collect();
    let produced_late = broker.ok(&["produce", "events", "--key-separator", ":"], &late);
    assert!(
        produced_late.starts_with("Produced 10 records to events"),
        "{produced_late}"
    );
    let since = broker.ok(
        &[
            "consume",
            "events",
            "--from-timestamp",
            &middle.to_string(),
            "--exit-at-end",
        ],
        "",
    );
    let lines = parse_text(&since);
    let mut values: Vec<&str> = lines.iter().map(|l| l.value.as_str()).collect();
    values.sort_unstable();
    let mut expected: Vec<String> = (0..10).map(|i| format!("late {i}")).collect();
    expected.sort_unstable();
    assert_eq!(values, expected, "{since}");
    let mut next_offset: BTreeMap<i32, i64> =
        summary.iter().map(|(&p, s)| (p, s.0 as i64)).collect();
    for l in &lines {
        assert_eq!(
            partition_of[&l.key], l.partition,
            "{l:?}: same key, same partition"
        );
        let next = next_offset.get_mut(&l.partition).unwrap();
        assert_eq!(
            l.offset, *next,
            "{l:?}: offsets follow the first 100 records"
        );
        *next += 1;
        assert!(l.timestamp > middle && l.headers.is_empty(), "{l:?}");
    }

    // Cluster.
    let cluster = broker.ok(&["cluster"], "");
    assert!(cluster.contains("Cluster ID: "), "{cluster}");
    assert!(cluster.contains("Controller: 1"), "{cluster}");
    assert!(
        cluster.contains(&format!("  1\t127.0.0.1:{}\t(controller)", broker.port)),
        "{cluster}"
    );
    // Topic and partition counts include internal topics; compare with `topic describe`.
    let all = broker.ok(&["topic", "describe"], "");
    let topic_lines: Vec<&str> = all.lines().filter(|l| l.starts_with("Topic: ")).collect();
    let partition_lines = all.lines().filter(|l| l.starts_with("\tTopic: ")).count();
    assert!(
        topic_lines.iter().any(|l| l.starts_with("Topic: events\t")),
        "{all}"
    );
    assert!(
        cluster.contains(&format!(
            "Topics: {} ({partition_lines} partitions)",
            topic_lines.len()
        )),
        "{cluster}\n{all}"
    );
    assert!(cluster.contains(&format!("ApiVersions of 127.0.0.1:{}:", broker.port)));
    assert!(cluster.contains("  Produce(0): "), "{cluster}");
    assert!(cluster.contains("  Fetch(1): "), "{cluster}");
    let listed_apis = cluster
        .lines()
        .filter(|l| l.starts_with("  ") && l.contains("): "))
        .count();
    assert_eq!(listed_apis, apis.len(), "{cluster}");

    // Config changes.
    let alter = [
        "topic",
        "alter-config",
        "events",
        "--set",
        "retention.ms=3600000",
        "--delete",
        "cleanup.policy",
    ];
    if has(ApiKey::IncrementalAlterConfigs) {
        let out = broker.ok(&alter, "");
        assert!(out.contains("Updated topic events"), "{out}");
        if has(ApiKey::DescribeConfigs) {
            let described = broker.ok(&["topic", "describe", "events"], "");
            let first = described.lines().next().unwrap();
            assert!(
                first.ends_with("\tConfigs: retention.ms=3600000"),
                "{first}"
            );
        }
        broker.fails(
            &[
                "topic",
                "alter-config",
                "events",
                "--set",
                "no.such.config=1",
            ],
            "",
            "INVALID_CONFIG",
        );
    } else {
        broker.fails(&alter, "", "does not support IncrementalAlterConfigs");
    }

    // Deletion.
    if has(ApiKey::DeleteTopics) {
        let out = broker.ok(&["topic", "delete", "events"], "");
        assert!(out.contains("Deleted topic events"), "{out}");
        let listed = broker.ok(&["topic", "list", "--exclude-internal"], "");
        assert!(listed.is_empty(), "{listed}");
        broker.fails(
            &["topic", "delete", "events"],
            "",
            "UNKNOWN_TOPIC_OR_PARTITION",
        );
        broker.fails(
            &["consume", "events", "--from-beginning", "--exit-at-end"],
            "",
            "UNKNOWN_TOPIC_OR_PARTITION",
        );
    } else {
        broker.fails(
            &["topic", "delete", "events"],
            "",
            "the broker at 127.0.0.1:",
        );
        broker.fails(
            &["topic", "delete", "events"],
            "",
            "does not support DeleteTopics",
        );
    }
}

/// A broker that speaks only ApiVersions and Metadata: every other subcommand must say clearly
/// that the API is missing, and `topic describe` must do without DescribeConfigs.
#[test]
fn subcommands_say_which_api_the_broker_lacks() {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    std::thread::spawn(move || {
        for stream in listener.incoming() {
            let Ok(stream) = stream else { continue };
            std::thread::spawn(move || serve_minimal(stream, port));
        }
    });
    let dir = tempfile::tempdir().unwrap();
    let address = format!("127.0.0.1:{port}");
    let run = |args: &[&str]| run_sluice(dir.path(), args, &["--bootstrap-server", &address], "");
    for (args, api) in [
        (&["topic", "delete", "t"][..], "DeleteTopics"),
        (
            &["topic", "alter-config", "t", "--set", "retention.ms=1"],
            "IncrementalAlterConfigs",
        ),
        (
            &["topic", "create", "u", "--partitions", "1"],
            "CreateTopics",
        ),
        (&["produce", "t"], "Produce"),
        (&["consume", "t", "--from-beginning"], "Fetch"),
    ] {
        let out = run(args);
        assert!(!out.success, "sluice {args:?} should fail");
        let expected = format!("error: the broker at {address} does not support {api}");
        assert!(
            out.stderr.starts_with(&expected),
            "sluice {args:?}: {}",
            out.stderr
        );
    }
    let described = run(&["topic", "describe", "t"]);
    assert!(described.success, "{}", described.stderr);
    assert_eq!(
        described.stdout,
        "Topic: t\tPartitionCount: 1\tReplicationFactor: 1\n\
         \tTopic: t\tPartition: 0\tLeader: 1\tReplicas: 1\tIsr: 1\n"
    );
    assert!(
        described
            .stderr
            .contains("does not support DescribeConfigs; topic configs are not shown"),
        "{}",
        described.stderr
    );
    let cluster = run(&["cluster"]);
    assert!(cluster.success, "{}", cluster.stderr);
    assert!(
        cluster
            .stdout
            .contains("  Metadata(3): 0 to 12 [usable: 12]"),
        "{}",
        cluster.stdout
    );
}

/// Answers ApiVersions and Metadata on one connection until it closes.
fn serve_minimal(mut stream: TcpStream, port: u16) {
    use kafka_protocol::messages::api_versions_response::ApiVersion;
    use kafka_protocol::messages::metadata_response::{
        MetadataResponseBroker, MetadataResponsePartition, MetadataResponseTopic,
    };
    use kafka_protocol::messages::{
        BrokerId, MetadataResponse, ResponseHeader, ResponseKind, TopicName,
    };
    use kafka_protocol::protocol::StrBytes;
    loop {
        let mut size = [0u8; 4];
        if stream.read_exact(&mut size).is_err() {
            return;
        }
        let mut body = vec![0u8; u32::from_be_bytes(size) as usize];
        stream.read_exact(&mut body).unwrap();
        let key = ApiKey::try_from(i16::from_be_bytes([body[0], body[1]])).unwrap();
        let version = i16::from_be_bytes([body[2], body[3]]);
        let mut body = Bytes::from(body);
        let header = RequestHeader::decode(&mut body, key.request_header_version(version)).unwrap();
        let response = match key {
            ApiKey::ApiVersions => {
                ResponseKind::ApiVersions(ApiVersionsResponse::default().with_api_keys(vec![
                    ApiVersion::default()
                        .with_api_key(ApiKey::ApiVersions as i16)
                        .with_min_version(0)
                        .with_max_version(3),
                    ApiVersion::default()
                        .with_api_key(ApiKey::Metadata as i16)
                        .with_min_version(0)
                        .with_max_version(12),
                ]))
            }
            ApiKey::Metadata => ResponseKind::Metadata(
                MetadataResponse::default()
                    .with_brokers(vec![MetadataResponseBroker::default()
                        .with_node_id(BrokerId(1))
                        .with_host(StrBytes::from_static_str("127.0.0.1"))
                        .with_port(port as i32)])
                    .with_controller_id(BrokerId(1))
                    .with_topics(vec![MetadataResponseTopic::default()
                        .with_name(Some(TopicName(StrBytes::from_static_str("t"))))
                        .with_partitions(vec![MetadataResponsePartition::default()
                            .with_partition_index(0)
                            .with_leader_id(BrokerId(1))
                            .with_replica_nodes(vec![BrokerId(1)])
                            .with_isr_nodes(vec![BrokerId(1)])])]),
            ),
            // Anything else closes the connection, as Kafka does for an unknown request.
            _ => return,
        };
        let mut frame = BytesMut::new();
        frame.extend_from_slice(&[0; 4]);
        ResponseHeader::default()
            .with_correlation_id(header.correlation_id)
            .encode(&mut frame, key.response_header_version(version))
            .unwrap();
        response.encode(&mut frame, version).unwrap();
        let size = (frame.len() - 4) as u32;
        frame[..4].copy_from_slice(&size.to_be_bytes());
        if stream.write_all(&frame).is_err() {
            return;
        }
    }
}
