//! Hostile and broken input against the real `sluice` binary: every case gets the error code
//! Apache Kafka would return or a closed connection, and a well-behaved client on another
//! connection keeps being served throughout.

use std::io::{Read, Write};
use std::net::{Shutdown, TcpStream};

use bytes::Bytes;
use kafka_protocol::messages::produce_request::{PartitionProduceData, TopicProduceData};
use kafka_protocol::messages::{
    ApiKey, CreateTopicsRequest, ProduceRequest, ProduceResponse, ResponseHeader, TopicName,
};
use kafka_protocol::protocol::{Decodable, StrBytes};
use sluice_engine::batch::{compute_crc, simple_batch};
use sluice_engine::Timestamp;

mod common;

use common::{connect, frame, read_frame, Broker};

/// True when the broker closed the connection (EOF or reset); a read timeout is not a close.
fn closed(s: &mut TcpStream) -> bool {
    let mut b = [0u8; 1];
    match s.read(&mut b) {
        Ok(0) => true,
        Ok(_) => false,
        Err(e) => matches!(
            e.kind(),
            std::io::ErrorKind::ConnectionReset | std::io::ErrorKind::ConnectionAborted
        ),
    }
}

fn produce(s: &mut TcpStream, topic: &str, records: Bytes, correlation_id: i32) -> ProduceResponse {
    let request = ProduceRequest::default()
        .with_acks(-1)
        .with_timeout_ms(5000)
        .with_topic_data(vec![TopicProduceData::default()
            .with_name(TopicName(StrBytes::from_string(topic.to_string())))
            .with_partition_data(vec![PartitionProduceData::default()
                .with_index(0)
                .with_records(Some(records))])]);
    s.write_all(&frame(ApiKey::Produce, 9, correlation_id, &request))
        .unwrap();
    let mut body = read_frame(s).expect("produce response");
    let header =
        ResponseHeader::decode(&mut body, ApiKey::Produce.response_header_version(9)).unwrap();
    assert_eq!(header.correlation_id, correlation_id);
    ProduceResponse::decode(&mut body, 9).unwrap()
}

fn produce_error(s: &mut TcpStream, topic: &str, records: Bytes, correlation_id: i32) -> i16 {
    produce(s, topic, records, correlation_id).responses[0].partition_responses[0].error_code
}

fn create_topic(port: u16, name: &str) {
    let mut s = connect(port);
    let request = CreateTopicsRequest::default()
        .with_timeout_ms(5000)
        .with_topics(vec![
            kafka_protocol::messages::create_topics_request::CreatableTopic::default()
                .with_name(TopicName(StrBytes::from_string(name.to_string())))
                .with_num_partitions(1)
                .with_replication_factor(1),
        ]);
    s.write_all(&frame(ApiKey::CreateTopics, 7, 1, &request))
        .unwrap();
    assert!(read_frame(&mut s).is_some());
}

#[test]
fn hostile_frames_and_batches_get_kafka_errors_or_a_closed_connection() {
    let broker = Broker::start();
    create_topic(broker.port, "victim");
    // A well-behaved client that must keep working throughout.
    let mut good = connect(broker.port);
    let mut correlation = 100;
    let mut good_produce = |good: &mut TcpStream| {
        correlation += 1;
        let r = produce(
            good,
            "victim",
            simple_batch(&[(Some(b"k"), Some(b"v"))], Timestamp(1)),
            correlation,
        );
        assert_eq!(
            r.responses[0].partition_responses[0].error_code, 0,
            "the good client was hurt"
        );
    };
    good_produce(&mut good);

    // Negative and 2 GiB size prefixes: closed, nothing allocated.
    for size in [-1i32, i32::MAX, 0x7fff_fff0] {
        let mut s = connect(broker.port);
        s.write_all(&size.to_be_bytes()).unwrap();
        assert!(closed(&mut s), "size {size} did not close the connection");
        good_produce(&mut good);
    }

    // Unknown API key, unsupported version of a known API, a body shorter than a header.
    let mut s = connect(broker.port);
    let mut unknown = frame(
        ApiKey::Metadata,
        12,
        7,
        &kafka_protocol::messages::MetadataRequest::default(),
    );
    unknown[4..6].copy_from_slice(&999i16.to_be_bytes());
    s.write_all(&unknown).unwrap();
    assert!(closed(&mut s), "unknown API key");
    let mut s = connect(broker.port);
    let mut unsupported = frame(
        ApiKey::Metadata,
        12,
        7,
        &kafka_protocol::messages::MetadataRequest::default(),
    );
    unsupported[6..8].copy_from_slice(&99i16.to_be_bytes());
    s.write_all(&unsupported).unwrap();
    assert!(closed(&mut s), "unsupported Metadata version");
    let mut s = connect(broker.port);
    s.write_all(&[0, 0, 0, 3, 0, 3, 0]).unwrap();
    assert!(closed(&mut s), "truncated header");
    good_produce(&mut good);

    // ApiVersions at an unknown version answers v0 with UNSUPPORTED_VERSION (KIP-511).
    let mut s = connect(broker.port);
    s.write_all(
        &frame(
            ApiKey::ApiVersions,
            0,
            42,
            &kafka_protocol::messages::ApiVersionsRequest::default(),
        )[..],
    )
    .unwrap();
    let mut body = read_frame(&mut s).unwrap();
    let _ = ResponseHeader::decode(&mut body, 0).unwrap();
    let v0 = kafka_protocol::messages::ApiVersionsResponse::decode(&mut body, 0).unwrap();
    assert_eq!(v0.error_code, 0);
    let mut bad_version = frame(
        ApiKey::ApiVersions,
        0,
        43,
        &kafka_protocol::messages::ApiVersionsRequest::default(),
    );
    bad_version[6..8].copy_from_slice(&77i16.to_be_bytes());
    s.write_all(&bad_version).unwrap();
    let mut body = read_frame(&mut s).expect("ApiVersions answers even an unknown version");
    let header = ResponseHeader::decode(&mut body, 0).unwrap();
    assert_eq!(header.correlation_id, 43);
    let r = kafka_protocol::messages::ApiVersionsResponse::decode(&mut body, 0).unwrap();
    assert_eq!(r.error_code, 35, "UNSUPPORTED_VERSION");
    assert!(r
        .api_keys
        .iter()
        .any(|k| k.api_key == ApiKey::Produce as i16));

    // Garbage body for Produce: closed with a log line.
    let mut s = connect(broker.port);
    let mut garbage = frame(ApiKey::Produce, 9, 9, &ProduceRequest::default());
    garbage.truncate(20);
    garbage[0..4].copy_from_slice(&16u32.to_be_bytes());
    s.write_all(&garbage).unwrap();
    assert!(closed(&mut s), "garbage produce body");
    good_produce(&mut good);

    // Invalid record batches: Kafka's error codes, connection kept.
    let mut s = connect(broker.port);
    let batch = simple_batch(&[(Some(b"key"), Some(b"value"))], Timestamp(5)).to_vec();
    let mut bad_crc = batch.clone();
    let last = bad_crc.len() - 1;
    bad_crc[last] ^= 0xff;
    assert_eq!(
        produce_error(&mut s, "victim", Bytes::from(bad_crc), 1),
        2,
        "bad CRC → CORRUPT_MESSAGE"
    );
    let mut magic = batch.clone();
    magic[16] = 1;
    assert_ne!(
        produce_error(&mut s, "victim", Bytes::from(magic), 2),
        0,
        "magic 1 refused"
    );
    let mut lying = batch.clone();
    lying[8..12].copy_from_slice(&(batch.len() as i32 + 100).to_be_bytes());
    assert_eq!(
        produce_error(&mut s, "victim", Bytes::from(lying), 3),
        2,
        "lying length → CORRUPT_MESSAGE"
    );
    let mut count = batch.clone();
    count[57..61].copy_from_slice(&5i32.to_be_bytes());
    let crc = compute_crc(&count);
    count[17..21].copy_from_slice(&crc.to_be_bytes());
    assert_eq!(
        produce_error(&mut s, "victim", Bytes::from(count), 4),
        2,
        "record count lie → CORRUPT_MESSAGE"
    );
    assert_eq!(
        produce_error(&mut s, "victim", Bytes::from(batch[..30].to_vec()), 5),
        2,
        "truncated batch"
    );
    assert_eq!(
        produce_error(&mut s, "no-such-topic", Bytes::from(batch.clone()), 6),
        3,
        "UNKNOWN_TOPIC_OR_PARTITION"
    );
    // The same connection still works for a valid batch.
    assert_eq!(produce_error(&mut s, "victim", Bytes::from(batch), 7), 0);
    let _ = s.shutdown(Shutdown::Both);
    good_produce(&mut good);

    // 200 connections opened and abandoned mid-frame do not hurt the good client.
    let abandoned: Vec<TcpStream> = (0..200)
        .map(|_| {
            let mut s = connect(broker.port);
            s.write_all(&[0, 0, 1, 0, 0]).unwrap();
            s
        })
        .collect();
    good_produce(&mut good);
    drop(abandoned);
    good_produce(&mut good);
}
