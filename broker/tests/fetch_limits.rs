//! The broker's `fetch.max.bytes` bounds a fetch response whatever the client asks, partitions
//! left out still report their offsets, and a fetch session moves partitions that returned
//! records to its back, so a consumer with a backlog on every partition is served round robin.

mod common;

use std::collections::BTreeMap;
use std::net::TcpStream;

use common::{request, Broker};
use kafka_protocol::messages::fetch_request::{FetchPartition, FetchTopic};
use kafka_protocol::messages::{ApiKey, BrokerId, FetchRequest, FetchResponse, TopicName};
use kafka_protocol::protocol::StrBytes;

const TOPIC: &str = "backlog";
const PARTITIONS: i32 = 4;
/// Each partition holds more than a response may carry.
const PER_PARTITION: usize = 1_500;
const VALUE_BYTES: usize = 2_000;
const FETCH_MAX: usize = 1 << 20;

/// Fetch v12: topic names, sessions (KIP-227).
const VERSION: i16 = 12;

fn fetch(stream: &mut TcpStream, session: (i32, i32), offsets: &[(i32, i64)]) -> FetchResponse {
    let partitions = offsets
        .iter()
        .map(|&(p, offset)| {
            FetchPartition::default()
                .with_partition(p)
                .with_fetch_offset(offset)
                .with_partition_max_bytes(1 << 20)
        })
        .collect();
    let req = FetchRequest::default()
        .with_replica_id(BrokerId(-1))
        .with_max_wait_ms(100)
        .with_min_bytes(1)
        // The client asks for 50 MiB, as librdkafka and the Java client do by default.
        .with_max_bytes(50 << 20)
        .with_session_id(session.0)
        .with_session_epoch(session.1)
        .with_topics(vec![FetchTopic::default()
            .with_topic(TopicName(StrBytes::from_static_str(TOPIC)))
            .with_partitions(partitions)]);
    request(stream, ApiKey::Fetch, VERSION, &req)
}

/// (partition, records bytes, high watermark) of every partition in the response.
fn partitions(response: &FetchResponse) -> Vec<(i32, usize, i64)> {
    assert_eq!(response.error_code, 0);
    response
        .responses
        .iter()
        .flat_map(|t| t.partitions.iter())
        .map(|p| {
            assert_eq!(p.error_code, 0, "partition {}", p.partition_index);
            let len = p.records.as_ref().map_or(0, |r| r.len());
            (p.partition_index, len, p.high_watermark)
        })
        .collect()
}

/// The offset after the last record of the batches in `records`.
fn next_offset(records: &[u8]) -> i64 {
    let (mut at, mut next) = (0usize, -1i64);
    while at + 61 <= records.len() {
        let base = i64::from_be_bytes(records[at..at + 8].try_into().unwrap());
        let length = i32::from_be_bytes(records[at + 8..at + 12].try_into().unwrap()) as usize;
        let last_delta = i32::from_be_bytes(records[at + 23..at + 27].try_into().unwrap());
        if at + 12 + length > records.len() {
            break;
        }
        next = base + last_delta as i64 + 1;
        at += 12 + length;
    }
    assert!(next >= 0, "no whole batch in {} bytes", records.len());
    next
}

#[test]
fn responses_stay_under_fetch_max_bytes_and_sessions_serve_every_partition_in_turn() {
    let broker = Broker::start_with(&["--fetch-max-bytes", &FETCH_MAX.to_string()]);
    broker.create_topic(TOPIC, PARTITIONS);
    let value = "v".repeat(VALUE_BYTES);
    for p in 0..PARTITIONS {
        let lines: String = (0..PER_PARTITION).map(|_| format!("{value}\n")).collect();
        broker.ok(&["produce", TOPIC, "--partition", &p.to_string()], &lines);
    }
    let mut stream = TcpStream::connect(broker.address()).unwrap();
    let mut offsets: BTreeMap<i32, i64> = (0..PARTITIONS).map(|p| (p, 0)).collect();

    // A full fetch that opens a session: one response's worth of records, every partition
    // listed with its true high watermark.
    let first = fetch(
        &mut stream,
        (0, 0),
        &offsets.iter().map(|(&p, &o)| (p, o)).collect::<Vec<_>>(),
    );
    let session = first.session_id;
    assert!(session > 0, "no fetch session");
    let listed = partitions(&first);
    assert_eq!(listed.len(), PARTITIONS as usize);
    let total: usize = listed.iter().map(|&(_, len, _)| len).sum();
    assert!(total > 0);
    assert!(
        total <= FETCH_MAX,
        "{total} bytes in a response limited to {FETCH_MAX}"
    );
    for &(p, _, hw) in &listed {
        assert_eq!(hw, PER_PARTITION as i64, "partition {p}'s high watermark");
    }
    let served_first: Vec<i32> = listed
        .iter()
        .filter(|&&(_, len, _)| len > 0)
        .map(|&(p, _, _)| p)
        .collect();
    assert!(
        served_first.len() < PARTITIONS as usize,
        "one response carried every partition: the limit did not apply"
    );
    let records_of = |r: &FetchResponse, p: i32| {
        r.responses
            .iter()
            .flat_map(|t| t.partitions.iter())
            .find(|x| x.partition_index == p)
            .and_then(|x| x.records.clone())
            .unwrap_or_default()
    };
    for &p in &served_first {
        offsets.insert(p, next_offset(&records_of(&first, p)));
    }

    // Incremental fetches, sending only the partitions whose position moved: partitions that
    // got records go to the back of the session, so within a few responses every partition has
    // been served, well before any is drained.
    let mut served: Vec<i32> = served_first.clone();
    let mut moved = served_first;
    for epoch in 1..=PARTITIONS * 2 {
        let changed: Vec<(i32, i64)> = moved.iter().map(|&p| (p, offsets[&p])).collect();
        let r = fetch(&mut stream, (session, epoch), &changed);
        let listed = partitions(&r);
        let total: usize = listed.iter().map(|&(_, len, _)| len).sum();
        assert!(total > 0 && total <= FETCH_MAX, "response of {total} bytes");
        moved = listed
            .iter()
            .filter(|&&(_, len, _)| len > 0)
            .map(|&(p, _, _)| p)
            .collect();
        for &p in &moved {
            offsets.insert(p, next_offset(&records_of(&r, p)));
            if !served.contains(&p) {
                served.push(p);
            }
        }
        if served.len() == PARTITIONS as usize {
            break;
        }
    }
    served.sort();
    assert_eq!(
        served,
        (0..PARTITIONS).collect::<Vec<_>>(),
        "partitions never served while others had a backlog; positions {offsets:?}"
    );
    assert!(
        offsets.values().all(|&o| o < PER_PARTITION as i64),
        "a partition was drained before every partition was served: {offsets:?}"
    );
}
