//! The controller's Kafka APIs, and the conversions between Kafka's wire types and the
//! controller core's requests (`sluice_replication::controller`).
//!
//! The CONTROLLER listener answers ApiVersions, DescribeQuorum, BrokerRegistration,
//! BrokerHeartbeat, AllocateProducerIds, AlterPartition, AssignReplicasToDirs (lost replicas only)
//! and Envelope (admin requests a broker forwards, as
//! Kafka's brokers forward them: the client's request whole, answered with its response
//! whole). The same `admin` function serves an admin request arriving at a combined node that
//! is the active controller, so there is one path for both.

use std::rc::Rc;

use bytes::Bytes;
use kafka_protocol::messages::api_versions_response::ApiVersion;
use kafka_protocol::messages::create_partitions_response::CreatePartitionsTopicResult;
use kafka_protocol::messages::create_topics_response::CreatableTopicResult;
use kafka_protocol::messages::delete_topics_response::DeletableTopicResult;
use kafka_protocol::messages::describe_quorum_response::{PartitionData, ReplicaState, TopicData};
use kafka_protocol::messages::incremental_alter_configs_response::AlterConfigsResourceResponse;
use kafka_protocol::messages::*;
use kafka_protocol::protocol::{Decodable, StrBytes};
use kafka_protocol::ResponseError;
use sluice_replication::controller as core;
use sluice_replication::records::{BrokerEpoch, BrokerId, Endpoint, Offset, TopicId};

use super::node::ClusterNode;

/// The APIs of the CONTROLLER listener, with the versions answered.
pub const CONTROLLER_APIS: &[(ApiKey, i16, i16)] = &[
    (ApiKey::ApiVersions, 0, 4),
    // Served before a SASL login (`transport`), as Kafka's controllers list them; after one,
    // or on a listener without SASL, they close the connection.
    (ApiKey::SaslHandshake, 0, 1),
    (ApiKey::SaslAuthenticate, 0, 2),
    (ApiKey::DescribeQuorum, 0, 2),
    // For admin clients given `bootstrap.controllers` (KIP-919): the controllers.
    (ApiKey::DescribeCluster, 1, 2),
    (ApiKey::BrokerRegistration, 0, 4),
    (ApiKey::BrokerHeartbeat, 0, 1),
    (ApiKey::AllocateProducerIds, 0, 0),
    // 2 names topics by id; 3 gives each new ISR member's broker epoch (KIP-903).
    (ApiKey::AlterPartition, 2, 3),
    // Only for replicas in the LOST directory (KIP-858): a broker's failed log directory.
    (ApiKey::AssignReplicasToDirs, 0, 0),
    (ApiKey::Envelope, 0, 0),
];

/// Kafka's `DirectoryId.LOST`: the directory of replicas whose log directory failed.
pub const LOST_DIRECTORY: uuid::Uuid = uuid::Uuid::from_u128(1);

/// Admin APIs forwarded to the controller inside an Envelope.
pub const FORWARDED_APIS: &[(ApiKey, i16, i16)] = &[
    (ApiKey::CreateTopics, 2, 7),
    (ApiKey::DeleteTopics, 1, 6),
    (ApiKey::CreatePartitions, 0, 3),
    (ApiKey::IncrementalAlterConfigs, 0, 1),
    (ApiKey::ElectLeaders, 0, 2),
    (ApiKey::AlterPartitionReassignments, 0, 1),
    (ApiKey::ListPartitionReassignments, 0, 0),
    (ApiKey::UpdateFeatures, 1, 2),
    (ApiKey::AlterUserScramCredentials, 0, 0),
    (ApiKey::CreateAcls, 0, 3),
    (ApiKey::DeleteAcls, 0, 3),
    (ApiKey::AlterClientQuotas, 0, 1),
];

fn answered(table: &[(ApiKey, i16, i16)], key: ApiKey, version: i16) -> bool {
    table
        .iter()
        .any(|&(k, min, max)| k == key && (min..=max).contains(&version))
}

/// A request frame's body (after the size) split into key, version, header and body.
fn decode_request(mut body: Bytes) -> anyhow::Result<(ApiKey, i16, RequestHeader, RequestKind)> {
    if body.len() < 4 {
        anyhow::bail!("request shorter than a header");
    }
    let key = ApiKey::try_from(i16::from_be_bytes([body[0], body[1]]))
        .map_err(|_| anyhow::anyhow!("unknown API key"))?;
    let version = i16::from_be_bytes([body[2], body[3]]);
    let header = RequestHeader::decode(&mut body, key.request_header_version(version))?;
    let request = RequestKind::decode(key, &mut body, version)?;
    Ok((key, version, header, request))
}

/// Answers one request frame of the CONTROLLER listener; `None` closes the connection.
pub async fn answer(node: &Rc<ClusterNode>, frame: Bytes) -> Option<Bytes> {
    // ApiVersions at a version this listener does not know: answered with v0 and
    // UNSUPPORTED_VERSION and the versions it does know (KIP-511), so the client asks again.
    if frame.len() >= 8 {
        let key = i16::from_be_bytes([frame[0], frame[1]]);
        let version = i16::from_be_bytes([frame[2], frame[3]]);
        if key == ApiKey::ApiVersions as i16
            && !answered(CONTROLLER_APIS, ApiKey::ApiVersions, version)
        {
            let correlation_id = i32::from_be_bytes([frame[4], frame[5], frame[6], frame[7]]);
            let mut response = api_versions();
            response.error_code = ResponseError::UnsupportedVersion.code();
            return crate::codec::encode_response(
                ApiKey::ApiVersions,
                0,
                correlation_id,
                &ResponseKind::ApiVersions(response),
            )
            .ok();
        }
    }
    let raw = frame.clone();
    let (key, version, header, request) = match decode_request(frame) {
        Ok(r) => r,
        Err(e) => {
            tracing::warn!(error = %e, "malformed request on the CONTROLLER listener; closing the connection");
            return None;
        }
    };
    if !answered(CONTROLLER_APIS, key, version) {
        tracing::warn!(
            ?key,
            version,
            "the CONTROLLER listener does not answer this API; closing the connection"
        );
        return None;
    }
    let response = match request {
        RequestKind::ApiVersions(_) => ResponseKind::ApiVersions(api_versions()),
        // Only the leader knows every replica's log end: a follower asks it.
        RequestKind::DescribeQuorum(_) if !node.is_quorum_leader() => {
            if let Some(answer) = node.ask_leader(&raw).await {
                return Some(answer);
            }
            ResponseKind::DescribeQuorum(describe_quorum(node, version))
        }
        RequestKind::DescribeQuorum(_) => {
            ResponseKind::DescribeQuorum(describe_quorum(node, version))
        }
        RequestKind::DescribeCluster(r) => {
            ResponseKind::DescribeCluster(describe_controllers(node, &r))
        }
        RequestKind::Envelope(r) => ResponseKind::Envelope(envelope(node, r).await),
        RequestKind::AssignReplicasToDirs(r) => {
            ResponseKind::AssignReplicasToDirs(assign_replicas_to_dirs(node, r).await)
        }
        other => match controller_request(&other) {
            Some(request) => {
                let response = node.submit(request).await;
                controller_response(response)?
            }
            None => return None,
        },
    };
    crate::codec::encode_response(key, version, header.correlation_id, &response).ok()
}

fn api_versions() -> ApiVersionsResponse {
    let mut r = ApiVersionsResponse::default();
    r.api_keys = CONTROLLER_APIS
        .iter()
        .map(|&(k, min, max)| {
            ApiVersion::default()
                .with_api_key(k as i16)
                .with_min_version(min)
                .with_max_version(max)
        })
        .collect();
    r
}

/// DescribeQuorum: the metadata partition's leader, epoch, high watermark, voters and observers
/// with their log end offsets (known on the leader), as `kafka-metadata-quorum` shows them.
pub fn describe_quorum(node: &ClusterNode, version: i16) -> DescribeQuorumResponse {
    let status = node.quorum_status();
    // The node's clock is monotonic; Kafka reports wall-clock milliseconds.
    let wall_now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as i64);
    let wall = |t: Option<u64>| t.map_or(-1, |t| wall_now - status.now_ms.saturating_sub(t) as i64);
    // The replicas' directory ids stay zero, as Kafka reports them for a static quorum
    // (`controller.quorum.voters`, kraft.version 0).
    let replica = |r: &sluice_replication::quorum::ReplicaState| {
        ReplicaState::default()
            .with_replica_id(kafka_protocol::messages::BrokerId(r.replica_id as i32))
            .with_log_end_offset(r.log_end_offset)
            .with_last_fetch_timestamp(wall(r.last_fetch_ms))
            .with_last_caught_up_timestamp(wall(r.last_caught_up_ms))
    };
    let partition = PartitionData::default()
        .with_partition_index(0)
        .with_leader_id(kafka_protocol::messages::BrokerId(status.leader_id as i32))
        .with_leader_epoch(status.leader_epoch as i32)
        .with_high_watermark(status.high_watermark)
        .with_current_voters(status.voters.iter().map(replica).collect())
        .with_observers(status.observers.iter().map(replica).collect());
    let mut response = DescribeQuorumResponse::default().with_topics(vec![TopicData::default()
        .with_topic_name(TopicName(StrBytes::from_static_str("__cluster_metadata")))
        .with_partitions(vec![partition])]);
    if version >= 2 {
        response.nodes = node
            .voter_endpoints()
            .into_iter()
            .map(|(id, host, port)| {
                kafka_protocol::messages::describe_quorum_response::Node::default()
                    .with_node_id(kafka_protocol::messages::BrokerId(id as i32))
                    .with_listeners(vec![
                        kafka_protocol::messages::describe_quorum_response::Listener::default()
                            .with_name(StrBytes::from_static_str("CONTROLLER"))
                            .with_host(StrBytes::from_string(host))
                            .with_port(port),
                    ])
            })
            .collect();
    }
    response
}

/// DescribeCluster on the CONTROLLER listener: the controllers, with their controller
/// endpoints, and the active one as the controller (Kafka answers endpoint type 2 so).
fn describe_controllers(
    node: &ClusterNode,
    request: &DescribeClusterRequest,
) -> DescribeClusterResponse {
    use kafka_protocol::messages::describe_cluster_response::DescribeClusterBroker;
    let mut response = DescribeClusterResponse::default()
        .with_endpoint_type(request.endpoint_type)
        .with_cluster_id(StrBytes::from_string(node.cluster_id().to_string()))
        .with_controller_id(kafka_protocol::messages::BrokerId(
            node.leader_id().map_or(-1, |l| l as i32),
        ));
    // Endpoint type 1 asks for brokers, which a controller listener does not list.
    if request.endpoint_type == 1 {
        response.error_code = ResponseError::UnsupportedEndpointType.code();
        return response;
    }
    response.brokers = node
        .voter_endpoints()
        .into_iter()
        .map(|(id, host, port)| {
            DescribeClusterBroker::default()
                .with_broker_id(kafka_protocol::messages::BrokerId(id as i32))
                .with_host(StrBytes::from_string(host))
                .with_port(port as i32)
        })
        .collect();
    response
}

/// Runs a forwarded admin request and wraps its response.
async fn envelope(node: &Rc<ClusterNode>, request: EnvelopeRequest) -> EnvelopeResponse {
    let inner = match decode_request(request.request_data.clone()) {
        Ok(r) => r,
        Err(e) => {
            tracing::warn!(error = %e, "a forwarded request does not decode");
            return EnvelopeResponse::default()
                .with_error_code(ResponseError::InvalidRequest.code());
        }
    };
    let (key, version, header, request) = inner;
    if !answered(FORWARDED_APIS, key, version) {
        return EnvelopeResponse::default().with_error_code(ResponseError::InvalidRequest.code());
    }
    let response = admin(node, request, version).await;
    match crate::codec::encode_response(key, version, header.correlation_id, &response) {
        Ok(frame) => EnvelopeResponse::default().with_response_data(Some(frame.slice(4..))),
        Err(e) => {
            tracing::error!(error = %e, "encoding a forwarded response failed");
            EnvelopeResponse::default().with_error_code(ResponseError::UnknownServerError.code())
        }
    }
}

/// AssignReplicasToDirs: the replicas a broker assigns to the LOST directory (its log directory
/// failed) leave their ISRs and leaderships (`core::LostReplicasRequest`). Sluice's controller
/// keeps no other directory assignments (placement on a broker's disks is the broker's own
/// business), so replicas assigned to any other directory get INVALID_REQUEST.
async fn assign_replicas_to_dirs(
    node: &Rc<ClusterNode>,
    r: AssignReplicasToDirsRequest,
) -> AssignReplicasToDirsResponse {
    use assign_replicas_to_dirs_response::{DirectoryData, PartitionData, TopicData};
    let lost: Vec<(TopicId, i32)> = r
        .directories
        .iter()
        .filter(|d| d.id == LOST_DIRECTORY)
        .flat_map(|d| {
            d.topics.iter().flat_map(|t| {
                t.partitions
                    .iter()
                    .map(|p| (TopicId(t.topic_id), p.partition_index))
            })
        })
        .collect();
    let answer = node
        .submit(core::ControllerRequest::LostReplicas(
            core::LostReplicasRequest {
                broker_id: BrokerId(r.broker_id.0),
                broker_epoch: BrokerEpoch(r.broker_epoch),
                partitions: lost,
            },
        ))
        .await;
    let core::ControllerResponse::LostReplicas(answer) = answer else {
        unreachable!("the controller answers a request with its own response");
    };
    let mut codes = answer.partitions.into_iter();
    let directories = r
        .directories
        .iter()
        .map(|d| {
            let ours = d.id == LOST_DIRECTORY;
            DirectoryData::default().with_id(d.id).with_topics(
                d.topics
                    .iter()
                    .map(|t| {
                        TopicData::default()
                            .with_topic_id(t.topic_id)
                            .with_partitions(
                                t.partitions
                                    .iter()
                                    .map(|p| {
                                        let code = if !ours {
                                            ResponseError::InvalidRequest.code()
                                        } else if answer.error_code != 0 {
                                            answer.error_code
                                        } else {
                                            codes.next().map_or(0, |(_, _, code)| code)
                                        };
                                        PartitionData::default()
                                            .with_partition_index(p.partition_index)
                                            .with_error_code(code)
                                    })
                                    .collect(),
                            )
                    })
                    .collect(),
            )
        })
        .collect();
    AssignReplicasToDirsResponse::default()
        .with_error_code(answer.error_code)
        .with_directories(directories)
}

/// An admin request at the active controller (or the NOT_CONTROLLER answer when it is not).
pub async fn admin(node: &Rc<ClusterNode>, request: RequestKind, version: i16) -> ResponseKind {
    let Some(core_request) = controller_request(&request) else {
        unreachable!("only forwarded admin APIs reach here");
    };
    let response = node.submit(core_request).await;
    admin_response(response, version)
}

fn name(s: &StrBytes) -> String {
    s.to_string()
}

fn broker_ids(ids: &[kafka_protocol::messages::BrokerId]) -> Vec<BrokerId> {
    ids.iter().map(|b| BrokerId(b.0)).collect()
}

/// Kafka's request as the controller core's, for the APIs the controller answers.
pub fn controller_request(request: &RequestKind) -> Option<core::ControllerRequest> {
    use core::ControllerRequest as C;
    Some(match request {
        RequestKind::CreateTopics(r) => C::CreateTopics(core::CreateTopicsRequest {
            validate_only: r.validate_only,
            topics: r
                .topics
                .iter()
                .map(|t| core::CreatableTopic {
                    name: name(&t.name.0),
                    num_partitions: t.num_partitions,
                    replication_factor: t.replication_factor,
                    assignments: t
                        .assignments
                        .iter()
                        .map(|a| (a.partition_index, broker_ids(&a.broker_ids)))
                        .collect(),
                    configs: t
                        .configs
                        .iter()
                        .map(|c| (name(&c.name), c.value.as_ref().map(name)))
                        .collect(),
                })
                .collect(),
        }),
        RequestKind::DeleteTopics(r) => {
            let mut topics: Vec<core::TopicRef> = r
                .topic_names
                .iter()
                .map(|n| core::TopicRef::Name(name(&n.0)))
                .collect();
            topics.extend(r.topics.iter().map(|t| match &t.name {
                Some(n) => core::TopicRef::Name(name(&n.0)),
                None => core::TopicRef::Id(TopicId(t.topic_id)),
            }));
            C::DeleteTopics(core::DeleteTopicsRequest { topics })
        }
        RequestKind::CreatePartitions(r) => C::CreatePartitions(core::CreatePartitionsRequest {
            validate_only: r.validate_only,
            topics: r
                .topics
                .iter()
                .map(|t| core::CreatePartitionsTopic {
                    name: name(&t.name.0),
                    count: t.count,
                    assignments: t
                        .assignments
                        .as_ref()
                        .map(|a| a.iter().map(|a| broker_ids(&a.broker_ids)).collect()),
                })
                .collect(),
        }),
        RequestKind::IncrementalAlterConfigs(r) => {
            C::IncrementalAlterConfigs(core::IncrementalAlterConfigsRequest {
                validate_only: r.validate_only,
                resources: r
                    .resources
                    .iter()
                    .map(|res| core::AlterConfigsResource {
                        resource_type: res.resource_type,
                        resource_name: name(&res.resource_name),
                        configs: res
                            .configs
                            .iter()
                            .map(|c| core::AlterableConfig {
                                name: name(&c.name),
                                op: match c.config_operation {
                                    1 => core::AlterConfigOp::Delete,
                                    2 => core::AlterConfigOp::Append,
                                    3 => core::AlterConfigOp::Subtract,
                                    _ => core::AlterConfigOp::Set,
                                },
                                value: c.value.as_ref().map(name),
                            })
                            .collect(),
                    })
                    .collect(),
            })
        }
        RequestKind::BrokerRegistration(r) => {
            C::BrokerRegistration(core::BrokerRegistrationRequest {
                broker_id: BrokerId(r.broker_id.0),
                cluster_id: name(&r.cluster_id),
                incarnation_id: r.incarnation_id,
                listeners: r
                    .listeners
                    .iter()
                    .map(|l| Endpoint {
                        name: name(&l.name),
                        host: name(&l.host),
                        port: l.port,
                        security_protocol: l.security_protocol,
                    })
                    .collect(),
                rack: r.rack.as_ref().map(name),
                previous_broker_epoch: r.previous_broker_epoch,
            })
        }
        RequestKind::BrokerHeartbeat(r) => C::BrokerHeartbeat(core::BrokerHeartbeatRequest {
            broker_id: BrokerId(r.broker_id.0),
            broker_epoch: BrokerEpoch(r.broker_epoch),
            current_metadata_offset: Offset(r.current_metadata_offset),
            wants_fence: r.want_fence,
            wants_shut_down: r.want_shut_down,
        }),
        RequestKind::AllocateProducerIds(r) => {
            C::AllocateProducerIds(core::AllocateProducerIdsRequest {
                broker_id: BrokerId(r.broker_id.0),
                broker_epoch: BrokerEpoch(r.broker_epoch),
            })
        }
        RequestKind::AlterPartition(r) => C::AlterPartition(core::AlterPartitionRequest {
            broker_id: BrokerId(r.broker_id.0),
            broker_epoch: BrokerEpoch(r.broker_epoch),
            partitions: r
                .topics
                .iter()
                .flat_map(|t| {
                    t.partitions.iter().map(|p| core::AlterPartitionItem {
                        topic_id: TopicId(t.topic_id),
                        partition_id: p.partition_index,
                        leader_epoch: sluice_replication::records::LeaderEpoch(p.leader_epoch),
                        partition_epoch: sluice_replication::records::PartitionEpoch(
                            p.partition_epoch,
                        ),
                        // Version 3 carries broker epochs; 2 only the ids.
                        new_isr: if p.new_isr_with_epochs.is_empty() {
                            p.new_isr
                                .iter()
                                .map(|b| (BrokerId(b.0), BrokerEpoch(-1)))
                                .collect()
                        } else {
                            p.new_isr_with_epochs
                                .iter()
                                .map(|b| (BrokerId(b.broker_id.0), BrokerEpoch(b.broker_epoch)))
                                .collect()
                        },
                    })
                })
                .collect(),
        }),
        RequestKind::ElectLeaders(r) => C::ElectLeaders(core::ElectLeadersRequest {
            election_type: r.election_type,
            partitions: r.topic_partitions.as_ref().map(|topics| {
                topics
                    .iter()
                    .map(|t| (name(&t.topic.0), t.partitions.clone()))
                    .collect()
            }),
        }),
        RequestKind::AlterPartitionReassignments(r) => {
            C::AlterPartitionReassignments(core::AlterPartitionReassignmentsRequest {
                topics: r
                    .topics
                    .iter()
                    .map(|t| {
                        let partitions = t
                            .partitions
                            .iter()
                            .map(|p| {
                                let target = p
                                    .replicas
                                    .as_ref()
                                    .map(|v| v.iter().map(|b| BrokerId(b.0)).collect());
                                (p.partition_index, target)
                            })
                            .collect();
                        (name(&t.name.0), partitions)
                    })
                    .collect(),
                allow_replication_factor_change: r.allow_replication_factor_change,
            })
        }
        RequestKind::ListPartitionReassignments(r) => {
            C::ListPartitionReassignments(core::ListPartitionReassignmentsRequest {
                topics: r.topics.as_ref().map(|topics| {
                    topics
                        .iter()
                        .map(|t| (name(&t.name.0), t.partition_indexes.clone()))
                        .collect()
                }),
            })
        }
        // Checked by the broker that took it (`cluster::update_features`).
        RequestKind::UpdateFeatures(r) => C::UpdateFeatures(core::UpdateFeaturesRequest {
            updates: r
                .feature_updates
                .iter()
                .map(|u| (name(&u.feature), u.max_version_level.max(0)))
                .collect(),
            validate_only: r.validate_only,
        }),
        // The keys are derived here, at the controller; the salted password goes no further.
        RequestKind::AlterUserScramCredentials(r) => {
            C::AlterUserScramCredentials(core::AlterUserScramCredentialsRequest {
                deletions: r
                    .deletions
                    .iter()
                    .map(|d| (name(&d.name), d.mechanism))
                    .collect(),
                upsertions: r
                    .upsertions
                    .iter()
                    .map(
                        |u| match crate::security::scram::Mechanism::from_id(u.mechanism) {
                            Some(m) => {
                                m.credential(&u.name, &u.salt, &u.salted_password, u.iterations)
                            }
                            // Refused by the controller as an unknown mechanism.
                            None => sluice_replication::records::UserScramCredentialRecord {
                                name: name(&u.name),
                                mechanism: u.mechanism,
                                salt: Vec::new(),
                                stored_key: Vec::new(),
                                server_key: Vec::new(),
                                iterations: u.iterations,
                            },
                        },
                    )
                    .collect(),
            })
        }
        RequestKind::CreateAcls(r) => C::CreateAcls(core::CreateAclsRequest {
            creations: r
                .creations
                .iter()
                .map(|c| sluice_replication::acl::AclBinding {
                    resource_type: c.resource_type,
                    resource_name: name(&c.resource_name),
                    pattern_type: c.resource_pattern_type,
                    principal: name(&c.principal),
                    host: name(&c.host),
                    operation: c.operation,
                    permission: c.permission_type,
                })
                .collect(),
        }),
        RequestKind::DeleteAcls(r) => C::DeleteAcls(core::DeleteAclsRequest {
            filters: r
                .filters
                .iter()
                .map(|f| sluice_replication::acl::AclFilter {
                    resource_type: f.resource_type_filter,
                    resource_name: f.resource_name_filter.as_ref().map(name),
                    pattern_type: f.pattern_type_filter,
                    principal: f.principal_filter.as_ref().map(name),
                    host: f.host_filter.as_ref().map(name),
                    operation: f.operation,
                    permission: f.permission_type,
                })
                .collect(),
        }),
        RequestKind::AlterClientQuotas(r) => C::AlterClientQuotas(core::AlterClientQuotasRequest {
            entries: r
                .entries
                .iter()
                .map(|e| core::QuotaAlteration {
                    entity: e
                        .entity
                        .iter()
                        .map(|p| (name(&p.entity_type), p.entity_name.as_ref().map(name)))
                        .collect(),
                    ops: e
                        .ops
                        .iter()
                        .map(|op| {
                            let value = (!op.remove)
                                .then_some(sluice_replication::records::QuotaValue(op.value));
                            (name(&op.key), value)
                        })
                        .collect(),
                })
                .collect(),
            validate_only: r.validate_only,
        }),
        _ => return None,
    })
}

/// The core's AlterPartition answer as Kafka's, partitions grouped under their topics in the
/// order they came.
fn alter_partition_response(r: core::AlterPartitionResponse) -> AlterPartitionResponse {
    use kafka_protocol::messages::alter_partition_response::{
        PartitionData as Answered, TopicData as AnsweredTopic,
    };
    let mut topics: Vec<AnsweredTopic> = Vec::new();
    for p in r.partitions {
        let data = Answered::default()
            .with_partition_index(p.partition_id)
            .with_error_code(p.error_code)
            .with_leader_id(kafka_protocol::messages::BrokerId(p.leader.0))
            .with_leader_epoch(p.leader_epoch.0)
            .with_isr(
                p.isr
                    .iter()
                    .map(|b| kafka_protocol::messages::BrokerId(b.0))
                    .collect(),
            )
            .with_partition_epoch(p.partition_epoch.0);
        match topics.iter_mut().find(|t| t.topic_id == p.topic_id.0) {
            Some(t) => t.partitions.push(data),
            None => topics.push(
                AnsweredTopic::default()
                    .with_topic_id(p.topic_id.0)
                    .with_partitions(vec![data]),
            ),
        }
    }
    AlterPartitionResponse::default()
        .with_error_code(r.error_code)
        .with_topics(topics)
}

/// The controller core's answer to an inter-node request, as Kafka's response.
fn controller_response(response: core::ControllerResponse) -> Option<ResponseKind> {
    use core::ControllerResponse as R;
    Some(match response {
        R::BrokerRegistration(r) => ResponseKind::BrokerRegistration(
            BrokerRegistrationResponse::default()
                .with_error_code(r.error_code)
                .with_broker_epoch(r.broker_epoch),
        ),
        R::BrokerHeartbeat(r) => ResponseKind::BrokerHeartbeat(
            BrokerHeartbeatResponse::default()
                .with_error_code(r.error_code)
                .with_is_caught_up(r.is_caught_up)
                .with_is_fenced(r.is_fenced)
                .with_should_shut_down(r.should_shut_down),
        ),
        R::AllocateProducerIds(r) => ResponseKind::AllocateProducerIds(
            AllocateProducerIdsResponse::default()
                .with_error_code(r.error_code)
                .with_producer_id_start(ProducerId(r.producer_id_start))
                .with_producer_id_len(r.producer_id_len),
        ),
        R::AlterPartition(r) => ResponseKind::AlterPartition(alter_partition_response(r)),
        _ => return None,
    })
}

/// Kafka's response to an inter-node request as the controller core's (the broker's side).
pub fn core_response(response: &ResponseKind) -> Option<core::ControllerResponse> {
    use core::ControllerResponse as R;
    Some(match response {
        ResponseKind::BrokerRegistration(r) => {
            R::BrokerRegistration(core::BrokerRegistrationResponse {
                error_code: r.error_code,
                broker_epoch: r.broker_epoch,
            })
        }
        ResponseKind::BrokerHeartbeat(r) => R::BrokerHeartbeat(core::BrokerHeartbeatResponse {
            error_code: r.error_code,
            is_caught_up: r.is_caught_up,
            is_fenced: r.is_fenced,
            should_shut_down: r.should_shut_down,
        }),
        ResponseKind::AllocateProducerIds(r) => {
            R::AllocateProducerIds(core::AllocateProducerIdsResponse {
                error_code: r.error_code,
                producer_id_start: r.producer_id_start.0,
                producer_id_len: r.producer_id_len,
            })
        }
        ResponseKind::AssignReplicasToDirs(r) => R::LostReplicas(core::LostReplicasResponse {
            error_code: r.error_code,
            partitions: r
                .directories
                .iter()
                .flat_map(|d| {
                    d.topics.iter().flat_map(|t| {
                        t.partitions
                            .iter()
                            .map(|p| (TopicId(t.topic_id), p.partition_index, p.error_code))
                    })
                })
                .collect(),
        }),
        ResponseKind::AlterPartition(r) => R::AlterPartition(core::AlterPartitionResponse {
            error_code: r.error_code,
            partitions: r
                .topics
                .iter()
                .flat_map(|t| {
                    t.partitions.iter().map(|p| core::AlterPartitionResult {
                        topic_id: TopicId(t.topic_id),
                        partition_id: p.partition_index,
                        error_code: p.error_code,
                        leader: BrokerId(p.leader_id.0),
                        leader_epoch: sluice_replication::records::LeaderEpoch(p.leader_epoch),
                        isr: p.isr.iter().map(|b| BrokerId(b.0)).collect(),
                        partition_epoch: sluice_replication::records::PartitionEpoch(
                            p.partition_epoch,
                        ),
                    })
                })
                .collect(),
        }),
        _ => return None,
    })
}

/// The core's request as Kafka's, to send to the active controller.
pub fn kafka_request(request: &core::ControllerRequest) -> Option<(ApiKey, i16, RequestKind)> {
    use core::ControllerRequest as C;
    Some(match request {
        C::BrokerRegistration(r) => (
            ApiKey::BrokerRegistration,
            4,
            RequestKind::BrokerRegistration(
                BrokerRegistrationRequest::default()
                    .with_broker_id(kafka_protocol::messages::BrokerId(r.broker_id.0))
                    .with_cluster_id(StrBytes::from_string(r.cluster_id.clone()))
                    .with_incarnation_id(r.incarnation_id)
                    .with_listeners(
                        r.listeners
                            .iter()
                            .map(|l| {
                                broker_registration_request::Listener::default()
                                    .with_name(StrBytes::from_string(l.name.clone()))
                                    .with_host(StrBytes::from_string(l.host.clone()))
                                    .with_port(l.port)
                                    .with_security_protocol(l.security_protocol)
                            })
                            .collect(),
                    )
                    .with_rack(r.rack.clone().map(StrBytes::from_string))
                    .with_previous_broker_epoch(r.previous_broker_epoch),
            ),
        ),
        C::BrokerHeartbeat(r) => (
            ApiKey::BrokerHeartbeat,
            1,
            RequestKind::BrokerHeartbeat(
                BrokerHeartbeatRequest::default()
                    .with_broker_id(kafka_protocol::messages::BrokerId(r.broker_id.0))
                    .with_broker_epoch(r.broker_epoch.0)
                    .with_current_metadata_offset(r.current_metadata_offset.0)
                    .with_want_fence(r.wants_fence)
                    .with_want_shut_down(r.wants_shut_down),
            ),
        ),
        C::AllocateProducerIds(r) => (
            ApiKey::AllocateProducerIds,
            0,
            RequestKind::AllocateProducerIds(
                AllocateProducerIdsRequest::default()
                    .with_broker_id(kafka_protocol::messages::BrokerId(r.broker_id.0))
                    .with_broker_epoch(r.broker_epoch.0),
            ),
        ),
        C::AlterPartition(r) => (
            ApiKey::AlterPartition,
            3,
            RequestKind::AlterPartition(alter_partition_request(r)),
        ),
        C::LostReplicas(r) => {
            use assign_replicas_to_dirs_request::{DirectoryData, PartitionData, TopicData};
            let mut topics: Vec<TopicData> = Vec::new();
            for &(topic_id, partition) in &r.partitions {
                let p = PartitionData::default().with_partition_index(partition);
                match topics.iter_mut().find(|t| t.topic_id == topic_id.0) {
                    Some(t) => t.partitions.push(p),
                    None => topics.push(
                        TopicData::default()
                            .with_topic_id(topic_id.0)
                            .with_partitions(vec![p]),
                    ),
                }
            }
            (
                ApiKey::AssignReplicasToDirs,
                0,
                RequestKind::AssignReplicasToDirs(
                    AssignReplicasToDirsRequest::default()
                        .with_broker_id(kafka_protocol::messages::BrokerId(r.broker_id.0))
                        .with_broker_epoch(r.broker_epoch.0)
                        .with_directories(vec![DirectoryData::default()
                            .with_id(LOST_DIRECTORY)
                            .with_topics(topics)]),
                ),
            )
        }
        _ => return None,
    })
}

/// The core's AlterPartition as Kafka's version 3 (ISR members with their broker epochs),
/// partitions grouped under their topics in the order they come.
fn alter_partition_request(r: &core::AlterPartitionRequest) -> AlterPartitionRequest {
    use kafka_protocol::messages::alter_partition_request::{
        BrokerState, PartitionData, TopicData,
    };
    let mut topics: Vec<TopicData> = Vec::new();
    for p in &r.partitions {
        let data = PartitionData::default()
            .with_partition_index(p.partition_id)
            .with_leader_epoch(p.leader_epoch.0)
            .with_partition_epoch(p.partition_epoch.0)
            .with_new_isr_with_epochs(
                p.new_isr
                    .iter()
                    .map(|(b, e)| {
                        BrokerState::default()
                            .with_broker_id(kafka_protocol::messages::BrokerId(b.0))
                            .with_broker_epoch(e.0)
                    })
                    .collect(),
            );
        match topics.iter_mut().find(|t| t.topic_id == p.topic_id.0) {
            Some(t) => t.partitions.push(data),
            None => topics.push(
                TopicData::default()
                    .with_topic_id(p.topic_id.0)
                    .with_partitions(vec![data]),
            ),
        }
    }
    AlterPartitionRequest::default()
        .with_broker_id(kafka_protocol::messages::BrokerId(r.broker_id.0))
        .with_broker_epoch(r.broker_epoch.0)
        .with_topics(topics)
}

fn message(m: Option<String>) -> Option<StrBytes> {
    m.map(StrBytes::from_string)
}

/// The core's answer to an admin request, as Kafka's response at `version`.
pub fn admin_response(response: core::ControllerResponse, version: i16) -> ResponseKind {
    use core::ControllerResponse as R;
    match response {
        R::CreateTopics(results) => {
            let mut r = CreateTopicsResponse::default();
            r.topics = results
                .into_iter()
                .map(|t| {
                    let mut out = CreatableTopicResult::default()
                        .with_name(TopicName(StrBytes::from_string(t.name)))
                        .with_error_code(t.error_code)
                        .with_error_message(message(t.error_message));
                    if version >= 5 {
                        out.num_partitions = t.num_partitions;
                        out.replication_factor = t.replication_factor;
                    }
                    if version >= 7 {
                        out.topic_id = t.topic_id.map_or(uuid::Uuid::nil(), |id| id.0);
                    }
                    out
                })
                .collect();
            ResponseKind::CreateTopics(r)
        }
        R::DeleteTopics(results) => {
            let mut r = DeleteTopicsResponse::default();
            r.responses = results
                .into_iter()
                .map(|t| {
                    DeletableTopicResult::default()
                        .with_name(t.name.map(|n| TopicName(StrBytes::from_string(n))))
                        .with_topic_id(t.topic_id.map_or(uuid::Uuid::nil(), |id| id.0))
                        .with_error_code(t.error_code)
                        .with_error_message(message(t.error_message))
                })
                .collect();
            ResponseKind::DeleteTopics(r)
        }
        R::CreatePartitions(results) => {
            let mut r = CreatePartitionsResponse::default();
            r.results = results
                .into_iter()
                .map(|t| {
                    CreatePartitionsTopicResult::default()
                        .with_name(TopicName(StrBytes::from_string(t.name)))
                        .with_error_code(t.error_code)
                        .with_error_message(message(t.error_message))
                })
                .collect();
            ResponseKind::CreatePartitions(r)
        }
        R::IncrementalAlterConfigs(results) => {
            let mut r = IncrementalAlterConfigsResponse::default();
            r.responses = results
                .into_iter()
                .map(|c| {
                    AlterConfigsResourceResponse::default()
                        .with_resource_type(c.resource_type)
                        .with_resource_name(StrBytes::from_string(c.resource_name))
                        .with_error_code(c.error_code)
                        .with_error_message(message(c.error_message))
                })
                .collect();
            ResponseKind::IncrementalAlterConfigs(r)
        }
        R::ElectLeaders(e) => {
            use kafka_protocol::messages::elect_leaders_response::{
                PartitionResult, ReplicaElectionResult,
            };
            let partitions = e.results.into_iter().map(|result| {
                let partition = PartitionResult::default()
                    .with_partition_id(result.partition_id)
                    .with_error_code(result.error_code)
                    .with_error_message(message(result.error_message));
                (result.topic, partition)
            });
            let topics = by_topic(partitions)
                .into_iter()
                .map(|(topic, partitions)| {
                    ReplicaElectionResult::default()
                        .with_topic(topic_name(topic))
                        .with_partition_result(partitions)
                })
                .collect();
            ResponseKind::ElectLeaders(
                ElectLeadersResponse::default()
                    .with_error_code(e.error_code)
                    .with_replica_election_results(topics),
            )
        }
        R::AlterPartitionReassignments(a) => {
            use kafka_protocol::messages::alter_partition_reassignments_response::{
                ReassignablePartitionResponse, ReassignableTopicResponse,
            };
            let partitions = a.results.into_iter().map(|result| {
                let partition = ReassignablePartitionResponse::default()
                    .with_partition_index(result.partition_id)
                    .with_error_code(result.error_code)
                    .with_error_message(message(result.error_message));
                (result.topic, partition)
            });
            let topics = by_topic(partitions)
                .into_iter()
                .map(|(topic, partitions)| {
                    ReassignableTopicResponse::default()
                        .with_name(topic_name(topic))
                        .with_partitions(partitions)
                })
                .collect();
            ResponseKind::AlterPartitionReassignments(
                AlterPartitionReassignmentsResponse::default()
                    .with_error_code(a.error_code)
                    .with_allow_replication_factor_change(version >= 1)
                    .with_responses(topics),
            )
        }
        R::ListPartitionReassignments(l) => {
            use kafka_protocol::messages::list_partition_reassignments_response::{
                OngoingPartitionReassignment, OngoingTopicReassignment,
            };
            let ids = |v: Vec<BrokerId>| {
                v.into_iter()
                    .map(|b| kafka_protocol::messages::BrokerId(b.0))
                    .collect()
            };
            let partitions = l.reassignments.into_iter().map(|o| {
                let partition = OngoingPartitionReassignment::default()
                    .with_partition_index(o.partition_id)
                    .with_replicas(ids(o.replicas))
                    .with_adding_replicas(ids(o.adding_replicas))
                    .with_removing_replicas(ids(o.removing_replicas));
                (o.topic, partition)
            });
            let topics = by_topic(partitions)
                .into_iter()
                .map(|(topic, partitions)| {
                    OngoingTopicReassignment::default()
                        .with_name(topic_name(topic))
                        .with_partitions(partitions)
                })
                .collect();
            ResponseKind::ListPartitionReassignments(
                ListPartitionReassignmentsResponse::default()
                    .with_error_code(l.error_code)
                    .with_topics(topics),
            )
        }
        R::UpdateFeatures(error_code) => ResponseKind::UpdateFeatures(
            kafka_protocol::messages::UpdateFeaturesResponse::default().with_error_code(error_code),
        ),
        R::CreateAcls(results) => {
            use kafka_protocol::messages::create_acls_response::AclCreationResult;
            ResponseKind::CreateAcls(
                CreateAclsResponse::default().with_results(
                    results
                        .into_iter()
                        .map(|c| {
                            AclCreationResult::default()
                                .with_error_code(c.error_code)
                                .with_error_message(c.error_message.map(StrBytes::from_string))
                        })
                        .collect(),
                ),
            )
        }
        R::DeleteAcls(results) => {
            use kafka_protocol::messages::delete_acls_response::{
                DeleteAclsFilterResult, DeleteAclsMatchingAcl,
            };
            let text = |s: String| StrBytes::from_string(s);
            ResponseKind::DeleteAcls(
                DeleteAclsResponse::default().with_filter_results(
                    results
                        .into_iter()
                        .map(|f| {
                            DeleteAclsFilterResult::default()
                                .with_error_code(f.error_code)
                                .with_error_message(f.error_message.map(text))
                                .with_matching_acls(
                                    f.matching
                                        .into_iter()
                                        .map(|a| {
                                            DeleteAclsMatchingAcl::default()
                                                .with_resource_type(a.resource_type)
                                                .with_resource_name(text(a.resource_name))
                                                .with_pattern_type(a.pattern_type)
                                                .with_principal(text(a.principal))
                                                .with_host(text(a.host))
                                                .with_operation(a.operation)
                                                .with_permission_type(a.permission)
                                        })
                                        .collect(),
                                )
                        })
                        .collect(),
                ),
            )
        }
        R::AlterUserScramCredentials(results) => {
            use kafka_protocol::messages::alter_user_scram_credentials_response::AlterUserScramCredentialsResult;
            ResponseKind::AlterUserScramCredentials(
                AlterUserScramCredentialsResponse::default().with_results(
                    results
                        .into_iter()
                        .map(|u| {
                            AlterUserScramCredentialsResult::default()
                                .with_user(StrBytes::from_string(u.user))
                                .with_error_code(u.error_code)
                                .with_error_message(u.error_message.map(StrBytes::from_string))
                        })
                        .collect(),
                ),
            )
        }
        // The entities are the request's: the broker that took it fills them in
        // (`cluster::alter_client_quotas`).
        R::AlterClientQuotas(results) => {
            use kafka_protocol::messages::alter_client_quotas_response::EntryData;
            ResponseKind::AlterClientQuotas(
                AlterClientQuotasResponse::default().with_entries(
                    results
                        .into_iter()
                        .map(|e| {
                            EntryData::default()
                                .with_error_code(e.error_code)
                                .with_error_message(e.error_message.map(StrBytes::from_string))
                        })
                        .collect(),
                ),
            )
        }
        other => unreachable!("not an admin response: {other:?}"),
    }
}

/// Per-partition results grouped by topic, the topics in the order they first appear (as
/// Kafka's responses list them).
fn by_topic<P>(items: impl IntoIterator<Item = (String, P)>) -> Vec<(String, Vec<P>)> {
    let mut out: Vec<(String, Vec<P>)> = Vec::new();
    for (topic, p) in items {
        match out.iter_mut().find(|(t, _)| *t == topic) {
            Some((_, partitions)) => partitions.push(p),
            None => out.push((topic, vec![p])),
        }
    }
    out
}

fn topic_name(topic: String) -> TopicName {
    TopicName(StrBytes::from_string(topic))
}

#[cfg(test)]
mod tests {
    use super::*;
    use kafka_protocol::messages::alter_partition_request::{
        BrokerState, PartitionData as Asked, TopicData as AskedTopic,
    };

    #[test]
    fn alter_partition_converts_both_versions_and_answers_grouped_by_topic() {
        let topic = uuid::Uuid::from_u128(42);
        let asked = |v3: bool| {
            let mut p = Asked::default()
                .with_partition_index(3)
                .with_leader_epoch(5)
                .with_partition_epoch(9);
            if v3 {
                p.new_isr_with_epochs = vec![
                    BrokerState::default()
                        .with_broker_id(kafka_protocol::messages::BrokerId(1))
                        .with_broker_epoch(100),
                    BrokerState::default()
                        .with_broker_id(kafka_protocol::messages::BrokerId(2))
                        .with_broker_epoch(200),
                ];
            } else {
                p.new_isr = vec![
                    kafka_protocol::messages::BrokerId(1),
                    kafka_protocol::messages::BrokerId(2),
                ];
            }
            RequestKind::AlterPartition(
                AlterPartitionRequest::default()
                    .with_broker_id(kafka_protocol::messages::BrokerId(1))
                    .with_broker_epoch(100)
                    .with_topics(vec![AskedTopic::default()
                        .with_topic_id(topic)
                        .with_partitions(vec![p])]),
            )
        };
        for (v3, epochs) in [(true, [100, 200]), (false, [-1, -1])] {
            let Some(core::ControllerRequest::AlterPartition(r)) = controller_request(&asked(v3))
            else {
                panic!("not converted")
            };
            assert_eq!(
                (r.broker_id, r.broker_epoch),
                (BrokerId(1), BrokerEpoch(100))
            );
            let item = &r.partitions[0];
            assert_eq!((item.topic_id, item.partition_id), (TopicId(topic), 3));
            assert_eq!((item.leader_epoch.0, item.partition_epoch.0), (5, 9));
            assert_eq!(
                item.new_isr,
                vec![
                    (BrokerId(1), BrokerEpoch(epochs[0])),
                    (BrokerId(2), BrokerEpoch(epochs[1]))
                ]
            );
        }
        let result = |partition_id, error_code| core::AlterPartitionResult {
            topic_id: TopicId(topic),
            partition_id,
            error_code,
            leader: BrokerId(1),
            leader_epoch: sluice_replication::records::LeaderEpoch(5),
            isr: vec![BrokerId(1)],
            partition_epoch: sluice_replication::records::PartitionEpoch(10),
        };
        let answer = alter_partition_response(core::AlterPartitionResponse {
            error_code: 0,
            partitions: vec![result(3, 0), result(4, 95)],
        });
        assert_eq!(answer.topics.len(), 1);
        let parts = &answer.topics[0].partitions;
        assert_eq!(
            parts
                .iter()
                .map(|p| (p.partition_index, p.error_code, p.partition_epoch))
                .collect::<Vec<_>>(),
            vec![(3, 0, 10), (4, 95, 10)]
        );
        assert_eq!(parts[0].isr, vec![kafka_protocol::messages::BrokerId(1)]);
    }
}
