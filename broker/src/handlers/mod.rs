//! One file per Kafka API. `dispatch` decodes a request body for its API and version, runs the
//! handler and encodes the response body.

use std::rc::Rc;

use bytes::{BufMut, Bytes, BytesMut};
use kafka_protocol::messages::{ApiKey, RequestKind, ResponseKind};

use crate::net::order::Turn;
use crate::net::response::{Frame, SplicedBuf, Splices};
use crate::shard::Shard;

pub mod add_offsets_to_txn;
pub mod add_partitions_to_txn;
pub mod alter_client_quotas;
pub mod alter_replica_log_dirs;
pub mod alter_user_scram_credentials;
pub mod api_versions;
mod compact;
pub mod configs;
pub mod consumer_group_describe;
pub mod consumer_group_heartbeat;
pub mod create_acls;
pub mod delete_acls;
pub mod delete_records;
pub mod describe_acls;
pub mod describe_client_quotas;
pub mod describe_cluster;
pub mod describe_log_dirs;
pub mod describe_producers;
pub mod describe_topic_partitions;
pub mod describe_transactions;
pub mod describe_user_scram_credentials;
pub mod end_txn;
pub mod fetch;
pub mod find_coordinator;
pub mod groups_admin;
pub mod heartbeat;
pub mod init_producer_id;
pub mod join_group;
pub mod leave_group;
pub mod list_config_resources;
pub mod list_offsets;
pub mod list_transactions;
pub mod metadata;
pub mod offset_commit;
pub mod offset_fetch;
pub mod offset_for_leader_epoch;
pub mod produce;
pub mod sync_group;
pub mod topic_ids;
pub mod txn_offset_commit;
pub mod write_txn_markers;

/// Every API this broker implements, with the versions it implements. ApiVersions advertises
/// exactly this table; anything else is refused. Where Kafka 4 has a newer version, the comment
/// says why it is left out.
pub const SUPPORTED: &[(ApiKey, i16, i16)] = &[
    // 11 adds TRANSACTION_ABORTABLE for a transactional batch whose partition is not in the
    // transaction (KIP-890 part 1); 12 has the leader add the partition instead, at
    // `transaction.version` 2 (part 2). 13 names topics by id (KIP-516), which the produce
    // handler does not read yet.
    (ApiKey::Produce, 3, 13),
    // 16 adds leader endpoints to NOT_LEADER_OR_FOLLOWER answers, for a leader elsewhere (there
    // is none: this node leads every partition); 17 and 18 add follower fields consumers leave
    // unset.
    (ApiKey::Fetch, 4, 18),
    // 9 adds LATEST_TIERED (no tiered storage: answered -1), 10 a timeout for remote lookups
    // (every lookup is local), 11 EARLIEST_PENDING_UPLOAD (answered -1 too). 11 is past the
    // codec's versions: its bytes are 10's (`codec_version`).
    (ApiKey::ListOffsets, 1, 11),
    // 13 adds a top-level error code, never set here (no re-bootstrap is ever needed).
    (ApiKey::Metadata, 0, 13),
    // 4 lists features whose supported range starts at 0; 5 checks the cluster and node the
    // client names (KIP-1242), past the codec's versions (`api_versions::decode_v5`).
    (ApiKey::ApiVersions, 0, 5),
    (ApiKey::CreateTopics, 2, 7),
    (ApiKey::DeleteTopics, 1, 6),
    (ApiKey::CreatePartitions, 0, 3),
    (ApiKey::DescribeConfigs, 1, 4),
    (ApiKey::AlterConfigs, 0, 2),
    (ApiKey::IncrementalAlterConfigs, 0, 1),
    (ApiKey::ElectLeaders, 0, 2),
    (ApiKey::AlterPartitionReassignments, 0, 1),
    (ApiKey::ListPartitionReassignments, 0, 0),
    // 1 replaces allow_downgrade with upgrade_type; 2 drops nothing the broker sends.
    (ApiKey::UpdateFeatures, 0, 2),
    (ApiKey::DeleteRecords, 0, 2),
    // 5 adds TRANSACTION_ABORTABLE (KIP-890); 6 is two-phase commit (KIP-939), past the
    // codec's versions.
    (ApiKey::InitProducerId, 0, 5),
    // 4 and 5 are the partition leaders' form (KIP-890): several transactions per request,
    // each either verified (`verify_only`) or added on the producer's behalf (transaction
    // version 2). Clients send 0 to 3.
    (ApiKey::AddPartitionsToTxn, 0, 5),
    // 4 adds TRANSACTION_ABORTABLE (KIP-890).
    (ApiKey::AddOffsetsToTxn, 0, 4),
    // 4 adds TRANSACTION_ABORTABLE; 5 adds the group's partition to the transaction itself
    // (transaction version 2: no AddOffsetsToTxn); 6 names topics by id, past the codec's
    // versions (`topic_ids`).
    (ApiKey::TxnOffsetCommit, 0, 6),
    // 5 bumps the producer epoch at every end (transaction version 2).
    (ApiKey::EndTxn, 0, 5),
    // 2 lists fenced brokers when asked (KIP-1073).
    (ApiKey::DescribeCluster, 0, 2),
    // Answered by the quorum's leader, as Kafka's brokers forward it to the controller.
    (ApiKey::DescribeQuorum, 0, 2),
    // 5 adds TRANSACTION_ABORTABLE; 6 the share-partition key type (KIP-932), which a broker
    // without share groups answers INVALID_REQUEST for, as Kafka's does with them off.
    (ApiKey::FindCoordinator, 0, 6),
    (ApiKey::JoinGroup, 0, 9),
    (ApiKey::SyncGroup, 0, 5),
    (ApiKey::Heartbeat, 0, 4),
    (ApiKey::LeaveGroup, 0, 5),
    // 9 is the KIP-848 members' version (the request is 8's; a consumer-protocol member must
    // use it); 10 names topics by id, past the codec's versions (`topic_ids`).
    (ApiKey::OffsetCommit, 2, 10),
    // 9 adds the member id and epoch, checked for consumer groups (KIP-848); 10 names topics by
    // id, past the codec's versions (`topic_ids`).
    (ApiKey::OffsetFetch, 1, 10),
    // 5 adds the group type filter (KIP-848).
    (ApiKey::ListGroups, 0, 5),
    // 6 adds an error message per group (KIP-1043).
    (ApiKey::DescribeGroups, 0, 6),
    // 3 adds an error message per group (KIP-1043), past the codec's versions: the request is
    // 2's, the response is encoded here (`groups_admin::encode_delete_v3`).
    (ApiKey::DeleteGroups, 0, 3),
    (ApiKey::OffsetDelete, 0, 0),
    (ApiKey::ConsumerGroupHeartbeat, 0, 1),
    (ApiKey::ConsumerGroupDescribe, 0, 1),
    (ApiKey::OffsetForLeaderEpoch, 2, 4),
    (ApiKey::DescribeTopicPartitions, 0, 0),
    // 5 adds IsCordoned (KIP-1066; no directory is ever cordoned), past the codec's
    // versions: the request is 4's, the response is encoded here (`describe_log_dirs`).
    (ApiKey::DescribeLogDirs, 1, 5),
    (ApiKey::AlterReplicaLogDirs, 1, 2),
    (ApiKey::ListConfigResources, 0, 1),
    (ApiKey::DescribeProducers, 0, 0),
    (ApiKey::DescribeTransactions, 0, 0),
    // 1 adds the duration filter (KIP-994), 2 the transactional id pattern (KIP-1152).
    (ApiKey::ListTransactions, 0, 2),
    // 0 is gone from Kafka 4; 2 adds each marker's transaction version (KIP-890), past the
    // codec's versions (`write_txn_markers::v2_as_v1`).
    (ApiKey::WriteTxnMarkers, 1, 2),
    (ApiKey::DescribeAcls, 1, 3),
    (ApiKey::CreateAcls, 1, 3),
    (ApiKey::DeleteAcls, 1, 3),
    (ApiKey::DescribeClientQuotas, 0, 1),
    (ApiKey::AlterClientQuotas, 0, 1),
    (ApiKey::DescribeUserScramCredentials, 0, 0),
    (ApiKey::AlterUserScramCredentials, 0, 0),
];

pub fn supported(key: ApiKey, version: i16) -> bool {
    SUPPORTED
        .iter()
        .any(|&(k, min, max)| k == key && (min..=max).contains(&version))
}

/// Decodes a request body for its API and version (the header already taken off `body`).
pub fn decode_request(key: ApiKey, version: i16, body: &mut Bytes) -> anyhow::Result<RequestKind> {
    if (key, version) == (ApiKey::ApiVersions, 5) {
        return api_versions::decode_v5(body).map(RequestKind::ApiVersions);
    }
    if let Some(codec) = topic_ids::codec_version(key, version) {
        let mut named = topic_ids::request_to_names(key, body)?;
        return RequestKind::decode(key, &mut named, codec);
    }
    if (key, version) == (ApiKey::WriteTxnMarkers, 2) {
        let mut v1 = write_txn_markers::v2_as_v1(body)?;
        return RequestKind::decode(key, &mut v1, 1);
    }
    RequestKind::decode(key, body, codec_version(key, version))
}

/// The version whose bytes the codec reads and writes for `key` at `version`: Kafka versions
/// newer than the codec's whose request (and, but for DescribeLogDirs, response) schema is
/// the previous version's unchanged, as Kafka's generated schemas show.
pub fn codec_version(key: ApiKey, version: i16) -> i16 {
    if let Some(codec) = topic_ids::codec_version(key, version) {
        return codec;
    }
    match (key, version) {
        (ApiKey::ListOffsets, 11) => 10,
        (ApiKey::DescribeLogDirs, 5) => 4,
        // The response; the request is read by `api_versions::decode_v5`.
        (ApiKey::ApiVersions, 5) => 4,
        // The request; the response is encoded by `groups_admin::encode_delete_v3`.
        (ApiKey::DeleteGroups, 3) => 2,
        // The response; the request is read by `write_txn_markers::v2_as_v1`.
        (ApiKey::WriteTxnMarkers, 2) => 1,
        _ => version,
    }
}

/// Who sent a request: the header's client id and the peer's host, for group membership.
pub struct Client {
    pub client_id: String,
    pub host: String,
}

/// A handler's response, with the records a fetch response splices from segment files.
pub struct Answer {
    pub response: ResponseKind,
    pub version: i16,
    pub splices: Splices,
}

/// Runs one request. `Ok(None)` means the API sends no response (produce with acks=0).
pub async fn dispatch(
    shard: &Rc<Shard>,
    key: ApiKey,
    version: i16,
    body: &mut Bytes,
    client: Client,
    turn: &mut Turn,
) -> anyhow::Result<Option<Answer>> {
    let request = decode_request(key, version, body)?;
    let mut splices = Splices::default();
    let response = match request {
        // Metadata changes are the controller's (on the single-node default, its own).
        RequestKind::CreateTopics(r) => {
            ResponseKind::CreateTopics(crate::cluster::create_topics(shard, r, version).await)
        }
        RequestKind::DeleteTopics(r) => {
            ResponseKind::DeleteTopics(crate::cluster::delete_topics(shard, r, version).await)
        }
        RequestKind::CreatePartitions(r) => ResponseKind::CreatePartitions(
            crate::cluster::create_partitions(shard, r, version).await,
        ),
        RequestKind::AlterConfigs(r) => {
            ResponseKind::AlterConfigs(crate::cluster::alter_configs(shard, r).await)
        }
        RequestKind::IncrementalAlterConfigs(r) => ResponseKind::IncrementalAlterConfigs(
            crate::cluster::incremental_alter_configs(shard, r, version).await,
        ),
        RequestKind::ElectLeaders(r) => {
            ResponseKind::ElectLeaders(crate::cluster::elect_leaders(shard, r, version).await)
        }
        RequestKind::AlterPartitionReassignments(r) => ResponseKind::AlterPartitionReassignments(
            crate::cluster::alter_partition_reassignments(shard, r, version).await,
        ),
        RequestKind::ListPartitionReassignments(r) => ResponseKind::ListPartitionReassignments(
            crate::cluster::list_partition_reassignments(shard, r, version).await,
        ),
        RequestKind::UpdateFeatures(r) => {
            ResponseKind::UpdateFeatures(crate::cluster::update_features(shard, r, version).await)
        }
        RequestKind::ApiVersions(r) => ResponseKind::ApiVersions(api_versions::handle(
            &r,
            version,
            None,
            &shard.image(),
            shard.config(),
        )),
        RequestKind::Metadata(r) => {
            ResponseKind::Metadata(metadata::handle(shard, r, version).await)
        }
        RequestKind::Produce(r) => match produce::handle(shard, r, version, turn).await {
            Some(r) => ResponseKind::Produce(r),
            None => return Ok(None),
        },
        RequestKind::Fetch(r) => {
            ResponseKind::Fetch(fetch::handle(shard, r, version, &mut splices).await)
        }
        RequestKind::ListOffsets(r) => {
            ResponseKind::ListOffsets(list_offsets::handle(shard, r, version).await)
        }
        RequestKind::DescribeConfigs(r) => {
            ResponseKind::DescribeConfigs(configs::describe(shard, r, version).await)
        }
        RequestKind::DeleteRecords(r) => {
            ResponseKind::DeleteRecords(delete_records::handle(shard, r).await)
        }
        RequestKind::InitProducerId(r) => {
            ResponseKind::InitProducerId(init_producer_id::handle(shard, r, version).await)
        }
        RequestKind::AddPartitionsToTxn(r) => {
            ResponseKind::AddPartitionsToTxn(add_partitions_to_txn::handle(shard, r, version).await)
        }
        RequestKind::AddOffsetsToTxn(r) => {
            ResponseKind::AddOffsetsToTxn(add_offsets_to_txn::handle(shard, r, version).await)
        }
        RequestKind::TxnOffsetCommit(r) => {
            ResponseKind::TxnOffsetCommit(txn_offset_commit::handle(shard, r, version).await)
        }
        RequestKind::EndTxn(r) => ResponseKind::EndTxn(end_txn::handle(shard, r, version).await),
        RequestKind::DescribeQuorum(r) => {
            ResponseKind::DescribeQuorum(crate::cluster::describe_quorum(shard, r, version).await)
        }
        RequestKind::DescribeCluster(request) => {
            ResponseKind::DescribeCluster(describe_cluster::handle(shard, &request))
        }
        RequestKind::FindCoordinator(r) => {
            ResponseKind::FindCoordinator(find_coordinator::handle(shard, r, version))
        }
        RequestKind::JoinGroup(r) => ResponseKind::JoinGroup(
            join_group::handle(shard, r, version, client.client_id, client.host).await,
        ),
        RequestKind::SyncGroup(r) => {
            ResponseKind::SyncGroup(sync_group::handle(shard, r, version).await)
        }
        RequestKind::Heartbeat(r) => ResponseKind::Heartbeat(heartbeat::handle(shard, r).await),
        RequestKind::LeaveGroup(r) => {
            ResponseKind::LeaveGroup(leave_group::handle(shard, r, version).await)
        }
        RequestKind::OffsetCommit(r) => {
            ResponseKind::OffsetCommit(offset_commit::handle(shard, r, version).await)
        }
        RequestKind::OffsetFetch(r) => {
            ResponseKind::OffsetFetch(offset_fetch::handle(shard, r, version).await)
        }
        RequestKind::ListGroups(r) => ResponseKind::ListGroups(groups_admin::list(shard, r).await),
        RequestKind::DescribeGroups(r) => {
            ResponseKind::DescribeGroups(groups_admin::describe(shard, r, version).await)
        }
        RequestKind::DeleteGroups(r) => {
            ResponseKind::DeleteGroups(groups_admin::delete(shard, r).await)
        }
        RequestKind::OffsetDelete(r) => {
            ResponseKind::OffsetDelete(groups_admin::offset_delete(shard, r).await)
        }
        RequestKind::ConsumerGroupHeartbeat(r) => ResponseKind::ConsumerGroupHeartbeat(
            consumer_group_heartbeat::handle(shard, r, client.client_id, client.host).await,
        ),
        RequestKind::ConsumerGroupDescribe(r) => {
            ResponseKind::ConsumerGroupDescribe(consumer_group_describe::handle(shard, r).await)
        }
        RequestKind::OffsetForLeaderEpoch(r) => {
            ResponseKind::OffsetForLeaderEpoch(offset_for_leader_epoch::handle(shard, r).await)
        }
        RequestKind::DescribeTopicPartitions(r) => {
            ResponseKind::DescribeTopicPartitions(describe_topic_partitions::handle(shard, r))
        }
        RequestKind::DescribeLogDirs(r) => {
            ResponseKind::DescribeLogDirs(describe_log_dirs::handle(shard, r).await)
        }
        RequestKind::AlterReplicaLogDirs(r) => {
            ResponseKind::AlterReplicaLogDirs(alter_replica_log_dirs::handle(shard, r))
        }
        RequestKind::ListConfigResources(r) => {
            ResponseKind::ListConfigResources(list_config_resources::handle(shard, r, version))
        }
        RequestKind::DescribeProducers(r) => {
            ResponseKind::DescribeProducers(describe_producers::handle(shard, r).await)
        }
        RequestKind::DescribeTransactions(r) => {
            ResponseKind::DescribeTransactions(describe_transactions::handle(shard, r).await)
        }
        RequestKind::ListTransactions(r) => {
            ResponseKind::ListTransactions(list_transactions::handle(shard, r, version).await)
        }
        RequestKind::WriteTxnMarkers(r) => {
            ResponseKind::WriteTxnMarkers(write_txn_markers::handle(shard, r).await)
        }
        RequestKind::DescribeAcls(r) => ResponseKind::DescribeAcls(describe_acls::handle(r)),
        RequestKind::CreateAcls(r) => ResponseKind::CreateAcls(create_acls::handle(r)),
        RequestKind::DeleteAcls(r) => ResponseKind::DeleteAcls(delete_acls::handle(r)),
        RequestKind::DescribeClientQuotas(r) => {
            ResponseKind::DescribeClientQuotas(describe_client_quotas::handle(r))
        }
        RequestKind::AlterClientQuotas(r) => {
            ResponseKind::AlterClientQuotas(alter_client_quotas::handle(r))
        }
        RequestKind::DescribeUserScramCredentials(r) => {
            ResponseKind::DescribeUserScramCredentials(describe_user_scram_credentials::handle(r))
        }
        RequestKind::AlterUserScramCredentials(r) => {
            ResponseKind::AlterUserScramCredentials(alter_user_scram_credentials::handle(r))
        }
        other => anyhow::bail!("no handler for {:?}", api_name(&other)),
    };
    Ok(Some(Answer {
        response,
        version,
        splices,
    }))
}

/// The frame of an answer: encoded in one buffer, or cut around the records it splices.
pub fn encode_answer(key: ApiKey, correlation_id: i32, answer: &Answer) -> anyhow::Result<Frame> {
    if answer.splices.is_empty() {
        return Ok(Frame::Bytes(encode_response(
            key,
            answer.version,
            correlation_id,
            &answer.response,
        )?));
    }
    let header_version = key.response_header_version(answer.version);
    let header =
        kafka_protocol::messages::ResponseHeader::default().with_correlation_id(correlation_id);
    let mut buf = SplicedBuf::new(&answer.splices, 4096);
    buf.put_slice(&[0; 4]);
    kafka_protocol::protocol::Encodable::encode(&header, &mut buf, header_version)?;
    let ResponseKind::Fetch(response) = &answer.response else {
        anyhow::bail!("only fetch responses splice records");
    };
    kafka_protocol::protocol::Encodable::encode(response, &mut buf, answer.version)?;
    Ok(buf.finish())
}

fn api_name(r: &RequestKind) -> &'static str {
    match r {
        RequestKind::Produce(_) => "Produce",
        _ => "an unsupported API",
    }
}

/// Encodes a response frame: size prefix, response header, body.
pub fn encode_response(
    key: ApiKey,
    version: i16,
    correlation_id: i32,
    response: &ResponseKind,
) -> anyhow::Result<Bytes> {
    let header_version = key.response_header_version(codec_version(key, version));
    let header =
        kafka_protocol::messages::ResponseHeader::default().with_correlation_id(correlation_id);
    // A fetch response carries megabytes of records: size the frame once rather than let it
    // grow by doubling (each step a copy of everything so far and fresh pages to fault in).
    let body = match response {
        ResponseKind::Fetch(r) => {
            kafka_protocol::protocol::Encodable::compute_size(r, version).unwrap_or(0)
        }
        _ => 0,
    };
    let mut buf = BytesMut::with_capacity(64 + body);
    buf.extend_from_slice(&[0; 4]);
    kafka_protocol::protocol::Encodable::encode(&header, &mut buf, header_version)?;
    match response {
        ResponseKind::DescribeLogDirs(r) if version >= 5 => {
            describe_log_dirs::encode_v5(r, &mut buf);
        }
        ResponseKind::DeleteGroups(r) if version >= 3 => {
            groups_admin::encode_delete_v3(r, &mut buf);
        }
        _ if topic_ids::codec_version(key, version).is_some() => {
            let mut named = BytesMut::new();
            response.encode(&mut named, codec_version(key, version))?;
            topic_ids::response_to_ids(key, named.freeze(), &mut buf)?;
        }
        _ => response.encode(&mut buf, codec_version(key, version))?,
    }
    let size = (buf.len() - 4) as u32;
    buf[0..4].copy_from_slice(&size.to_be_bytes());
    Ok(buf.freeze())
}
