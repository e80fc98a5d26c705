//! Partitions are spread over the shards (cores) and keep their owner across restarts.

use std::net::TcpStream;

use kafka_protocol::messages::create_topics_request::CreatableTopic;
use kafka_protocol::messages::{ApiKey, CreateTopicsRequest, CreateTopicsResponse, TopicName};
use kafka_protocol::protocol::StrBytes;

mod common;

use common::{request, Broker};

fn owners(dir: &std::path::Path, topic: &str) -> Vec<u64> {
    let text = std::fs::read_to_string(dir.join(".sluice-metadata.json")).unwrap();
    let json: serde_json::Value = serde_json::from_str(&text).unwrap();
    json["topics"][topic]["shards"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_u64().unwrap())
        .collect()
}

#[test]
fn partitions_are_spread_over_shards_and_keep_their_owner() {
    let mut broker = Broker::start();
    let create = CreateTopicsRequest::default()
        .with_timeout_ms(5000)
        .with_topics(vec![CreatableTopic::default()
            .with_name(TopicName(StrBytes::from_static_str("spread")))
            .with_num_partitions(4)
            .with_replication_factor(1)]);
    let mut s = TcpStream::connect(("127.0.0.1", broker.port)).unwrap();
    let created: CreateTopicsResponse = request(&mut s, ApiKey::CreateTopics, 7, &create);
    assert_eq!(created.topics[0].error_code, 0);
    let before = owners(&broker.data_dir(), "spread");
    assert_eq!(before.len(), 4);
    assert!(
        before.contains(&0) && before.contains(&1),
        "4 partitions on 2 shards must use both: {before:?}"
    );
    // The connection stays open across the restart, as a client's would.
    assert!(
        broker.stop().is_some_and(|s| s.success()),
        "broker did not exit cleanly"
    );
    broker.start_again();
    assert!(
        broker.stop().is_some_and(|s| s.success()),
        "broker did not exit cleanly"
    );
    assert_eq!(
        owners(&broker.data_dir(), "spread"),
        before,
        "placement changed across a restart"
    );
    drop(s);
}
