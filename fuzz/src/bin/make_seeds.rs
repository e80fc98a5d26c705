//! Writes the committed seed corpora (`fuzz/corpus/request_decode`, `fuzz/corpus/record_batch`):
//! real request frames for every API at its lowest and highest supported version, a few with
//! content (a produce with a batch, topics, partitions, group protocols), and record batches as
//! producers send them. Built with the targets; run from `fuzz/`:
//! `target/x86_64-unknown-linux-gnu/release/make_seeds`.

use std::path::Path;

use bytes::{Bytes, BytesMut};
use kafka_protocol::messages::*;
use kafka_protocol::protocol::{Encodable, StrBytes};
use sluice_broker::wire;
use sluice_engine::batch::{simple_batch, BatchBuilder, NewRecord};
use sluice_engine::Timestamp;

fn request(key: ApiKey) -> RequestKind {
    match key {
        ApiKey::Produce => RequestKind::Produce(ProduceRequest::default()),
        ApiKey::Fetch => RequestKind::Fetch(FetchRequest::default()),
        ApiKey::ListOffsets => RequestKind::ListOffsets(ListOffsetsRequest::default()),
        ApiKey::Metadata => RequestKind::Metadata(MetadataRequest::default()),
        ApiKey::ApiVersions => RequestKind::ApiVersions(ApiVersionsRequest::default()),
        ApiKey::CreateTopics => RequestKind::CreateTopics(CreateTopicsRequest::default()),
        ApiKey::DeleteTopics => RequestKind::DeleteTopics(DeleteTopicsRequest::default()),
        ApiKey::CreatePartitions => {
            RequestKind::CreatePartitions(CreatePartitionsRequest::default())
        }
        ApiKey::DescribeConfigs => RequestKind::DescribeConfigs(DescribeConfigsRequest::default()),
        ApiKey::AlterConfigs => RequestKind::AlterConfigs(AlterConfigsRequest::default()),
        ApiKey::IncrementalAlterConfigs => {
            RequestKind::IncrementalAlterConfigs(IncrementalAlterConfigsRequest::default())
        }
        ApiKey::DeleteRecords => RequestKind::DeleteRecords(DeleteRecordsRequest::default()),
        ApiKey::InitProducerId => RequestKind::InitProducerId(InitProducerIdRequest::default()),
        ApiKey::DescribeCluster => RequestKind::DescribeCluster(DescribeClusterRequest::default()),
        ApiKey::FindCoordinator => RequestKind::FindCoordinator(FindCoordinatorRequest::default()),
        ApiKey::JoinGroup => RequestKind::JoinGroup(JoinGroupRequest::default()),
        ApiKey::SyncGroup => RequestKind::SyncGroup(SyncGroupRequest::default()),
        ApiKey::Heartbeat => RequestKind::Heartbeat(HeartbeatRequest::default()),
        ApiKey::LeaveGroup => RequestKind::LeaveGroup(LeaveGroupRequest::default()),
        ApiKey::OffsetCommit => RequestKind::OffsetCommit(OffsetCommitRequest::default()),
        ApiKey::OffsetFetch => RequestKind::OffsetFetch(OffsetFetchRequest::default()),
        ApiKey::ListGroups => RequestKind::ListGroups(ListGroupsRequest::default()),
        ApiKey::DescribeGroups => RequestKind::DescribeGroups(DescribeGroupsRequest::default()),
        ApiKey::DeleteGroups => RequestKind::DeleteGroups(DeleteGroupsRequest::default()),
        ApiKey::OffsetDelete => RequestKind::OffsetDelete(OffsetDeleteRequest::default()),
        ApiKey::ConsumerGroupHeartbeat => {
            RequestKind::ConsumerGroupHeartbeat(ConsumerGroupHeartbeatRequest::default())
        }
        ApiKey::ConsumerGroupDescribe => {
            RequestKind::ConsumerGroupDescribe(ConsumerGroupDescribeRequest::default())
        }
        ApiKey::OffsetForLeaderEpoch => {
            RequestKind::OffsetForLeaderEpoch(OffsetForLeaderEpochRequest::default())
        }
        ApiKey::DescribeTopicPartitions => {
            RequestKind::DescribeTopicPartitions(DescribeTopicPartitionsRequest::default())
        }
        ApiKey::DescribeLogDirs => RequestKind::DescribeLogDirs(DescribeLogDirsRequest::default()),
        ApiKey::AlterReplicaLogDirs => {
            RequestKind::AlterReplicaLogDirs(AlterReplicaLogDirsRequest::default())
        }
        ApiKey::ListConfigResources => {
            RequestKind::ListConfigResources(ListConfigResourcesRequest::default())
        }
        ApiKey::DescribeProducers => {
            RequestKind::DescribeProducers(DescribeProducersRequest::default())
        }
        ApiKey::DescribeAcls => RequestKind::DescribeAcls(DescribeAclsRequest::default()),
        ApiKey::CreateAcls => RequestKind::CreateAcls(CreateAclsRequest::default()),
        ApiKey::DeleteAcls => RequestKind::DeleteAcls(DeleteAclsRequest::default()),
        ApiKey::DescribeClientQuotas => {
            RequestKind::DescribeClientQuotas(DescribeClientQuotasRequest::default())
        }
        ApiKey::AlterClientQuotas => {
            RequestKind::AlterClientQuotas(AlterClientQuotasRequest::default())
        }
        ApiKey::DescribeUserScramCredentials => {
            RequestKind::DescribeUserScramCredentials(DescribeUserScramCredentialsRequest::default())
        }
        ApiKey::AlterUserScramCredentials => {
            RequestKind::AlterUserScramCredentials(AlterUserScramCredentialsRequest::default())
        }
        ApiKey::SaslHandshake => RequestKind::SaslHandshake(SaslHandshakeRequest::default()),
        ApiKey::SaslAuthenticate => {
            RequestKind::SaslAuthenticate(SaslAuthenticateRequest::default())
        }
        other => panic!("{other:?} is not in SUPPORTED"),
    }
}

fn topic(name: &'static str) -> TopicName {
    TopicName(StrBytes::from_static_str(name))
}

/// Requests with content, at the versions given.
fn rich() -> Vec<(ApiKey, i16, RequestKind)> {
    let batch = simple_batch(
        &[(Some(b"k1"), Some(b"hello")), (None, Some(b"world"))],
        Timestamp(1_700_000_000_000),
    );
    let produce = ProduceRequest::default()
        .with_acks(-1)
        .with_timeout_ms(30_000)
        .with_topic_data(vec![produce_request::TopicProduceData::default()
            .with_name(topic("greetings"))
            .with_partition_data(vec![
                produce_request::PartitionProduceData::default()
                    .with_index(0)
                    .with_records(Some(batch)),
            ])]);
    let metadata = MetadataRequest::default().with_topics(Some(vec![
        metadata_request::MetadataRequestTopic::default().with_name(Some(topic("a"))),
        metadata_request::MetadataRequestTopic::default().with_name(Some(topic("b"))),
    ]));
    let fetch = FetchRequest::default()
        .with_max_wait_ms(500)
        .with_max_bytes(1 << 20)
        .with_topics(vec![fetch_request::FetchTopic::default()
            .with_topic(topic("greetings"))
            .with_partitions(vec![fetch_request::FetchPartition::default()
                .with_partition(0)
                .with_fetch_offset(5)
                .with_partition_max_bytes(1 << 16)])]);
    let create = CreateTopicsRequest::default()
        .with_timeout_ms(1000)
        .with_topics(vec![create_topics_request::CreatableTopic::default()
            .with_name(topic("new"))
            .with_num_partitions(3)
            .with_replication_factor(1)
            .with_configs(vec![
                create_topics_request::CreatableTopicConfig::default()
                    .with_name(StrBytes::from_static_str("retention.ms"))
                    .with_value(Some(StrBytes::from_static_str("1000"))),
            ])]);
    let join = JoinGroupRequest::default()
        .with_group_id(GroupId(StrBytes::from_static_str("g")))
        .with_session_timeout_ms(10_000)
        .with_protocol_type(StrBytes::from_static_str("consumer"))
        .with_protocols(vec![join_group_request::JoinGroupRequestProtocol::default(
        )
        .with_name(StrBytes::from_static_str("range"))
        .with_metadata(Bytes::from_static(b"\x00\x01\x00\x00\x00\x01\x00\x01a"))]);
    let commit = OffsetCommitRequest::default()
        .with_group_id(GroupId(StrBytes::from_static_str("g")))
        .with_topics(vec![
            offset_commit_request::OffsetCommitRequestTopic::default()
                .with_name(topic("greetings"))
                .with_partitions(vec![
                    offset_commit_request::OffsetCommitRequestPartition::default()
                        .with_partition_index(0)
                        .with_committed_offset(42),
                ]),
        ]);
    let list = ListOffsetsRequest::default().with_topics(vec![
        list_offsets_request::ListOffsetsTopic::default()
            .with_name(topic("greetings"))
            .with_partitions(vec![list_offsets_request::ListOffsetsPartition::default()
                .with_partition_index(0)
                .with_timestamp(-2)]),
    ]);
    let delete = DeleteRecordsRequest::default().with_topics(vec![
        delete_records_request::DeleteRecordsTopic::default()
            .with_name(topic("greetings"))
            .with_partitions(vec![
                delete_records_request::DeleteRecordsPartition::default()
                    .with_partition_index(0)
                    .with_offset(3),
            ]),
    ]);
    let mut out = Vec::new();
    for v in [3, 9, 12] {
        out.push((ApiKey::Produce, v, RequestKind::Produce(produce.clone())));
    }
    for v in [4, 13] {
        out.push((ApiKey::Metadata, v, RequestKind::Metadata(metadata.clone())));
    }
    for v in [4, 12] {
        out.push((ApiKey::Fetch, v, RequestKind::Fetch(fetch.clone())));
    }
    let dtp = DescribeTopicPartitionsRequest::default()
        .with_topics(vec![
            describe_topic_partitions_request::TopicRequest::default().with_name(topic("a")),
            describe_topic_partitions_request::TopicRequest::default().with_name(topic("b")),
        ])
        .with_response_partition_limit(2)
        .with_cursor(Some(
            describe_topic_partitions_request::Cursor::default()
                .with_topic_name(topic("a"))
                .with_partition_index(1),
        ));
    out.push((
        ApiKey::DescribeTopicPartitions,
        0,
        RequestKind::DescribeTopicPartitions(dtp),
    ));
    let epochs = OffsetForLeaderEpochRequest::default().with_topics(vec![
        offset_for_leader_epoch_request::OffsetForLeaderTopic::default()
            .with_topic(topic("greetings"))
            .with_partitions(vec![
                offset_for_leader_epoch_request::OffsetForLeaderPartition::default()
                    .with_partition(0)
                    .with_current_leader_epoch(0)
                    .with_leader_epoch(0),
            ]),
    ]);
    out.push((
        ApiKey::OffsetForLeaderEpoch,
        4,
        RequestKind::OffsetForLeaderEpoch(epochs),
    ));
    out.push((ApiKey::CreateTopics, 7, RequestKind::CreateTopics(create)));
    out.push((ApiKey::JoinGroup, 9, RequestKind::JoinGroup(join)));
    out.push((ApiKey::OffsetCommit, 8, RequestKind::OffsetCommit(commit)));
    out.push((ApiKey::ListOffsets, 10, RequestKind::ListOffsets(list)));
    out.push((ApiKey::DeleteRecords, 2, RequestKind::DeleteRecords(delete)));
    out
}

fn frame(key: ApiKey, version: i16, request: &RequestKind) -> Vec<u8> {
    let header = RequestHeader::default()
        .with_request_api_key(key as i16)
        .with_request_api_version(version)
        .with_correlation_id(1)
        .with_client_id(Some(StrBytes::from_static_str("seed")));
    let mut buf = BytesMut::from(&[0u8; 4][..]);
    header
        .encode(&mut buf, key.request_header_version(version))
        .unwrap();
    request.encode(&mut buf, version).unwrap();
    let size = (buf.len() - 4) as u32;
    buf[..4].copy_from_slice(&size.to_be_bytes());
    let frame = buf.to_vec();
    // Every seed is a request the broker accepts.
    assert!(
        matches!(
            wire::decode_frame(&frame, 1 << 20),
            Ok(wire::Decoded::Request { .. })
        ),
        "{key:?} v{version}"
    );
    frame
}

fn write(dir: &Path, name: &str, bytes: &[u8]) {
    std::fs::write(dir.join(name), bytes).unwrap();
}

fn main() {
    let dir = Path::new("corpus/request_decode");
    std::fs::create_dir_all(dir).unwrap();
    for &(key, min, max) in wire::SUPPORTED {
        for version in [min, max] {
            let f = frame(key, version, &request(key));
            write(dir, &format!("{key:?}-v{version}"), &f);
        }
    }
    for (key, version, r) in rich() {
        write(
            dir,
            &format!("{key:?}-v{version}-content"),
            &frame(key, version, &r),
        );
    }

    let dir = Path::new("corpus/record_batch");
    std::fs::create_dir_all(dir).unwrap();
    let plain = simple_batch(
        &[
            (Some(b"k"), Some(b"v")),
            (None, Some(b"value")),
            (Some(b"t"), None),
        ],
        Timestamp(1_700_000_000_000),
    );
    let mut headers = BatchBuilder::new().producer(7, 1, 0);
    for i in 0..3u8 {
        headers.push(&NewRecord {
            key: Some(vec![b'k', i]),
            value: Some(vec![i; 20]),
            headers: vec![(b"h".to_vec(), Some(vec![i])), (b"n".to_vec(), None)],
            timestamp: Timestamp(1000 + i as i64),
        });
    }
    let headers = headers.build();
    let mut gzip_flag = BatchBuilder::new().attributes(1);
    gzip_flag.push(&NewRecord {
        key: None,
        value: Some(b"not really gzip".to_vec()),
        headers: vec![],
        timestamp: Timestamp(5),
    });
    let gzip_flag = gzip_flag.build();
    for (name, b) in [
        ("plain", &plain),
        ("headers", &headers),
        ("gzip-flag", &gzip_flag),
    ] {
        for flags in [0u8, 3] {
            let mut seed = vec![flags];
            seed.extend_from_slice(b);
            write(dir, &format!("{name}-flags{flags}"), &seed);
        }
    }

    // SASL exchanges: the mechanism byte, the handshake version bit, then tokens, each a
    // length byte and its bytes.
    let dir = Path::new("corpus/sasl_exchange");
    std::fs::create_dir_all(dir).unwrap();
    let exchange = |mechanism: u8, version: u8, tokens: &[&[u8]]| {
        let mut out = vec![mechanism, version];
        for t in tokens {
            out.push(t.len() as u8);
            out.extend_from_slice(t);
        }
        out
    };
    write(dir, "plain-v1", &exchange(0, 1, &[b"\0alice\0alice-pw"]));
    write(dir, "plain-v0", &exchange(0, 0, &[b"\0alice\0alice-pw"]));
    write(dir, "plain-wrong", &exchange(0, 1, &[b"alice\0alice\0nope"]));
    write(dir, "scram256-v1", &exchange(1, 1, &[b"n,,n=alice,r=fyko+d2lbbFgONRv9qkxdawL", b"c=biws,r=fyko+d2lbbFgONRv9qkxdawL3rfcNHYJY1ZVvWVs7j,p=v0X8v3Bz2T0CJGbJQyF0X+HI4Ts="]));
    write(dir, "scram512-v0-escaped", &exchange(2, 0, &[b"n,a=al=2Cice,n=al=2Cice,r=x,ext=1", b"c=biws,r=x,p=AAAA"]));
    write(dir, "gssapi", &exchange(3, 1, &[b"x"]));
    println!("seeds written under corpus/");
}
