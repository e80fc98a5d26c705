//! The broker's side of the cluster: what ties the sans-IO core in `sluice-replication` to
//! disks, sockets and timers. `meta_properties` is a data directory's identity;
//! `metadata_log` keeps `__cluster_metadata` in the engine; `transport` carries raft messages
//! over the CONTROLLER listener; `driver` runs the metadata node on shard 0.

pub mod broker_configs;
pub mod controller_api;
pub mod meta_properties;
pub mod metadata_log;
pub mod node;
pub mod transport;

use std::rc::Rc;
use std::time::Duration;

use kafka_protocol::messages::{ApiKey, RequestKind, ResponseKind};

use crate::metadata::MetadataImage;
use crate::shard::Shard;

/// How long a node waits at least after a committed change for its own shards to see it, so
/// that a client's next request to this broker finds what it just created. Requests that carry
/// a timeout (CreateTopics, DeleteTopics, CreatePartitions) wait up to it when it is longer:
/// opening a thousand new partitions on a busy host can take longer than this.
pub const APPLIED_WAIT: Duration = Duration::from_secs(5);

/// How long to wait for this node's shards: the request's own timeout, at least [`APPLIED_WAIT`].
fn applied_wait(timeout_ms: i32) -> Duration {
    Duration::from_millis(timeout_ms.max(0) as u64).max(APPLIED_WAIT)
}

/// Shard 0's metadata node (`None` on other shards, and before it starts).
pub fn node_of(shard0: &Shard) -> Option<Rc<node::ClusterNode>> {
    shard0.controller()?.into_any().downcast().ok()
}

/// Shard 0's metadata node, waiting for it during start-up (client listeners open on every
/// shard while shard 0 may still be starting it).
async fn metadata_node(shard0: &Rc<Shard>) -> Option<Rc<node::ClusterNode>> {
    for _ in 0..500 {
        if let Some(node) = node_of(shard0) {
            return Some(node);
        }
        glommio::timer::sleep(Duration::from_millis(10)).await;
    }
    None
}

/// Runs an admin request at the active controller, from any shard (`ClusterNode::admin`), then
/// waits until this node's image satisfies `applied` (at most `wait`).
pub async fn admin<P>(
    shard: &Rc<Shard>,
    key: ApiKey,
    version: i16,
    request: RequestKind,
    wait: Duration,
    applied: P,
) -> ResponseKind
where
    P: Fn(&ResponseKind, &MetadataImage) -> bool + Send + 'static,
{
    shard
        .invoke_on(0, move |s0| async move {
            let Some(node) = metadata_node(&s0).await else {
                let core = controller_api::controller_request(&request).expect("an admin request");
                return controller_api::admin_response(
                    core.error_response(sluice_replication::error_code::REQUEST_TIMED_OUT),
                    version,
                );
            };
            let response = node.admin(key, version, request).await;
            // Answered by this node as the active controller, its own image has the change
            // now and its shards get it next: the client's next request on this connection
            // (a DescribeConfigs after an AlterConfigs) sees it. Forwarded, this node's image
            // may still lag, and `applied` says what to wait for.
            let offset = node.applied_offset();
            if !node
                .wait_for_image(&s0, wait, offset, |image| applied(&response, image))
                .await
            {
                tracing::warn!(
                    ?key,
                    "a committed metadata change did not reach this node's shards in time"
                );
            }
            response
        })
        .await
}

/// [`admin`] for a request of kind `$kind`, with its answer of the same kind unwrapped. The
/// optional `|response, image| condition` is what this node's image must show before the
/// answer goes back (the `applied` of [`admin`]), on the typed response.
macro_rules! admin_as {
    ($kind:ident, $shard:expr, $version:expr, $request:expr, $wait:expr) => {
        admin_as!($kind, $shard, $version, $request, $wait, |_r, _image| true)
    };
    ($kind:ident, $shard:expr, $version:expr, $request:expr, $wait:expr, |$r:ident, $image:ident| $applied:expr) => {{
        let response = admin(
            $shard,
            ApiKey::$kind,
            $version,
            RequestKind::$kind($request),
            $wait,
            move |response, $image| match response {
                ResponseKind::$kind($r) => $applied,
                _ => true,
            },
        )
        .await;
        match response {
            ResponseKind::$kind(r) => r,
            _ => unreachable!(concat!(stringify!($kind), " answers ", stringify!($kind))),
        }
    }};
}

/// CreateTopics in a cluster: at the controller, then until this node has the topics.
pub async fn create_topics(
    shard: &Rc<Shard>,
    request: kafka_protocol::messages::CreateTopicsRequest,
    version: i16,
) -> kafka_protocol::messages::CreateTopicsResponse {
    let validate_only = request.validate_only;
    let wait = applied_wait(request.timeout_ms);
    let r = admin_as!(CreateTopics, shard, version, request, wait, |r, image| {
        validate_only
            || r.topics
                .iter()
                .filter(|t| t.error_code == 0)
                .all(|t| image.topics.contains_key(t.name.0.as_str()))
    });
    for t in r.topics.iter().filter(|t| t.error_code != 0) {
        tracing::info!(topic = %t.name.0, error_code = t.error_code, message = ?t.error_message, "CreateTopics refused");
    }
    r
}

/// DeleteTopics in a cluster: at the controller, then until this node no longer has them.
pub async fn delete_topics(
    shard: &Rc<Shard>,
    request: kafka_protocol::messages::DeleteTopicsRequest,
    version: i16,
) -> kafka_protocol::messages::DeleteTopicsResponse {
    let wait = applied_wait(request.timeout_ms);
    admin_as!(DeleteTopics, shard, version, request, wait, |r, image| {
        r.responses
            .iter()
            .filter(|t| t.error_code == 0)
            .all(|t| match &t.name {
                Some(n) => !image.topics.contains_key(n.0.as_str()),
                None => image.topic_by_id(t.topic_id).is_none(),
            })
    })
}

/// CreatePartitions in a cluster: at the controller, then until this node has the partitions.
pub async fn create_partitions(
    shard: &Rc<Shard>,
    request: kafka_protocol::messages::CreatePartitionsRequest,
    version: i16,
) -> kafka_protocol::messages::CreatePartitionsResponse {
    let counts: std::collections::HashMap<String, usize> = request
        .topics
        .iter()
        .map(|t| (t.name.0.to_string(), t.count.max(0) as usize))
        .collect();
    let validate_only = request.validate_only;
    let wait = applied_wait(request.timeout_ms);
    admin_as!(
        CreatePartitions,
        shard,
        version,
        request,
        wait,
        |r, image| {
            validate_only
                || r.results.iter().filter(|t| t.error_code == 0).all(|t| {
                    let want = counts.get(t.name.0.as_str()).copied().unwrap_or(0);
                    image
                        .topics
                        .get(t.name.0.as_str())
                        .is_some_and(|m| m.shards.len() >= want)
                })
        }
    )
}

/// IncrementalAlterConfigs in a cluster, at the controller. Kafka's clients send a broker's own
/// configs to that broker: one naming another broker is refused where it arrives, as Kafka
/// refuses it, and the rest go on; the answers keep the request's order.
pub async fn incremental_alter_configs(
    shard: &Rc<Shard>,
    mut request: kafka_protocol::messages::IncrementalAlterConfigsRequest,
    version: i16,
) -> kafka_protocol::messages::IncrementalAlterConfigsResponse {
    use crate::loggers::RESOURCE_BROKER_LOGGER;
    use kafka_protocol::messages::incremental_alter_configs_response::AlterConfigsResourceResponse;
    let node_id = shard.config().node_id.to_string();
    // Answered here, not by the controller: another broker's configs (clients send those to
    // that broker) and this broker's loggers (its own process's log levels).
    let foreign: Vec<bool> = request
        .resources
        .iter()
        .map(|r| {
            r.resource_type == RESOURCE_BROKER_LOGGER
                || (r.resource_type == broker_configs::RESOURCE_BROKER
                    && !r.resource_name.is_empty()
                    && r.resource_name.as_str() != node_id)
        })
        .collect();
    let answer =
        |r: &kafka_protocol::messages::incremental_alter_configs_request::AlterConfigsResource,
         outcome: Result<(), (i16, String)>| {
            let (code, message) = match outcome {
                Ok(()) => (0, None),
                Err((code, message)) => (
                    code,
                    Some(kafka_protocol::protocol::StrBytes::from_string(message)),
                ),
            };
            AlterConfigsResourceResponse::default()
                .with_error_code(code)
                .with_error_message(message)
                .with_resource_type(r.resource_type)
                .with_resource_name(r.resource_name.clone())
        };
    let invalid = |m: String| Err((kafka_protocol::ResponseError::InvalidRequest.code(), m));
    let refused: Vec<AlterConfigsResourceResponse> = request
        .resources
        .iter()
        .zip(&foreign)
        .filter(|(_, &f)| f)
        .map(|(r, _)| {
            let name = r.resource_name.as_str();
            let outcome = if r.resource_type != RESOURCE_BROKER_LOGGER {
                invalid(format!(
                    "Unexpected broker id, expected {node_id}, but received {name}"
                ))
            } else if name.parse::<i32>().is_err() {
                invalid(format!("Node id must be an integer, but it is: {name}"))
            } else if name != node_id {
                invalid(format!(
                    "Unexpected node id. Expected {node_id}, but received {name}"
                ))
            } else {
                let changes: Vec<crate::loggers::Change<'_>> = r
                    .configs
                    .iter()
                    .map(|c| crate::loggers::Change {
                        name: c.name.as_str(),
                        operation: c.config_operation,
                        value: c.value.as_deref(),
                    })
                    .collect();
                crate::loggers::alter(&changes, request.validate_only)
            };
            answer(r, outcome)
        })
        .collect();
    if refused.is_empty() {
        return admin_as!(
            IncrementalAlterConfigs,
            shard,
            version,
            request,
            APPLIED_WAIT
        );
    }
    let mut flags = foreign.iter();
    request
        .resources
        .retain(|_| !flags.next().expect("one flag a resource"));
    let mut answered = if request.resources.is_empty() {
        Vec::new()
    } else {
        admin_as!(
            IncrementalAlterConfigs,
            shard,
            version,
            request,
            APPLIED_WAIT
        )
        .responses
    }
    .into_iter();
    let mut refused = refused.into_iter();
    let mut response = kafka_protocol::messages::IncrementalAlterConfigsResponse::default();
    response.responses = foreign
        .iter()
        .filter_map(|&f| if f { refused.next() } else { answered.next() })
        .collect();
    response
}

/// ElectLeaders (`kafka-leader-election`): at the controller, answered once this node's image
/// has the new leaders.
pub async fn elect_leaders(
    shard: &Rc<Shard>,
    request: kafka_protocol::messages::ElectLeadersRequest,
    version: i16,
) -> kafka_protocol::messages::ElectLeadersResponse {
    let wait = applied_wait(request.timeout_ms);
    let r = admin_as!(ElectLeaders, shard, version, request, wait);
    for t in &r.replica_election_results {
        for p in t.partition_result.iter().filter(|p| p.error_code == 0) {
            tracing::info!(topic = %t.topic.0, partition = p.partition_id, "leader elected on request");
        }
    }
    r
}

/// AlterPartitionReassignments (`kafka-reassign-partitions --execute`, `sluice reassign`): at the
/// controller, answered once this node's image has the widened (or final) replica sets.
pub async fn alter_partition_reassignments(
    shard: &Rc<Shard>,
    request: kafka_protocol::messages::AlterPartitionReassignmentsRequest,
    version: i16,
) -> kafka_protocol::messages::AlterPartitionReassignmentsResponse {
    let wait = applied_wait(request.timeout_ms);
    let r = admin_as!(AlterPartitionReassignments, shard, version, request, wait);
    for t in &r.responses {
        for p in &t.partitions {
            if p.error_code == 0 {
                tracing::info!(topic = %t.name.0, partition = p.partition_index, "reassignment accepted");
            } else {
                tracing::warn!(topic = %t.name.0, partition = p.partition_index, error_code = p.error_code, message = ?p.error_message, "reassignment refused");
            }
        }
    }
    r
}

/// ListPartitionReassignments (`kafka-reassign-partitions --verify`): the controller's view.
pub async fn list_partition_reassignments(
    shard: &Rc<Shard>,
    request: kafka_protocol::messages::ListPartitionReassignmentsRequest,
    version: i16,
) -> kafka_protocol::messages::ListPartitionReassignmentsResponse {
    let wait = applied_wait(request.timeout_ms);
    admin_as!(ListPartitionReassignments, shard, version, request, wait)
}

/// CreateAcls at the controller, answered once this node's image holds every ACL created.
pub async fn create_acls(
    shard: &Rc<Shard>,
    request: kafka_protocol::messages::CreateAclsRequest,
    version: i16,
) -> kafka_protocol::messages::CreateAclsResponse {
    let wanted: Vec<sluice_replication::acl::AclBinding> = request
        .creations
        .iter()
        .map(|c| sluice_replication::acl::AclBinding {
            resource_type: c.resource_type,
            resource_name: c.resource_name.to_string(),
            pattern_type: c.resource_pattern_type,
            principal: c.principal.to_string(),
            host: c.host.to_string(),
            operation: c.operation,
            permission: c.permission_type,
        })
        .collect();
    let wait = applied_wait(0);
    admin_as!(CreateAcls, shard, version, request, wait, |r, image| {
        let Some(cluster) = image.cluster.as_ref() else {
            return true;
        };
        r.results
            .iter()
            .zip(&wanted)
            .filter(|(c, _)| c.error_code == 0)
            .all(|(_, acl)| cluster.acls.contains(acl))
    })
}

/// DeleteAcls at the controller, answered once this node's image has lost every ACL deleted.
pub async fn delete_acls(
    shard: &Rc<Shard>,
    request: kafka_protocol::messages::DeleteAclsRequest,
    version: i16,
) -> kafka_protocol::messages::DeleteAclsResponse {
    let wait = applied_wait(0);
    admin_as!(DeleteAcls, shard, version, request, wait, |r, image| {
        let Some(cluster) = image.cluster.as_ref() else {
            return true;
        };
        r.filter_results
            .iter()
            .flat_map(|f| &f.matching_acls)
            .all(|m| {
                !cluster.acls.iter().any(|a| {
                    a.resource_type == m.resource_type
                        && a.resource_name == m.resource_name.as_str()
                        && a.pattern_type == m.pattern_type
                        && a.principal == m.principal.as_str()
                        && a.host == m.host.as_str()
                        && a.operation == m.operation
                        && a.permission == m.permission_type
                })
            })
    })
}

/// AlterUserScramCredentials (`kafka-configs --entity-type users --alter --add-config
/// 'SCRAM-SHA-256=[password=...]'`): checked and stored at the controller, answered once this
/// node's image has every accepted change, so that the user can log in here at once.
pub async fn alter_user_scram_credentials(
    shard: &Rc<Shard>,
    request: kafka_protocol::messages::AlterUserScramCredentialsRequest,
    version: i16,
) -> kafka_protocol::messages::AlterUserScramCredentialsResponse {
    // The request names its users; what each should look like once applied: gone, or with
    // this salt and these iterations.
    type Expected = (String, i8, Option<(Vec<u8>, i32)>);
    let mut expected: Vec<Expected> = request
        .deletions
        .iter()
        .map(|d| (d.name.to_string(), d.mechanism, None))
        .collect();
    expected.extend(request.upsertions.iter().map(|u| {
        (
            u.name.to_string(),
            u.mechanism,
            Some((u.salt.to_vec(), u.iterations)),
        )
    }));
    let wait = applied_wait(30_000);
    let r = admin_as!(
        AlterUserScramCredentials,
        shard,
        version,
        request,
        wait,
        |r, image| {
            let Some(cluster) = image.cluster.as_ref() else {
                return true;
            };
            r.results.iter().filter(|u| u.error_code == 0).all(|u| {
                expected
                    .iter()
                    .filter(|(name, _, _)| name.as_str() == u.user.as_str())
                    .all(|(name, mechanism, want)| {
                        let have = cluster.scram.get(&(name.clone(), *mechanism));
                        match want {
                            None => have.is_none(),
                            Some((salt, iterations)) => {
                                have.is_some_and(|c| &c.salt == salt && c.iterations == *iterations)
                            }
                        }
                    })
            })
        }
    );
    for u in r.results.iter().filter(|u| u.error_code != 0) {
        tracing::info!(user = %u.user, error_code = u.error_code, message = ?u.error_message, "AlterUserScramCredentials refused");
    }
    r
}

/// AlterClientQuotas (`kafka-configs --entity-type users|clients --alter --add-config
/// producer_byte_rate=...`): checked and stored at the controller, answered once this node's
/// image has every accepted change, so that this broker enforces it from the next request. The
/// controller answers without the entities; they are the request's, in its order.
pub async fn alter_client_quotas(
    shard: &Rc<Shard>,
    request: kafka_protocol::messages::AlterClientQuotasRequest,
    version: i16,
) -> kafka_protocol::messages::AlterClientQuotasResponse {
    use kafka_protocol::messages::alter_client_quotas_response::EntityData;
    use sluice_replication::records::QuotaEntity;
    let name = |s: &kafka_protocol::protocol::StrBytes| s.to_string();
    // Each entry's entity (sorted, as stored) and the keys it sets (`Some`) or removes.
    type Keys = Vec<(String, Option<f64>)>;
    let expected: Vec<(QuotaEntity, Keys)> = request
        .entries
        .iter()
        .map(|e| {
            let mut entity: QuotaEntity = e
                .entity
                .iter()
                .map(|p| (name(&p.entity_type), p.entity_name.as_ref().map(name)))
                .collect();
            entity.sort();
            let ops = e
                .ops
                .iter()
                .map(|op| (name(&op.key), (!op.remove).then_some(op.value)))
                .collect();
            (entity, ops)
        })
        .collect();
    let entities: Vec<Vec<EntityData>> = request
        .entries
        .iter()
        .map(|e| {
            e.entity
                .iter()
                .map(|p| {
                    EntityData::default()
                        .with_entity_type(p.entity_type.clone())
                        .with_entity_name(p.entity_name.clone())
                })
                .collect()
        })
        .collect();
    let validate_only = request.validate_only;
    let wait = applied_wait(0);
    let mut r = admin_as!(
        AlterClientQuotas,
        shard,
        version,
        request,
        wait,
        |r, image| {
            let Some(cluster) = image.cluster.as_ref() else {
                return true;
            };
            validate_only
                || r.entries
                    .iter()
                    .zip(&expected)
                    .filter(|(e, _)| e.error_code == 0)
                    .all(|(_, (entity, ops))| {
                        let have = cluster.quotas.get(entity);
                        ops.iter().all(|(key, want)| {
                            let value = have.and_then(|keys| keys.get(key)).map(|v| v.0);
                            value.map(f64::to_bits) == want.map(f64::to_bits)
                        })
                    })
        }
    );
    for (entry, entity) in r.entries.iter_mut().zip(entities) {
        entry.entity = entity;
    }
    for e in r.entries.iter().filter(|e| e.error_code != 0) {
        tracing::info!(error_code = e.error_code, message = ?e.error_message, "AlterClientQuotas entry refused");
    }
    r
}

/// UpdateFeatures (`kafka-features upgrade|downgrade|disable`): every requested level is checked
/// here against this build and the cluster's levels (all or nothing, as Kafka's controller
/// does), then finalized at the controller. The first one writes every feature's level, so
/// that from then on the metadata log holds them all (`crate::features`).
pub async fn update_features(
    shard: &Rc<Shard>,
    mut request: kafka_protocol::messages::UpdateFeaturesRequest,
    version: i16,
) -> kafka_protocol::messages::UpdateFeaturesResponse {
    use crate::features;
    use kafka_protocol::messages::update_features_response::UpdatableFeatureResult;
    use kafka_protocol::messages::UpdateFeaturesResponse;
    use kafka_protocol::protocol::StrBytes;
    use kafka_protocol::ResponseError;
    let image = shard.image();
    let config = shard.config();
    let mut wanted: Vec<(String, i16)> = Vec::new();
    let mut refused: Option<String> = None;
    for u in &request.feature_updates {
        let name = u.feature.to_string();
        let upgrade_type = if version == 0 {
            if u.allow_downgrade {
                features::SAFE_DOWNGRADE
            } else {
                features::UPGRADE
            }
        } else {
            u.upgrade_type
        };
        let current = features::feature(&name).map_or(0, |f| features::level(&image, config, f));
        match features::check_update(current, &name, u.max_version_level, upgrade_type) {
            Ok(()) => wanted.push((name, u.max_version_level.max(0))),
            Err(message) => {
                refused.get_or_insert(message);
            }
        }
    }
    let asked: Vec<StrBytes> = request
        .feature_updates
        .iter()
        .map(|u| u.feature.clone())
        .collect();
    let answer = |error_code: i16, message: Option<String>| {
        let results = asked
            .iter()
            .map(|feature| {
                UpdatableFeatureResult::default()
                    .with_feature(feature.clone())
                    .with_error_code(error_code)
                    .with_error_message(message.clone().map(StrBytes::from_string))
            })
            .collect();
        UpdateFeaturesResponse::default()
            .with_error_code(error_code)
            .with_error_message(message.map(StrBytes::from_string))
            .with_results(results)
    };
    if let Some(message) = refused {
        tracing::info!(%message, "UpdateFeatures refused");
        return answer(ResponseError::InvalidUpdateVersion.code(), Some(message));
    }
    if request.validate_only || wanted.is_empty() {
        return answer(0, None);
    }
    // The whole set, the first time: what the cluster runs at now, with the changes.
    let mut levels: Vec<(String, i16)> = features::finalized(&image, config)
        .into_iter()
        .map(|(f, level)| (f.name.to_string(), level))
        .collect();
    for (name, level) in &wanted {
        if let Some(l) = levels.iter_mut().find(|(n, _)| n == name) {
            l.1 = *level;
        }
    }
    request.feature_updates = levels
        .iter()
        .map(|(name, level)| {
            kafka_protocol::messages::update_features_request::FeatureUpdateKey::default()
                .with_feature(StrBytes::from_string(name.clone()))
                .with_max_version_level(*level)
                .with_upgrade_type(features::UNSAFE_DOWNGRADE)
        })
        .collect();
    let wait = applied_wait(request.timeout_ms);
    let response = admin_as!(
        UpdateFeatures,
        shard,
        version.max(1),
        request,
        wait,
        |r, image| {
            r.error_code != 0
                || image.cluster.as_ref().is_some_and(|c| {
                    levels
                        .iter()
                        .all(|(name, level)| c.features.get(name).copied().unwrap_or(0) == *level)
                })
        }
    );
    if response.error_code == 0 {
        tracing::info!(features = ?wanted, "finalized feature levels");
    }
    answer(
        response.error_code,
        response.error_message.map(|m| m.to_string()),
    )
}

/// Why the broker's own creation of a topic (auto-creation, the offsets topic) failed.
#[derive(Debug)]
pub enum CreateError {
    Exists,
    /// The controller's error code and message.
    Refused(i16, String),
}

impl std::fmt::Display for CreateError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            CreateError::Exists => f.write_str("the topic exists"),
            CreateError::Refused(code, message) => write!(f, "error {code}: {message}"),
        }
    }
}

/// Creates a topic through the controller, from inside the broker: auto-creation and the
/// offsets topic. Returns once this node's shards have it.
pub async fn create_topic(
    shard: &Rc<Shard>,
    name: &str,
    partitions: i32,
    replication_factor: i16,
    configs: std::collections::BTreeMap<String, String>,
    validate_only: bool,
) -> Result<(), CreateError> {
    use kafka_protocol::messages::create_topics_request::{CreatableTopic, CreatableTopicConfig};
    use kafka_protocol::protocol::StrBytes;
    let topic = CreatableTopic::default()
        .with_name(kafka_protocol::messages::TopicName(StrBytes::from_string(
            name.to_string(),
        )))
        .with_num_partitions(partitions)
        .with_replication_factor(replication_factor)
        .with_configs(
            configs
                .into_iter()
                .map(|(k, v)| {
                    CreatableTopicConfig::default()
                        .with_name(StrBytes::from_string(k))
                        .with_value(Some(StrBytes::from_string(v)))
                })
                .collect(),
        );
    let request = kafka_protocol::messages::CreateTopicsRequest::default()
        .with_topics(vec![topic])
        .with_validate_only(validate_only)
        .with_timeout_ms(30_000);
    let response = create_topics(shard, request, 7).await;
    let Some(result) = response.topics.first() else {
        return Err(CreateError::Refused(
            sluice_replication::error_code::UNKNOWN_SERVER_ERROR,
            "the controller gave no answer".into(),
        ));
    };
    let message = result
        .error_message
        .as_ref()
        .map_or_else(String::new, |m| m.to_string());
    match result.error_code {
        0 => Ok(()),
        sluice_replication::error_code::TOPIC_ALREADY_EXISTS => Err(CreateError::Exists),
        code => Err(CreateError::Refused(code, message)),
    }
}

/// The internal topics a coordinator lives on, created through the controller on first use.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum InternalTopic {
    /// `__consumer_offsets`: `offsets.topic.num.partitions`, `offsets.topic.replication.factor`.
    Offsets,
    /// `__transaction_state`: `transaction.state.log.num.partitions`,
    /// `transaction.state.log.replication.factor`, and `min.insync.replicas` from
    /// `transaction.state.log.min.isr`.
    TransactionState,
    /// `__share_group_state`: `share.coordinator.state.topic.num.partitions`,
    /// `share.coordinator.state.topic.replication.factor`, and `min.insync.replicas` from
    /// `share.coordinator.state.topic.min.isr`.
    ShareGroupState,
}

impl InternalTopic {
    pub fn name(self) -> &'static str {
        match self {
            InternalTopic::Offsets => crate::group::offsets_topic::OFFSETS_TOPIC,
            InternalTopic::TransactionState => crate::txn::TRANSACTION_STATE_TOPIC,
            InternalTopic::ShareGroupState => crate::share::coordinator::SHARE_STATE_TOPIC,
        }
    }
}

/// Creates an internal topic (compacted, 100 MiB segments, its partition count and replication
/// factor from the broker's settings) through the controller.
pub async fn create_internal_topic(
    shard: &Rc<Shard>,
    topic: InternalTopic,
) -> Result<(), CreateError> {
    let config = shard.config();
    let mut configs = std::collections::BTreeMap::new();
    configs.insert("cleanup.policy".to_string(), "compact".to_string());
    configs.insert("segment.bytes".to_string(), (100u64 << 20).to_string());
    let (partitions, replication_factor) = match topic {
        InternalTopic::Offsets => (
            config.offsets_topic_partitions,
            config.offsets_topic_replication_factor(),
        ),
        InternalTopic::TransactionState => {
            configs.insert(
                "min.insync.replicas".to_string(),
                config.transaction_state_log_min_isr().to_string(),
            );
            (
                config.transaction_state_log_partitions,
                config.transaction_state_log_replication_factor(),
            )
        }
        InternalTopic::ShareGroupState => {
            configs.insert(
                "min.insync.replicas".to_string(),
                config.share_coordinator_state_topic_min_isr().to_string(),
            );
            (
                config.share_coordinator_state_topic_partitions,
                config.share_coordinator_state_topic_replication_factor(),
            )
        }
    };
    create_topic(
        shard,
        topic.name(),
        partitions,
        replication_factor,
        configs,
        false,
    )
    .await
}

/// Starts creating an internal topic through the controller (the first FindCoordinator for a
/// group or a transactional id of a new cluster does, as in Kafka). Attempts from different
/// shards or brokers are harmless: all but one get TOPIC_ALREADY_EXISTS.
pub fn ensure_internal_topic(shard: &Rc<Shard>, topic: InternalTopic) {
    thread_local! {
        /// One creation in flight per shard and topic: a burst of clients asking FindCoordinator
        /// before the topic exists sends the controller one CreateTopics, not one each.
        static CREATING: std::cell::RefCell<Vec<InternalTopic>> = const { std::cell::RefCell::new(Vec::new()) };
    }
    let started = CREATING.with(|c| {
        let mut c = c.borrow_mut();
        if c.contains(&topic) {
            false
        } else {
            c.push(topic);
            true
        }
    });
    if !started {
        return;
    }
    let shard = shard.clone();
    glommio::spawn_local(async move {
        struct Done(InternalTopic);
        impl Drop for Done {
            fn drop(&mut self) {
                CREATING.with(|c| c.borrow_mut().retain(|t| *t != self.0));
            }
        }
        let _done = Done(topic);
        match create_internal_topic(&shard, topic).await {
            Ok(()) => tracing::info!(topic = topic.name(), "created the internal topic"),
            Err(CreateError::Exists) => {}
            Err(e) => tracing::warn!(topic = topic.name(), error = %e, "creating the internal topic failed; the next FindCoordinator tries again"),
        }
    })
    .detach();
}

/// DescribeQuorum at a broker's listener (as `kafka-metadata-quorum --bootstrap-server` sends
/// it): answered by this node when it leads the quorum (only the leader knows every replica's
/// log end), else by the leader, over its CONTROLLER listener; failing that, by this node with
/// what it knows.
pub async fn describe_quorum(
    shard: &Rc<Shard>,
    request: kafka_protocol::messages::DescribeQuorumRequest,
    version: i16,
) -> kafka_protocol::messages::DescribeQuorumResponse {
    shard
        .invoke_on(0, move |s0| async move {
            let Some(node) = metadata_node(&s0).await else {
                return kafka_protocol::messages::DescribeQuorumResponse::default()
                    .with_error_code(sluice_replication::error_code::NOT_CONTROLLER);
            };
            if !node.is_quorum_leader() {
                let request = RequestKind::DescribeQuorum(request);
                if let Ok(frame) =
                    crate::codec::encode_request(ApiKey::DescribeQuorum, version, 1, &request)
                {
                    if let Some(answer) = node.ask_leader(&frame[4..]).await {
                        if let Ok(ResponseKind::DescribeQuorum(r)) = crate::codec::decode_response(
                            ApiKey::DescribeQuorum,
                            version,
                            answer[4..].to_vec(),
                        ) {
                            return r;
                        }
                    }
                }
            }
            controller_api::describe_quorum(&node, version)
        })
        .await
}

/// AlterConfigs in a cluster: Kafka's legacy call replaces a resource's whole set of dynamic
/// configs, so it becomes IncrementalAlterConfigs setting what it names and deleting what the
/// resource has and it does not name.
pub async fn alter_configs(
    shard: &Rc<Shard>,
    request: kafka_protocol::messages::AlterConfigsRequest,
) -> kafka_protocol::messages::AlterConfigsResponse {
    use kafka_protocol::messages::alter_configs_response::AlterConfigsResourceResponse;
    use kafka_protocol::messages::incremental_alter_configs_request::{
        AlterConfigsResource, AlterableConfig,
    };
    let image = shard.image();
    let resources = request
        .resources
        .iter()
        .map(|r| {
            let name = r.resource_name.to_string();
            let current: Vec<String> = match r.resource_type {
                2 => image
                    .topics
                    .get(&name)
                    .map(|t| t.configs.keys().cloned().collect()),
                4 => image
                    .broker_configs
                    .get(&name)
                    .map(|c| c.keys().cloned().collect()),
                _ => None,
            }
            .unwrap_or_default();
            let mut configs: Vec<AlterableConfig> = r
                .configs
                .iter()
                .map(|c| {
                    AlterableConfig::default()
                        .with_name(c.name.clone())
                        .with_config_operation(0)
                        .with_value(c.value.clone())
                })
                .collect();
            for key in current {
                if !r.configs.iter().any(|c| c.name.as_str() == key) {
                    configs.push(
                        AlterableConfig::default()
                            .with_name(kafka_protocol::protocol::StrBytes::from_string(key))
                            .with_config_operation(1),
                    );
                }
            }
            AlterConfigsResource::default()
                .with_resource_type(r.resource_type)
                .with_resource_name(r.resource_name.clone())
                .with_configs(configs)
        })
        .collect();
    let incremental = kafka_protocol::messages::IncrementalAlterConfigsRequest::default()
        .with_resources(resources)
        .with_validate_only(request.validate_only);
    let answer = incremental_alter_configs(shard, incremental, 1).await;
    let mut response = kafka_protocol::messages::AlterConfigsResponse::default();
    response.responses = answer
        .responses
        .into_iter()
        .map(|r| {
            AlterConfigsResourceResponse::default()
                .with_error_code(r.error_code)
                .with_error_message(r.error_message)
                .with_resource_type(r.resource_type)
                .with_resource_name(r.resource_name)
        })
        .collect();
    response
}
