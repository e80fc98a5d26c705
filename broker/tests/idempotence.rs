//! Idempotent produce over the wire, deterministically: a retried batch (same producer id,
//! epoch and sequence) is answered with its original offsets and not appended again; a gap in
//! the sequence is OUT_OF_ORDER_SEQUENCE_NUMBER; an older epoch is INVALID_PRODUCER_EPOCH; and
//! the dedupe state survives a restart.

use std::net::TcpStream;
use std::time::Duration;

use bytes::Bytes;
use kafka_protocol::messages::create_topics_request::CreatableTopic;
use kafka_protocol::messages::produce_request::{PartitionProduceData, TopicProduceData};
use kafka_protocol::messages::{
    ApiKey, CreateTopicsRequest, CreateTopicsResponse, InitProducerIdRequest,
    InitProducerIdResponse, ProduceRequest, ProduceResponse, TopicName,
};
use kafka_protocol::protocol::StrBytes;
use sluice_engine::batch::{BatchBuilder, NewRecord};
use sluice_engine::Timestamp;

mod common;

use common::{request, Broker};

fn connect(broker: &Broker) -> TcpStream {
    let s = TcpStream::connect(("127.0.0.1", broker.port)).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    s
}

fn batch(pid: i64, epoch: i16, seq: i32, n: usize) -> Bytes {
    let mut b = BatchBuilder::new().producer(pid, epoch, seq);
    for i in 0..n {
        b.push(&NewRecord {
            value: Some(format!("{seq}-{i}").into_bytes()),
            timestamp: Timestamp(1),
            ..Default::default()
        });
    }
    b.build()
}

/// (error code, base offset)
fn produce(s: &mut TcpStream, records: Bytes) -> (i16, i64) {
    let produce = ProduceRequest::default()
        .with_acks(-1)
        .with_timeout_ms(5000)
        .with_topic_data(vec![TopicProduceData::default()
            .with_name(TopicName(StrBytes::from_static_str("idem")))
            .with_partition_data(vec![PartitionProduceData::default()
                .with_index(0)
                .with_records(Some(records))])]);
    let r: ProduceResponse = request(s, ApiKey::Produce, 9, &produce);
    let p = &r.responses[0].partition_responses[0];
    (p.error_code, p.base_offset)
}

#[test]
fn retried_batches_are_answered_with_their_first_offsets_across_restarts() {
    let mut broker = Broker::start();
    let mut s = connect(&broker);
    let create = CreateTopicsRequest::default()
        .with_timeout_ms(5000)
        .with_topics(vec![CreatableTopic::default()
            .with_name(TopicName(StrBytes::from_static_str("idem")))
            .with_num_partitions(1)
            .with_replication_factor(1)]);
    let created: CreateTopicsResponse = request(&mut s, ApiKey::CreateTopics, 7, &create);
    assert_eq!(created.topics[0].error_code, 0);
    let init: InitProducerIdResponse = request(
        &mut s,
        ApiKey::InitProducerId,
        4,
        &InitProducerIdRequest::default()
            .with_transactional_id(None)
            .with_transaction_timeout_ms(60_000),
    );
    assert_eq!(init.error_code, 0);
    let (pid, epoch) = (init.producer_id.0, init.producer_epoch);
    assert!(pid >= 0);

    assert_eq!(produce(&mut s, batch(pid, epoch, 0, 5)), (0, 0));
    assert_eq!(produce(&mut s, batch(pid, epoch, 5, 5)), (0, 5));
    // The retry of the second batch: same offsets, nothing appended.
    assert_eq!(produce(&mut s, batch(pid, epoch, 5, 5)), (0, 5));
    assert_eq!(
        produce(&mut s, batch(pid, epoch, 10, 1)),
        (0, 10),
        "a retry must not take offsets"
    );
    // A gap in the sequence, and an older epoch.
    assert_eq!(
        produce(&mut s, batch(pid, epoch, 20, 1)).0,
        45,
        "OUT_OF_ORDER_SEQUENCE_NUMBER"
    );
    if epoch > 0 {
        assert_eq!(
            produce(&mut s, batch(pid, epoch - 1, 11, 1)).0,
            47,
            "INVALID_PRODUCER_EPOCH"
        );
    }
    drop(s);

    // After a clean restart and after a kill -9, the retry is still recognised.
    assert!(
        broker.stop().is_some_and(|s| s.success()),
        "broker did not exit cleanly"
    );
    broker.start_again();
    let mut s = connect(&broker);
    assert_eq!(produce(&mut s, batch(pid, epoch, 10, 1)), (0, 10));
    assert_eq!(produce(&mut s, batch(pid, epoch, 11, 2)), (0, 11));
    drop(s);
    broker.kill();
    broker.start_again();
    let mut s = connect(&broker);
    assert_eq!(
        produce(&mut s, batch(pid, epoch, 11, 2)),
        (0, 11),
        "retry after kill -9 must not be appended again"
    );
    assert_eq!(produce(&mut s, batch(pid, epoch, 13, 1)), (0, 13));
    // A bumped epoch starts over at sequence 0.
    assert_eq!(produce(&mut s, batch(pid, epoch + 1, 0, 1)), (0, 14));
}
