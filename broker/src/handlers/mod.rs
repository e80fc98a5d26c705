//! One file per Kafka API. `dispatch` decodes a request body for its API and version, runs the
//! handler and encodes the response body.

use std::rc::Rc;

use bytes::Bytes;
use kafka_protocol::messages::{ApiKey, RequestKind, ResponseKind};
use kafka_protocol::ResponseError;

use crate::codec::response::Splices;
use crate::codec::{decode_request, Answer};
use crate::shard::Shard;
use order::Turn;

pub mod add_offsets_to_txn;
pub mod add_partitions_to_txn;
pub mod alter_client_quotas;
pub mod alter_replica_log_dirs;
pub mod api_versions;
pub mod authz;
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
pub mod order;
pub mod produce;
pub mod sync_group;
pub mod txn_offset_commit;
pub mod write_txn_markers;

/// Who sent a request: the header's client id and the peer's host, for group membership.
pub struct Client {
    pub client_id: String,
    pub host: String,
    /// Whether fetched records on disk may be spliced to this connection's socket (plain TCP);
    /// over TLS they are copied, to be encrypted.
    pub zero_copy: bool,
    /// Who the client authenticated as (`User:ANONYMOUS` without SASL), for the authorizer.
    pub principal: std::rc::Rc<str>,
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
    let mut splices = if client.zero_copy {
        Splices::default()
    } else {
        Splices::copying()
    };
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
        // Authentication happens before requests reach the handlers (`net/sasl.rs`): here the
        // connection is authenticated already or its listener has no SASL, and Kafka answers
        // ILLEGAL_SASL_STATE.
        RequestKind::SaslHandshake(_) => ResponseKind::SaslHandshake(
            kafka_protocol::messages::SaslHandshakeResponse::default()
                .with_error_code(ResponseError::IllegalSaslState.code()),
        ),
        RequestKind::SaslAuthenticate(_) => ResponseKind::SaslAuthenticate(
            kafka_protocol::messages::SaslAuthenticateResponse::default()
                .with_error_code(ResponseError::IllegalSaslState.code())
                .with_error_message(Some(kafka_protocol::protocol::StrBytes::from_static_str(
                    "the connection is authenticated already, or its listener does not use SASL",
                ))),
        ),
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
        RequestKind::DescribeAcls(r) => {
            ResponseKind::DescribeAcls(describe_acls::handle(shard, &client, r))
        }
        RequestKind::CreateAcls(r) => {
            ResponseKind::CreateAcls(create_acls::handle(shard, &client, r, version).await)
        }
        RequestKind::DeleteAcls(r) => {
            ResponseKind::DeleteAcls(delete_acls::handle(shard, &client, r, version).await)
        }
        RequestKind::DescribeClientQuotas(r) => {
            ResponseKind::DescribeClientQuotas(describe_client_quotas::handle(r))
        }
        RequestKind::AlterClientQuotas(r) => {
            ResponseKind::AlterClientQuotas(alter_client_quotas::handle(r))
        }
        RequestKind::DescribeUserScramCredentials(r) => ResponseKind::DescribeUserScramCredentials(
            describe_user_scram_credentials::handle(r, &shard.image()),
        ),
        RequestKind::AlterUserScramCredentials(r) => ResponseKind::AlterUserScramCredentials(
            crate::cluster::alter_user_scram_credentials(shard, r, version).await,
        ),
        other => anyhow::bail!("no handler for {:?}", api_name(&other)),
    };
    Ok(Some(Answer {
        response,
        version,
        splices,
    }))
}

fn api_name(r: &RequestKind) -> &'static str {
    match r {
        RequestKind::Produce(_) => "Produce",
        _ => "an unsupported API",
    }
}
