//! A ShareFetch that acknowledges records of a partition and forgets that partition in the same
//! request (KIP-932: a member whose assignment moved sends the last acknowledgements with the
//! forget). The acknowledgements are applied and answered for that partition, it is not fetched
//! from, and the accepted records never come back, not even after their acquisition lock would
//! have run out.

mod common;

use std::net::TcpStream;
use std::time::{Duration, Instant};

use kafka_protocol::messages::incremental_alter_configs_request::{
    AlterConfigsResource, AlterableConfig,
};
use kafka_protocol::messages::share_fetch_request::{
    AcknowledgementBatch, FetchPartition, FetchTopic, ForgottenTopic,
};
use kafka_protocol::messages::share_fetch_response::PartitionData;
use kafka_protocol::messages::{
    ApiKey, GroupId, IncrementalAlterConfigsRequest, IncrementalAlterConfigsResponse,
    ShareFetchRequest, ShareFetchResponse, ShareGroupHeartbeatRequest, ShareGroupHeartbeatResponse,
    TopicName,
};
use kafka_protocol::protocol::StrBytes;

use common::{connect, request, Broker};

const TOPIC: &str = "share-forget";
const GROUP: &str = "share-forget-group";
const MEMBER: &str = "member-forgetting-0000000001";
/// ShareFetch and ShareGroupHeartbeat version 1 (Kafka 4.1's).
const VERSION: i16 = 1;
const ACCEPT: i8 = 1;

struct Member {
    stream: TcpStream,
    epoch: i32,
}

impl Member {
    /// One ShareFetch at the session's next epoch.
    fn fetch(
        &mut self,
        topics: Vec<FetchTopic>,
        forgotten: Vec<ForgottenTopic>,
    ) -> ShareFetchResponse {
        let r: ShareFetchResponse = request(
            &mut self.stream,
            ApiKey::ShareFetch,
            VERSION,
            &ShareFetchRequest::default()
                .with_group_id(Some(GroupId(StrBytes::from_static_str(GROUP))))
                .with_member_id(Some(StrBytes::from_static_str(MEMBER)))
                .with_share_session_epoch(self.epoch)
                .with_max_wait_ms(300)
                .with_min_bytes(1)
                .with_max_bytes(1 << 20)
                .with_max_records(100)
                .with_batch_size(100)
                .with_topics(topics)
                .with_forgotten_topics_data(forgotten),
        );
        assert_eq!(r.error_code, 0, "ShareFetch at epoch {}: {r:?}", self.epoch);
        self.epoch += 1;
        r
    }
}

fn partition(r: &ShareFetchResponse, topic_id: uuid::Uuid) -> Option<&PartitionData> {
    r.responses
        .iter()
        .filter(|t| t.topic_id == topic_id)
        .flat_map(|t| &t.partitions)
        .find(|p| p.partition_index == 0)
}

fn acquired(r: &ShareFetchResponse, topic_id: uuid::Uuid) -> Vec<(i64, i64, i16)> {
    partition(r, topic_id)
        .map(|p| {
            p.acquired_records
                .iter()
                .map(|a| (a.first_offset, a.last_offset, a.delivery_count))
                .collect()
        })
        .unwrap_or_default()
}

fn wants(topic_id: uuid::Uuid, acks: Vec<AcknowledgementBatch>) -> Vec<FetchTopic> {
    vec![FetchTopic::default()
        .with_topic_id(topic_id)
        .with_partitions(vec![FetchPartition::default()
            .with_partition_index(0)
            .with_acknowledgement_batches(acks)])]
}

#[test]
fn acknowledgements_of_a_partition_the_same_request_forgets_are_applied() {
    let broker = Broker::start_with(&[
        "--override",
        "group.share.min.record.lock.duration.ms=1000",
        "--override",
        "group.share.record.lock.duration.ms=1000",
    ]);
    broker.create_topic(TOPIC, 1);
    let mut stream = connect(broker.port);

    // Join the share group; its assignment names the topic's id.
    let deadline = Instant::now() + Duration::from_secs(20);
    let mut member_epoch = 0;
    let topic_id = loop {
        let r: ShareGroupHeartbeatResponse = request(
            &mut stream,
            ApiKey::ShareGroupHeartbeat,
            VERSION,
            &ShareGroupHeartbeatRequest::default()
                .with_group_id(GroupId(StrBytes::from_static_str(GROUP)))
                .with_member_id(StrBytes::from_static_str(MEMBER))
                .with_member_epoch(member_epoch)
                .with_subscribed_topic_names(Some(vec![TopicName(StrBytes::from_static_str(
                    TOPIC,
                ))])),
        );
        assert_eq!(r.error_code, 0, "{r:?}");
        member_epoch = r.member_epoch;
        if let Some(id) = r
            .assignment
            .as_ref()
            .and_then(|a| a.topic_partitions.first())
            .map(|t| t.topic_id)
        {
            break id;
        }
        assert!(Instant::now() < deadline, "no assignment: {r:?}");
        std::thread::sleep(Duration::from_millis(200));
    };

    // Five records, read from the start (the group's `share.auto.offset.reset`), acquired.
    let r: IncrementalAlterConfigsResponse = request(
        &mut stream,
        ApiKey::IncrementalAlterConfigs,
        1,
        &IncrementalAlterConfigsRequest::default().with_resources(vec![
            AlterConfigsResource::default()
                .with_resource_type(32) // GROUP
                .with_resource_name(StrBytes::from_static_str(GROUP))
                .with_configs(vec![AlterableConfig::default()
                    .with_name(StrBytes::from_static_str("share.auto.offset.reset"))
                    .with_config_operation(0) // SET
                    .with_value(Some(StrBytes::from_static_str("earliest")))]),
        ]),
    );
    assert!(r.responses.iter().all(|r| r.error_code == 0), "{r:?}");
    broker.ok(&["produce", TOPIC], "a\nb\nc\nd\ne\n");
    let mut member = Member { stream, epoch: 0 };
    let mut got = acquired(
        &member.fetch(wants(topic_id, Vec::new()), Vec::new()),
        topic_id,
    );
    let deadline = Instant::now() + Duration::from_secs(20);
    while got.iter().map(|(f, l, _)| l - f + 1).sum::<i64>() < 5 {
        assert!(Instant::now() < deadline, "acquired only {got:?}");
        got.extend(acquired(&member.fetch(Vec::new(), Vec::new()), topic_id));
    }
    assert_eq!(got, vec![(0, 4, 1)], "the five records, delivered once");

    // Accept all five and forget the partition, in one request.
    let r = member.fetch(
        wants(
            topic_id,
            vec![AcknowledgementBatch::default()
                .with_first_offset(0)
                .with_last_offset(4)
                .with_acknowledge_types(vec![ACCEPT])],
        ),
        vec![ForgottenTopic::default()
            .with_topic_id(topic_id)
            .with_partitions(vec![0])],
    );
    let p = partition(&r, topic_id).expect("the acknowledged partition is answered");
    assert_eq!(p.acknowledge_error_code, 0, "{p:?}");
    assert!(
        p.acquired_records.is_empty(),
        "nothing fetched from a forgotten partition: {p:?}"
    );

    // Past the 1 s acquisition lock, the partition back in the session: the next acquisition is
    // the new record alone (an unapplied ACCEPT would leave 0-4 available again by now).
    std::thread::sleep(Duration::from_millis(1500));
    broker.ok(&["produce", TOPIC], "f\n");
    let mut later = acquired(
        &member.fetch(wants(topic_id, Vec::new()), Vec::new()),
        topic_id,
    );
    let deadline = Instant::now() + Duration::from_secs(5);
    while later.is_empty() && Instant::now() < deadline {
        later.extend(acquired(&member.fetch(Vec::new(), Vec::new()), topic_id));
    }
    assert_eq!(later, vec![(5, 5, 1)], "accepted records came back");
}
