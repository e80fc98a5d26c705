//! The authorizer, as the handlers ask it: once per resource of a request, never per record.
//! Without `authorizer.class.name` everything is allowed, as in Kafka. The rules are Kafka's
//! StandardAuthorizer's (`sluice_replication::acl`), over the ACLs of this shard's image.

use kafka_protocol::messages::{ApiKey, RequestKind, ResponseKind, TopicName};
use kafka_protocol::protocol::StrBytes;
use kafka_protocol::ResponseError;
use sluice_replication::acl::{self, Action, Requester};

use super::Client;
use crate::shard::Shard;

/// The principal of a node's requests to itself (`net::loopback`), allowed everything. No
/// login makes it: SASL and TLS principals are `User:` ones.
pub const NODE_PRINCIPAL: &str = "Node:self";

pub use acl::operation;
pub use acl::resource_type;

/// Whether `client` may do `operation` on the resource; a denial is logged.
pub fn allowed(
    shard: &Shard,
    client: &Client,
    operation: i8,
    resource_type: i8,
    name: &str,
) -> bool {
    let ok = allowed_quietly(shard, client, operation, resource_type, name);
    if !ok {
        // Kafka's authorizer log line: who, from where, what, on what.
        tracing::info!(target: "sluice::authorizer", principal = %client.principal, host = %client.host.trim_start_matches('/'), operation = operation_name(operation), resource_type = resource_type_name(resource_type), resource = name, "denied");
    }
    ok
}

/// [`allowed`] without the log line, for listings that leave out what the client may not see.
pub fn permitted(
    shard: &Shard,
    client: &Client,
    operation: i8,
    resource_type: i8,
    name: &str,
) -> bool {
    allowed_quietly(shard, client, operation, resource_type, name)
}

fn allowed_quietly(
    shard: &Shard,
    client: &Client,
    operation: i8,
    resource_type: i8,
    name: &str,
) -> bool {
    let config = shard.config();
    if !config.authorizer || &*client.principal == NODE_PRINCIPAL {
        return true;
    }
    let image = shard.image();
    let acls = image.cluster.as_ref().map_or(&[][..], |c| &c.acls[..]);
    acl::authorize(
        acls,
        &config.authorizer_config,
        Requester {
            principal: &client.principal,
            host: client.host.trim_start_matches('/'),
        },
        Action {
            operation,
            resource_type,
            resource_name: name,
        },
    )
}

/// The APIs whose handlers ask the authorizer for each resource as Kafka's do. With an
/// authorizer, the others are for super users only until they do.
pub fn checked(key: ApiKey) -> bool {
    use ApiKey::*;
    matches!(
        key,
        ApiVersions
            | SaslHandshake
            | SaslAuthenticate
            | Metadata
            | Produce
            | Fetch
            | ListOffsets
            | OffsetForLeaderEpoch
            | InitProducerId
            | AddPartitionsToTxn
            | AddOffsetsToTxn
            | TxnOffsetCommit
            | EndTxn
            | FindCoordinator
            | JoinGroup
            | SyncGroup
            | Heartbeat
            | LeaveGroup
            | ConsumerGroupHeartbeat
            | ShareGroupHeartbeat
            | ShareGroupDescribe
            | ShareFetch
            | ShareAcknowledge
            | DescribeShareGroupOffsets
            | AlterShareGroupOffsets
            | DeleteShareGroupOffsets
            | OffsetCommit
            | OffsetFetch
            | CreateTopics
            | CreatePartitions
            | DeleteTopics
            | DescribeConfigs
            | DescribeCluster
            | ElectLeaders
            | AlterPartitionReassignments
            | ListPartitionReassignments
            | UpdateFeatures
            | DescribeQuorum
            | DescribeLogDirs
            | DescribeUserScramCredentials
            | AlterUserScramCredentials
            | DescribeClientQuotas
            | AlterClientQuotas
            | DescribeTopicPartitions
            | ListGroups
            | DescribeGroups
            | DeleteGroups
            | OffsetDelete
            | ConsumerGroupDescribe
            | DeleteRecords
            | DescribeProducers
            | DescribeTransactions
            | ListTransactions
            | AlterConfigs
            | IncrementalAlterConfigs
            | CreateAcls
            | DescribeAcls
            | DeleteAcls
            | AlterReplicaLogDirs
            | WriteTxnMarkers
            | ListConfigResources
            | ReadShareGroupState
            | WriteShareGroupState
            | InitializeShareGroupState
            | DeleteShareGroupState
            | ReadShareGroupStateSummary
    )
}

/// Whether the client is allowed everything: a super user, this node itself, or anyone when
/// there is no authorizer.
pub fn is_super(shard: &Shard, client: &Client) -> bool {
    let config = shard.config();
    !config.authorizer
        || &*client.principal == NODE_PRINCIPAL
        || config
            .authorizer_config
            .super_users
            .iter()
            .any(|s| **s == *client.principal)
}

/// InitProducerId: WRITE on the transactional id; without one (an idempotent producer),
/// IDEMPOTENT_WRITE on the cluster or WRITE on any topic, as Kafka since 3.0.
pub fn init_producer_id(
    shard: &Shard,
    client: &Client,
    request: &kafka_protocol::messages::InitProducerIdRequest,
) -> bool {
    match request.transactional_id.as_ref().filter(|t| !t.is_empty()) {
        Some(id) => transactional_id(shard, client, operation::WRITE, id.as_str()),
        None => {
            cluster(shard, client, operation::IDEMPOTENT_WRITE)
                || shard.image().topics.keys().any(|t| {
                    allowed_quietly(shard, client, operation::WRITE, resource_type::TOPIC, t)
                })
        }
    }
}

/// The answer to a request the authorizer refuses whole: the APIs of one group (READ on it),
/// of one transactional id (WRITE on it; AddOffsetsToTxn also READ on its group),
/// InitProducerId, and the cluster's own (ALTER, DESCRIBE or DESCRIBE_CONFIGS on it). `None` lets the request through (its handler may still refuse parts).
pub fn refusal(shard: &Shard, client: &Client, request: &RequestKind) -> Option<ResponseKind> {
    use kafka_protocol::messages::*;
    if !shard.config().authorizer {
        return None;
    }
    let group_refused = ResponseError::GroupAuthorizationFailed.code();
    let cluster_refused = ResponseError::ClusterAuthorizationFailed.code();
    let txn_refused = ResponseError::TransactionalIdAuthorizationFailed.code();
    let read_group = |g: &GroupId| group(shard, client, operation::READ, g.as_str());
    let write_txn =
        |t: &TransactionalId| transactional_id(shard, client, operation::WRITE, t.as_str());
    Some(match request {
        RequestKind::InitProducerId(r) if !init_producer_id(shard, client, r) => {
            let code = if r.transactional_id.as_ref().is_some_and(|t| !t.is_empty()) {
                txn_refused
            } else {
                ResponseError::ClusterAuthorizationFailed.code()
            };
            ResponseKind::InitProducerId(
                InitProducerIdResponse::default()
                    .with_error_code(code)
                    .with_producer_id(ProducerId(-1))
                    .with_producer_epoch(-1),
            )
        }
        RequestKind::EndTxn(r) if !write_txn(&r.transactional_id) => ResponseKind::EndTxn(
            EndTxnResponse::default()
                .with_error_code(txn_refused)
                .with_producer_id(ProducerId(-1))
                .with_producer_epoch(-1),
        ),
        RequestKind::AddOffsetsToTxn(r) => {
            let code = if !write_txn(&r.transactional_id) {
                txn_refused
            } else if !read_group(&r.group_id) {
                group_refused
            } else {
                return None;
            };
            ResponseKind::AddOffsetsToTxn(AddOffsetsToTxnResponse::default().with_error_code(code))
        }
        RequestKind::JoinGroup(r) if !read_group(&r.group_id) => ResponseKind::JoinGroup(
            JoinGroupResponse::default()
                .with_error_code(group_refused)
                .with_generation_id(-1),
        ),
        RequestKind::SyncGroup(r) if !read_group(&r.group_id) => {
            ResponseKind::SyncGroup(SyncGroupResponse::default().with_error_code(group_refused))
        }
        RequestKind::Heartbeat(r) if !read_group(&r.group_id) => {
            ResponseKind::Heartbeat(HeartbeatResponse::default().with_error_code(group_refused))
        }
        RequestKind::LeaveGroup(r) if !read_group(&r.group_id) => {
            ResponseKind::LeaveGroup(LeaveGroupResponse::default().with_error_code(group_refused))
        }
        RequestKind::ShareGroupHeartbeat(r) if !read_group(&r.group_id) => {
            ResponseKind::ShareGroupHeartbeat(
                ShareGroupHeartbeatResponse::default().with_error_code(group_refused),
            )
        }
        RequestKind::ConsumerGroupHeartbeat(r) if !read_group(&r.group_id) => {
            ResponseKind::ConsumerGroupHeartbeat(
                ConsumerGroupHeartbeatResponse::default().with_error_code(group_refused),
            )
        }
        // Cluster operations, answered with one error.
        RequestKind::ElectLeaders(_) if !cluster(shard, client, operation::ALTER) => {
            ResponseKind::ElectLeaders(
                ElectLeadersResponse::default().with_error_code(cluster_refused),
            )
        }
        RequestKind::AlterPartitionReassignments(_)
            if !cluster(shard, client, operation::ALTER) =>
        {
            ResponseKind::AlterPartitionReassignments(
                AlterPartitionReassignmentsResponse::default().with_error_code(cluster_refused),
            )
        }
        RequestKind::ListPartitionReassignments(_)
            if !cluster(shard, client, operation::DESCRIBE) =>
        {
            ResponseKind::ListPartitionReassignments(
                ListPartitionReassignmentsResponse::default().with_error_code(cluster_refused),
            )
        }
        RequestKind::UpdateFeatures(_) if !cluster(shard, client, operation::ALTER) => {
            ResponseKind::UpdateFeatures(
                UpdateFeaturesResponse::default().with_error_code(cluster_refused),
            )
        }
        RequestKind::DescribeQuorum(_) if !cluster(shard, client, operation::DESCRIBE) => {
            ResponseKind::DescribeQuorum(
                DescribeQuorumResponse::default().with_error_code(cluster_refused),
            )
        }
        RequestKind::AlterReplicaLogDirs(r) if !cluster(shard, client, operation::ALTER) => {
            use kafka_protocol::messages::alter_replica_log_dirs_response::*;
            let results = r
                .dirs
                .iter()
                .flat_map(|d| &d.topics)
                .map(|t| {
                    AlterReplicaLogDirTopicResult::default()
                        .with_topic_name(t.name.clone())
                        .with_partitions(
                            t.partitions
                                .iter()
                                .map(|&p| {
                                    AlterReplicaLogDirPartitionResult::default()
                                        .with_partition_index(p)
                                        .with_error_code(cluster_refused)
                                })
                                .collect(),
                        )
                })
                .collect();
            ResponseKind::AlterReplicaLogDirs(
                AlterReplicaLogDirsResponse::default().with_results(results),
            )
        }
        RequestKind::WriteTxnMarkers(r) if !cluster(shard, client, operation::CLUSTER_ACTION) => {
            use kafka_protocol::messages::write_txn_markers_response::*;
            let markers = r
                .markers
                .iter()
                .map(|m| {
                    let topics = m
                        .topics
                        .iter()
                        .map(|t| {
                            WritableTxnMarkerTopicResult::default()
                                .with_name(t.name.clone())
                                .with_partitions(
                                    t.partition_indexes
                                        .iter()
                                        .map(|&p| {
                                            WritableTxnMarkerPartitionResult::default()
                                                .with_partition_index(p)
                                                .with_error_code(cluster_refused)
                                        })
                                        .collect(),
                                )
                        })
                        .collect();
                    WritableTxnMarkerResult::default()
                        .with_producer_id(m.producer_id)
                        .with_topics(topics)
                })
                .collect();
            ResponseKind::WriteTxnMarkers(WriteTxnMarkersResponse::default().with_markers(markers))
        }
        RequestKind::ReadShareGroupState(_)
        | RequestKind::WriteShareGroupState(_)
        | RequestKind::InitializeShareGroupState(_)
        | RequestKind::DeleteShareGroupState(_)
        | RequestKind::ReadShareGroupStateSummary(_)
            if !cluster(shard, client, operation::CLUSTER_ACTION) =>
        {
            super::share_group_state::refused(request, cluster_refused)
                .expect("a share state request")
        }
        RequestKind::ListConfigResources(_)
            if !cluster(shard, client, operation::DESCRIBE_CONFIGS) =>
        {
            ResponseKind::ListConfigResources(
                ListConfigResourcesResponse::default().with_error_code(cluster_refused),
            )
        }
        RequestKind::DescribeLogDirs(_) if !cluster(shard, client, operation::DESCRIBE) => {
            ResponseKind::DescribeLogDirs(
                DescribeLogDirsResponse::default().with_error_code(cluster_refused),
            )
        }
        RequestKind::DescribeUserScramCredentials(_)
            if !cluster(shard, client, operation::DESCRIBE) =>
        {
            ResponseKind::DescribeUserScramCredentials(
                DescribeUserScramCredentialsResponse::default().with_error_code(cluster_refused),
            )
        }
        RequestKind::AlterUserScramCredentials(r) if !cluster(shard, client, operation::ALTER) => {
            use alter_user_scram_credentials_response::AlterUserScramCredentialsResult;
            let users: std::collections::BTreeSet<&str> = r
                .deletions
                .iter()
                .map(|d| d.name.as_str())
                .chain(r.upsertions.iter().map(|u| u.name.as_str()))
                .collect();
            ResponseKind::AlterUserScramCredentials(
                AlterUserScramCredentialsResponse::default().with_results(
                    users
                        .into_iter()
                        .map(|u| {
                            AlterUserScramCredentialsResult::default()
                                .with_user(StrBytes::from_string(u.to_string()))
                                .with_error_code(cluster_refused)
                        })
                        .collect(),
                ),
            )
        }
        RequestKind::DescribeClientQuotas(_)
            if !cluster(shard, client, operation::DESCRIBE_CONFIGS) =>
        {
            ResponseKind::DescribeClientQuotas(
                DescribeClientQuotasResponse::default().with_error_code(cluster_refused),
            )
        }
        _ => return None,
    })
}

/// Whether `client` may do `operation` on the cluster.
pub fn cluster(shard: &Shard, client: &Client, operation: i8) -> bool {
    allowed(
        shard,
        client,
        operation,
        resource_type::CLUSTER,
        acl::CLUSTER_NAME,
    )
}

pub fn topic(shard: &Shard, client: &Client, operation: i8, topic: &TopicName) -> bool {
    allowed(
        shard,
        client,
        operation,
        resource_type::TOPIC,
        topic.as_str(),
    )
}

/// The names among `topics` that `client` may `operation`.
pub fn topics_allowed<'a>(
    shard: &Shard,
    client: &Client,
    operation: i8,
    topics: impl IntoIterator<Item = &'a TopicName>,
) -> std::collections::HashSet<String> {
    topics
        .into_iter()
        .filter(|t| topic(shard, client, operation, t))
        .map(|t| t.0.to_string())
        .collect()
}

pub fn group(shard: &Shard, client: &Client, operation: i8, group: &str) -> bool {
    allowed(shard, client, operation, resource_type::GROUP, group)
}

pub fn transactional_id(shard: &Shard, client: &Client, operation: i8, id: &str) -> bool {
    allowed(
        shard,
        client,
        operation,
        resource_type::TRANSACTIONAL_ID,
        id,
    )
}

fn operation_name(op: i8) -> &'static str {
    use operation::*;
    match op {
        ALL => "ALL",
        READ => "READ",
        WRITE => "WRITE",
        CREATE => "CREATE",
        DELETE => "DELETE",
        ALTER => "ALTER",
        DESCRIBE => "DESCRIBE",
        CLUSTER_ACTION => "CLUSTER_ACTION",
        DESCRIBE_CONFIGS => "DESCRIBE_CONFIGS",
        ALTER_CONFIGS => "ALTER_CONFIGS",
        IDEMPOTENT_WRITE => "IDEMPOTENT_WRITE",
        CREATE_TOKENS => "CREATE_TOKENS",
        DESCRIBE_TOKENS => "DESCRIBE_TOKENS",
        TWO_PHASE_COMMIT => "TWO_PHASE_COMMIT",
        _ => "UNKNOWN",
    }
}

fn resource_type_name(t: i8) -> &'static str {
    use resource_type::*;
    match t {
        TOPIC => "TOPIC",
        GROUP => "GROUP",
        CLUSTER => "CLUSTER",
        TRANSACTIONAL_ID => "TRANSACTIONAL_ID",
        DELEGATION_TOKEN => "DELEGATION_TOKEN",
        USER => "USER",
        _ => "UNKNOWN",
    }
}
