//! Partitions are spread over the shards (cores) and keep their owner across restarts.

use std::net::TcpStream;

use kafka_protocol::messages::create_topics_request::CreatableTopic;
use kafka_protocol::messages::{ApiKey, CreateTopicsRequest, CreateTopicsResponse, TopicName};
use kafka_protocol::protocol::StrBytes;

mod common;

use common::{request, Broker};

/// The owner shard of each partition of `topic`, from the lines the broker logs as shards open
/// partitions (`opened partitions topic=.. shard=.. partitions=[..]`), the latest start's.
fn owners(log: &str, topic: &str) -> Vec<u64> {
    let mut owners = std::collections::BTreeMap::new();
    let start = log.rfind("starting sluice").unwrap_or(0);
    for line in log[start..]
        .lines()
        .filter(|l| l.contains("opened partitions"))
    {
        let field = |name: &str| {
            let at = line.find(&format!(" {name}="))? + name.len() + 2;
            let rest = &line[at..];
            let end = if rest.starts_with('[') {
                rest.find(']')? + 1
            } else {
                rest.find(' ').unwrap_or(rest.len())
            };
            Some(rest[..end].to_string())
        };
        if field("topic").as_deref() != Some(topic) {
            continue;
        }
        let shard: u64 = field("shard").unwrap().parse().unwrap();
        let list = field("partitions").unwrap();
        for p in list.trim_matches(|c| c == '[' || c == ']').split(", ") {
            owners.insert(p.parse::<u64>().unwrap(), shard);
        }
    }
    owners.into_values().collect()
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
    let before = owners(&broker.log_text(), "spread");
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
        owners(&broker.log_text(), "spread"),
        before,
        "placement changed across a restart"
    );
    drop(s);
}
