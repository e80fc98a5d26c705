//! Produce v13 (KIP-516): topics named by id. A batch sent by topic id lands in that topic at
//! the offsets a v12 produce by name would give it, the response names the topic by id (and not
//! by name), a fetch reads the records back, and an id no topic has fails its partitions with
//! UNKNOWN_TOPIC_ID while the other topics of the same request are appended.

use kafka_protocol::messages::metadata_request::MetadataRequestTopic;
use kafka_protocol::messages::produce_request::{PartitionProduceData, TopicProduceData};
use kafka_protocol::messages::{
    ApiKey, FetchResponse, MetadataRequest, MetadataResponse, ProduceRequest, ProduceResponse,
    TopicName,
};
use kafka_protocol::protocol::StrBytes;
use sluice_engine::batch::{BatchBuilder, BatchHeader, NewRecord, Records};
use sluice_engine::Timestamp;

mod common;

use common::{connect, fetch_request, request, Broker};

const UNKNOWN_TOPIC_ID: i16 = 100;

fn batch(values: &[&str]) -> bytes::Bytes {
    let mut b = BatchBuilder::new();
    for v in values {
        b.push(&NewRecord {
            value: Some(v.as_bytes().to_vec()),
            timestamp: Timestamp(common::now_ms()),
            ..Default::default()
        });
    }
    b.build()
}

fn topic_data(name: &str, id: uuid::Uuid, values: &[&str]) -> TopicProduceData {
    TopicProduceData::default()
        .with_name(TopicName(StrBytes::from_string(name.to_string())))
        .with_topic_id(id)
        .with_partition_data(vec![PartitionProduceData::default()
            .with_index(0)
            .with_records(Some(batch(values)))])
}

#[test]
fn produce_v13_names_topics_by_id() {
    let broker = Broker::start();
    broker.create_topic("by-id", 1);
    let mut s = connect(broker.port);
    let md: MetadataResponse = request(
        &mut s,
        ApiKey::Metadata,
        12,
        &MetadataRequest::default().with_topics(Some(vec![MetadataRequestTopic::default()
            .with_name(Some(TopicName(StrBytes::from_static_str("by-id"))))])),
    );
    let id = md.topics[0].topic_id;
    assert!(!id.is_nil(), "Metadata v12 gives the topic id");

    // v12 by name first, then v13 by id: consecutive offsets in the same log.
    let r: ProduceResponse = request(
        &mut s,
        ApiKey::Produce,
        12,
        &ProduceRequest::default()
            .with_acks(-1)
            .with_timeout_ms(5000)
            .with_topic_data(vec![topic_data("by-id", uuid::Uuid::nil(), &["a", "b"])]),
    );
    assert_eq!(r.responses[0].partition_responses[0].error_code, 0);
    assert_eq!(r.responses[0].partition_responses[0].base_offset, 0);

    let unknown = uuid::Uuid::from_u128(0x5151);
    let r: ProduceResponse = request(
        &mut s,
        ApiKey::Produce,
        13,
        &ProduceRequest::default()
            .with_acks(-1)
            .with_timeout_ms(5000)
            .with_topic_data(vec![
                topic_data("", id, &["c", "d", "e"]),
                topic_data("", unknown, &["lost"]),
            ]),
    );
    assert_eq!(r.responses.len(), 2, "{r:?}");
    let ours = r
        .responses
        .iter()
        .find(|t| t.topic_id == id)
        .expect("by id");
    assert_eq!(ours.name.0.as_str(), "", "v13 answers by id, not by name");
    assert_eq!(ours.partition_responses[0].error_code, 0);
    assert_eq!(ours.partition_responses[0].base_offset, 2);
    let theirs = r
        .responses
        .iter()
        .find(|t| t.topic_id == unknown)
        .expect("the unknown id");
    assert_eq!(theirs.partition_responses[0].error_code, UNKNOWN_TOPIC_ID);

    let f: FetchResponse = request(
        &mut s,
        ApiKey::Fetch,
        12,
        &fetch_request("by-id", 0, 0, 1 << 20),
    );
    let records = f.responses[0].partitions[0]
        .records
        .clone()
        .expect("records");
    let mut values = Vec::new();
    let mut rest: &[u8] = &records;
    while !rest.is_empty() {
        let size = BatchHeader::parse(rest)
            .expect("a batch header")
            .total_size()
            .expect("a batch size");
        for r in Records::new(&rest[..size]) {
            let value = r.expect("a well-formed record").value.expect("a value");
            values.push(String::from_utf8(value.to_vec()).unwrap());
        }
        rest = &rest[size..];
    }
    assert_eq!(values, ["a", "b", "c", "d", "e"]);
}
