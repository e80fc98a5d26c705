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
pub mod share_acknowledge;
pub mod share_fetch;
pub mod share_group_describe;
pub mod share_group_heartbeat;
pub mod share_group_offsets;
pub mod share_group_state;
pub mod streams_group;
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
    /// The listener the client connected to: the brokers it is told of are that listener's
    /// addresses, as Kafka answers.
    pub listener: std::rc::Rc<str>,
    /// Until when the connection is muted for a quota: nothing more of it is read or run
    /// before then (`crate::quota`).
    pub throttled_until: Rc<std::cell::Cell<std::time::Instant>>,
    /// The time this request has run so far, when the client has a `request_percentage`
    /// quota (`crate::quota::Timed` adds it up).
    pub worked: Option<Rc<crate::quota::Worked>>,
    /// The share sessions the connection opened, closed with it (`shard/share.rs`).
    pub share_sessions: Rc<crate::shard::share::ConnectionSessions>,
}

impl Client {
    /// The quota on `key` this client is held to, if any (never for this node itself).
    pub fn quota(&self, shard: &Shard, key: &'static str) -> Option<crate::quota::Applied> {
        if &*self.principal == authz::NODE_PRINCIPAL {
            return None;
        }
        let image = shard.image();
        let cluster = image.cluster.as_ref()?;
        let user = crate::quota::user_of(&self.principal);
        crate::quota::resolve(&cluster.quotas, key, user, &self.client_id)
    }

    /// Records `bytes` against the client's quota and mutes its connection for the throttle
    /// time, which it returns (ms) for the response's `throttle_time_ms`.
    fn throttle(&self, shard: &Shard, applied: &crate::quota::Applied, bytes: usize) -> i32 {
        let throttle = shard.shared.quotas.record(applied, bytes as f64);
        self.mute(shard, applied, throttle)
    }

    /// The `controller_mutation_rate` of a CreateTopics, DeleteTopics or CreatePartitions
    /// request, if the client has one and the request changes anything (`validate_only` does
    /// not). `strict` for the versions that can answer THROTTLING_QUOTA_EXCEEDED (KIP-599).
    fn mutations<'a>(
        &self,
        shard: &'a Shard,
        strict: bool,
        validate_only: bool,
    ) -> Option<MutationQuota<'a>> {
        if validate_only {
            return None;
        }
        let applied = self.quota(shard, crate::quota::CONTROLLER_MUTATION_RATE)?;
        Some(MutationQuota {
            shard,
            applied,
            strict,
        })
    }

    /// Mutes the connection for `throttle` under `applied`; the throttle time in ms.
    fn mute(
        &self,
        shard: &Shard,
        applied: &crate::quota::Applied,
        throttle: std::time::Duration,
    ) -> i32 {
        mute(shard, &self.throttled_until, applied, throttle)
    }
}

/// Mutes a connection (its `throttled_until`) for `throttle` under the quota `applied`, and
/// counts it in the metrics; the throttle time in ms, for the response.
fn mute(
    shard: &Shard,
    throttled_until: &std::cell::Cell<std::time::Instant>,
    applied: &crate::quota::Applied,
    throttle: std::time::Duration,
) -> i32 {
    // Under a millisecond: nothing a response could tell.
    if throttle.as_millis() == 0 {
        return 0;
    }
    let until = std::time::Instant::now() + throttle;
    if until > throttled_until.get() {
        throttled_until.set(until);
    }
    let (user, client_id) = (&applied.sensor.user, &applied.sensor.client_id);
    shard.shared.metrics.throttled(
        applied.sensor.key,
        user.as_deref().unwrap_or(""),
        client_id.as_deref().unwrap_or(""),
        throttle.as_millis() as u64,
    );
    tracing::debug!(target: "sluice::quota", ?user, ?client_id, quota = applied.sensor.key, bound = applied.bound, throttle_ms = throttle.as_millis() as u64, "throttled");
    i32::try_from(throttle.as_millis()).unwrap_or(i32::MAX)
}

/// A request's `controller_mutation_rate` (KIP-599): each topic it creates, deletes or adds
/// partitions to takes one mutation per partition from the client's token bucket.
struct MutationQuota<'a> {
    shard: &'a Shard,
    applied: crate::quota::Applied,
    strict: bool,
}

impl MutationQuota<'_> {
    /// Whether a topic of `partitions` mutations goes ahead (and is counted): under a strict
    /// quota, not while the quota is exceeded (the topic gets THROTTLING_QUOTA_EXCEEDED); older
    /// versions are counted and only throttled, as in Kafka.
    fn admit(&self, partitions: i64) -> bool {
        let quotas = &self.shard.shared.quotas;
        if self.strict && quotas.mutations_exceeded(&self.applied) {
            return false;
        }
        quotas.record_mutations(&self.applied, partitions.max(0) as f64);
        true
    }

    /// The throttle time after the request (ms), its connection muted for it.
    fn throttle(&self, client: &Client) -> i32 {
        let throttle = self.shard.shared.quotas.mutation_throttle(&self.applied);
        client.mute(self.shard, &self.applied, throttle)
    }
}

const THROTTLED_MESSAGE: &str = "The throttling quota has been exceeded.";

/// Runs one request. `Ok(None)` means the API sends no response (produce with acks=0).
pub async fn dispatch(
    shard: &Rc<Shard>,
    key: ApiKey,
    version: i16,
    body: &mut Bytes,
    client: Client,
    turn: &mut Turn,
) -> anyhow::Result<Option<Answer>> {
    let request_bytes = body.len();
    // Share groups switched off (`kafka-features disable --feature share.version`): their APIs
    // are not listed by ApiVersions, and a client that sends one anyway is cut off, as for any
    // API a broker does not serve.
    if crate::features::is_share_api(key)
        && !crate::features::share_groups_enabled(&shard.image(), shard.config())
    {
        tracing::info!(api = ?key, principal = %client.principal, host = %client.host, "share group request while share.version is 0; closing the connection");
        anyhow::bail!("{key:?} while share groups are disabled (share.version 0)");
    }
    let request = decode_request(key, version, body)?;
    let mut splices = if client.zero_copy {
        Splices::default()
    } else {
        Splices::copying()
    };
    // APIs whose resources the authorizer does not check one by one yet: with an authorizer,
    // only super users may call them (the connection of anyone else is closed, with a line).
    if shard.config().authorizer && !authz::checked(key) && !authz::is_super(shard, &client) {
        tracing::info!(target: "sluice::authorizer", principal = %client.principal, host = %client.host, api = ?key, "denied: only super users may call this API while its ACL checks are not built; closing the connection");
        anyhow::bail!("{key:?} by {} refused by the authorizer", client.principal);
    }
    // Requests refused whole by the authorizer (one resource, one error code).
    if let Some(refused) = authz::refusal(shard, &client, &request) {
        return Ok(Some(Answer {
            response: refused,
            version,
            splices,
        }));
    }
    const ALTER_CONFIGS: i8 = authz::operation::ALTER_CONFIGS;
    // `request_percentage`, resolved before the handlers take the client apart. Exempt, as in
    // Kafka: the SASL and ApiVersions requests, the APIs only brokers send, and (below)
    // followers' fetches.
    let request_quota = client
        .worked
        .clone()
        .filter(|_| !request_time_exempt(key))
        .and_then(|worked| {
            Some((
                worked,
                client.quota(shard, crate::quota::REQUEST_PERCENTAGE)?,
            ))
        });
    let throttled_until = client.throttled_until.clone();
    let mut follower_fetch = false;
    let mut response = match request {
        // Metadata changes are the controller's (on the single-node default, its own).
        RequestKind::CreateTopics(mut r) => {
            // The authorizer: CREATE on the cluster or the topic; the others are refused here
            // and the rest created.
            let denied: Vec<_> = if authz::cluster(shard, &client, authz::operation::CREATE) {
                Vec::new()
            } else {
                let (ok, no) = std::mem::take(&mut r.topics)
                    .into_iter()
                    .partition(|t| authz::topic(shard, &client, authz::operation::CREATE, &t.name));
                r.topics = ok;
                no
            };
            let quota = client.mutations(shard, version >= 6, r.validate_only);
            let mut throttled = Vec::new();
            if let Some(quota) = &quota {
                let default_partitions = i64::from(shard.config().num_partitions);
                let (ok, no) = std::mem::take(&mut r.topics).into_iter().partition(|t| {
                    let partitions = if !t.assignments.is_empty() {
                        t.assignments.len() as i64
                    } else if t.num_partitions > 0 {
                        i64::from(t.num_partitions)
                    } else {
                        default_partitions
                    };
                    quota.admit(partitions)
                });
                r.topics = ok;
                throttled = no;
            }
            let mut response = crate::cluster::create_topics(shard, r, version).await;
            for t in throttled {
                response.topics.push(
                    kafka_protocol::messages::create_topics_response::CreatableTopicResult::default()
                        .with_name(t.name)
                        .with_error_code(ResponseError::ThrottlingQuotaExceeded.code())
                        .with_error_message(Some(kafka_protocol::protocol::StrBytes::from_static_str(THROTTLED_MESSAGE)))
                        .with_num_partitions(-1)
                        .with_replication_factor(-1),
                );
            }
            if let Some(quota) = &quota {
                response.throttle_time_ms = response.throttle_time_ms.max(quota.throttle(&client));
            }
            for t in denied {
                response.topics.push(
                    kafka_protocol::messages::create_topics_response::CreatableTopicResult::default()
                        .with_name(t.name)
                        .with_error_code(ResponseError::TopicAuthorizationFailed.code())
                        .with_num_partitions(-1)
                        .with_replication_factor(-1),
                );
            }
            ResponseKind::CreateTopics(response)
        }
        RequestKind::DeleteTopics(mut r) => {
            // The authorizer: DELETE on each topic, named or found by id.
            let image = shard.image();
            let name_of = |name: &Option<kafka_protocol::messages::TopicName>, id: uuid::Uuid| {
                name.as_ref()
                    .map(|n| n.0.to_string())
                    .or_else(|| image.topic_by_id(id).map(|t| t.name.clone()))
            };
            let may_delete = |name: Option<String>| {
                name.is_none_or(|n| {
                    authz::allowed(
                        shard,
                        &client,
                        authz::operation::DELETE,
                        authz::resource_type::TOPIC,
                        &n,
                    )
                })
            };
            let mut denied = Vec::new();
            r.topic_names.retain(|n| {
                let ok = may_delete(Some(n.0.to_string()));
                if !ok {
                    denied.push((Some(n.clone()), uuid::Uuid::nil()));
                }
                ok
            });
            r.topics.retain(|t| {
                let ok = may_delete(name_of(&t.name, t.topic_id));
                if !ok {
                    denied.push((t.name.clone(), t.topic_id));
                }
                ok
            });
            // The controller mutation quota: a topic's partitions each count one.
            let quota = client.mutations(shard, version >= 5, false);
            let mut throttled = Vec::new();
            if let Some(quota) = &quota {
                let partitions = |name: Option<String>| {
                    name.and_then(|n| image.topics.get(&n).map(|t| t.shards.len() as i64))
                        .unwrap_or(0)
                };
                r.topic_names.retain(|n| {
                    let ok = quota.admit(partitions(Some(n.0.to_string())));
                    if !ok {
                        throttled.push((Some(n.clone()), uuid::Uuid::nil()));
                    }
                    ok
                });
                r.topics.retain(|t| {
                    let ok = quota.admit(partitions(name_of(&t.name, t.topic_id)));
                    if !ok {
                        throttled.push((t.name.clone(), t.topic_id));
                    }
                    ok
                });
            }
            let nothing_left = r.topic_names.is_empty() && r.topics.is_empty();
            let mut response = if nothing_left && !(denied.is_empty() && throttled.is_empty()) {
                kafka_protocol::messages::DeleteTopicsResponse::default()
            } else {
                crate::cluster::delete_topics(shard, r, version).await
            };
            for (name, id) in throttled {
                response.responses.push(
                    kafka_protocol::messages::delete_topics_response::DeletableTopicResult::default()
                        .with_name(name)
                        .with_topic_id(id)
                        .with_error_code(ResponseError::ThrottlingQuotaExceeded.code())
                        .with_error_message(Some(kafka_protocol::protocol::StrBytes::from_static_str(THROTTLED_MESSAGE))),
                );
            }
            if let Some(quota) = &quota {
                response.throttle_time_ms = response.throttle_time_ms.max(quota.throttle(&client));
            }
            for (name, id) in denied {
                response.responses.push(
                    kafka_protocol::messages::delete_topics_response::DeletableTopicResult::default()
                        .with_name(name)
                        .with_topic_id(id)
                        .with_error_code(ResponseError::TopicAuthorizationFailed.code()),
                );
            }
            ResponseKind::DeleteTopics(response)
        }
        RequestKind::CreatePartitions(mut r) => {
            // The authorizer: ALTER on each topic; the refused ones answered here.
            let (ok, refused): (Vec<_>, Vec<_>) = std::mem::take(&mut r.topics)
                .into_iter()
                .partition(|t| authz::topic(shard, &client, authz::operation::ALTER, &t.name));
            r.topics = ok;
            // The controller mutation quota: each partition added counts one.
            let quota = client.mutations(shard, version >= 3, r.validate_only);
            let mut throttled = Vec::new();
            if let Some(quota) = &quota {
                let image = shard.image();
                let (ok, no) = std::mem::take(&mut r.topics).into_iter().partition(|t| {
                    let now = image
                        .topics
                        .get(t.name.as_str())
                        .map_or(0, |t| t.shards.len() as i64);
                    quota.admit(i64::from(t.count) - now)
                });
                r.topics = ok;
                throttled = no;
            }
            let mut response = crate::cluster::create_partitions(shard, r, version).await;
            for t in throttled {
                response.results.push(
                    kafka_protocol::messages::create_partitions_response::CreatePartitionsTopicResult::default()
                        .with_name(t.name)
                        .with_error_code(ResponseError::ThrottlingQuotaExceeded.code())
                        .with_error_message(Some(kafka_protocol::protocol::StrBytes::from_static_str(THROTTLED_MESSAGE))),
                );
            }
            if let Some(quota) = &quota {
                response.throttle_time_ms = response.throttle_time_ms.max(quota.throttle(&client));
            }
            for t in refused {
                response.results.push(
                    kafka_protocol::messages::create_partitions_response::CreatePartitionsTopicResult::default()
                        .with_name(t.name)
                        .with_error_code(ResponseError::TopicAuthorizationFailed.code()),
                );
            }
            ResponseKind::CreatePartitions(response)
        }
        RequestKind::AlterConfigs(mut r) => {
            // The authorizer: ALTER_CONFIGS on each resource; the refused ones answered here.
            let mut refused = Vec::new();
            r.resources.retain(|c| {
                let name = c.resource_name.to_string();
                let code =
                    configs::refused_configs(shard, &client, ALTER_CONFIGS, c.resource_type, &name);
                refused.extend(code.map(|code| (c.resource_type, c.resource_name.clone(), code)));
                code.is_none()
            });
            let mut response = crate::cluster::alter_configs(shard, r).await;
            for (resource_type, resource_name, code) in refused {
                response.responses.push(
                    kafka_protocol::messages::alter_configs_response::AlterConfigsResourceResponse::default()
                        .with_resource_type(resource_type)
                        .with_resource_name(resource_name)
                        .with_error_code(code),
                );
            }
            ResponseKind::AlterConfigs(response)
        }
        RequestKind::IncrementalAlterConfigs(mut r) => {
            let mut refused = Vec::new();
            r.resources.retain(|c| {
                let name = c.resource_name.to_string();
                let code =
                    configs::refused_configs(shard, &client, ALTER_CONFIGS, c.resource_type, &name);
                refused.extend(code.map(|code| (c.resource_type, c.resource_name.clone(), code)));
                code.is_none()
            });
            let mut response = crate::cluster::incremental_alter_configs(shard, r, version).await;
            for (resource_type, resource_name, code) in refused {
                response.responses.push(
                    kafka_protocol::messages::incremental_alter_configs_response::AlterConfigsResourceResponse::default()
                        .with_resource_type(resource_type)
                        .with_resource_name(resource_name)
                        .with_error_code(code),
                );
            }
            ResponseKind::IncrementalAlterConfigs(response)
        }
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
            ResponseKind::Metadata(metadata::handle(shard, &client, r, version).await)
        }
        // Client quotas: produce request bytes count against `producer_byte_rate` as the
        // request is taken (so that requests read behind it wait out its throttle), fetched
        // record bytes against `consumer_byte_rate` (`crate::quota`).
        RequestKind::Produce(r) => {
            let quota = client.quota(shard, crate::quota::PRODUCER_BYTE_RATE);
            let throttle_ms = quota.map_or(0, |q| client.throttle(shard, &q, request_bytes));
            match produce::handle(shard, &client, r, version, turn).await {
                Some(r) => ResponseKind::Produce(r.with_throttle_time_ms(throttle_ms)),
                None => return Ok(None),
            }
        }
        RequestKind::Fetch(mut r) => {
            let follower = if version >= 15 {
                r.replica_state.replica_id.0 >= 0
            } else {
                r.replica_id.0 >= 0
            };
            follower_fetch = follower;
            let quota = (!follower)
                .then(|| client.quota(shard, crate::quota::CONSUMER_BYTE_RATE))
                .flatten();
            if let Some(q) = &quota {
                // At most what the quota lets through in a window, as Kafka bounds it, so a
                // fetch larger than the quota still gets records.
                let within = shard.shared.quotas.window().bytes_within(q.bound);
                r.max_bytes = r.max_bytes.min(within.clamp(1.0, i32::MAX as f64) as i32);
            }
            let full = r.session_epoch <= 0;
            let mut response = fetch::handle(shard, &client, r, version, &mut splices).await;
            if let Some(q) = &quota {
                let bytes: usize = response
                    .responses
                    .iter()
                    .flat_map(|t| &t.partitions)
                    .filter_map(|p| p.records.as_ref().map(|b| b.len()))
                    .sum();
                let throttle_ms = client.throttle(shard, q, bytes);
                if throttle_ms > 0 {
                    // Over the quota: nothing is sent and nothing counted, only the throttle
                    // time, as Kafka answers (a full fetch without a session, an incremental
                    // one in its session); the client asks again once it has waited.
                    shard.shared.quotas.unrecord(q, bytes as f64);
                    response.responses.clear();
                    splices = Splices::copying();
                    if full {
                        response.session_id = 0;
                    }
                    response.throttle_time_ms = throttle_ms;
                }
            }
            ResponseKind::Fetch(response)
        }
        RequestKind::ListOffsets(r) => {
            ResponseKind::ListOffsets(list_offsets::handle(shard, &client, r, version).await)
        }
        RequestKind::DescribeConfigs(r) => {
            ResponseKind::DescribeConfigs(configs::describe(shard, &client, r, version).await)
        }
        RequestKind::DeleteRecords(mut r) => {
            // The authorizer: DELETE on each topic.
            let (ok, refused): (Vec<_>, Vec<_>) = std::mem::take(&mut r.topics)
                .into_iter()
                .partition(|t| authz::topic(shard, &client, authz::operation::DELETE, &t.name));
            r.topics = ok;
            let mut response = delete_records::handle(shard, r).await;
            use kafka_protocol::messages::delete_records_response::*;
            for t in refused {
                let partitions = t
                    .partitions
                    .iter()
                    .map(|p| {
                        DeleteRecordsPartitionResult::default()
                            .with_partition_index(p.partition_index)
                            .with_low_watermark(-1)
                            .with_error_code(ResponseError::TopicAuthorizationFailed.code())
                    })
                    .collect();
                response.topics.push(
                    DeleteRecordsTopicResult::default()
                        .with_name(t.name)
                        .with_partitions(partitions),
                );
            }
            ResponseKind::DeleteRecords(response)
        }
        RequestKind::InitProducerId(r) => {
            ResponseKind::InitProducerId(init_producer_id::handle(shard, r, version).await)
        }
        RequestKind::AddPartitionsToTxn(r) => ResponseKind::AddPartitionsToTxn(
            add_partitions_to_txn::handle(shard, &client, r, version).await,
        ),
        RequestKind::AddOffsetsToTxn(r) => {
            ResponseKind::AddOffsetsToTxn(add_offsets_to_txn::handle(shard, r, version).await)
        }
        RequestKind::TxnOffsetCommit(r) => ResponseKind::TxnOffsetCommit(
            txn_offset_commit::handle(shard, &client, r, version).await,
        ),
        RequestKind::EndTxn(r) => ResponseKind::EndTxn(end_txn::handle(shard, r, version).await),
        RequestKind::DescribeQuorum(r) => {
            ResponseKind::DescribeQuorum(crate::cluster::describe_quorum(shard, r, version).await)
        }
        RequestKind::DescribeCluster(request) => ResponseKind::DescribeCluster(
            describe_cluster::handle(shard, &request, &client.listener),
        ),
        RequestKind::FindCoordinator(r) => {
            ResponseKind::FindCoordinator(find_coordinator::handle(shard, &client, r, version))
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
            ResponseKind::OffsetCommit(offset_commit::handle(shard, &client, r, version).await)
        }
        RequestKind::OffsetFetch(r) => {
            ResponseKind::OffsetFetch(offset_fetch::handle(shard, &client, r, version).await)
        }
        RequestKind::ListGroups(r) => {
            // The authorizer: every group with DESCRIBE on the cluster, else those the client
            // may describe.
            let mut response = groups_admin::list(shard, r).await;
            if !authz::permitted(
                shard,
                &client,
                authz::operation::DESCRIBE,
                authz::resource_type::CLUSTER,
                sluice_replication::acl::CLUSTER_NAME,
            ) {
                response.groups.retain(|g| {
                    authz::permitted(
                        shard,
                        &client,
                        authz::operation::DESCRIBE,
                        authz::resource_type::GROUP,
                        &g.group_id,
                    )
                });
            }
            ResponseKind::ListGroups(response)
        }
        RequestKind::DescribeGroups(mut r) => {
            // The authorizer: DESCRIBE on each group; the refused ones after the others, as
            // in Kafka's answer.
            let (ok, refused): (Vec<_>, Vec<_>) = std::mem::take(&mut r.groups)
                .into_iter()
                .partition(|g| authz::group(shard, &client, authz::operation::DESCRIBE, g));
            r.groups = ok;
            let mut response = groups_admin::describe(shard, r, version).await;
            for g in refused {
                response.groups.push(
                    kafka_protocol::messages::describe_groups_response::DescribedGroup::default()
                        .with_group_id(g)
                        .with_error_code(ResponseError::GroupAuthorizationFailed.code()),
                );
            }
            ResponseKind::DescribeGroups(response)
        }
        RequestKind::DeleteGroups(mut r) => {
            let (ok, refused): (Vec<_>, Vec<_>) = std::mem::take(&mut r.groups_names)
                .into_iter()
                .partition(|g| authz::group(shard, &client, authz::operation::DELETE, g));
            r.groups_names = ok;
            let mut response = groups_admin::delete(shard, r).await;
            for g in refused {
                response.results.push(
                    kafka_protocol::messages::delete_groups_response::DeletableGroupResult::default()
                        .with_group_id(g)
                        .with_error_code(ResponseError::GroupAuthorizationFailed.code()),
                );
            }
            ResponseKind::DeleteGroups(response)
        }
        RequestKind::OffsetDelete(mut r) => {
            // The authorizer: DELETE on the group (else the whole request is refused), READ on
            // each topic.
            use kafka_protocol::messages::offset_delete_response::*;
            if !authz::group(shard, &client, authz::operation::DELETE, &r.group_id) {
                ResponseKind::OffsetDelete(
                    kafka_protocol::messages::OffsetDeleteResponse::default()
                        .with_error_code(ResponseError::GroupAuthorizationFailed.code()),
                )
            } else {
                let (ok, refused): (Vec<_>, Vec<_>) = std::mem::take(&mut r.topics)
                    .into_iter()
                    .partition(|t| authz::topic(shard, &client, authz::operation::READ, &t.name));
                r.topics = ok;
                let mut response = groups_admin::offset_delete(shard, r).await;
                for t in refused {
                    let partitions = t
                        .partitions
                        .iter()
                        .map(|p| {
                            OffsetDeleteResponsePartition::default()
                                .with_partition_index(p.partition_index)
                                .with_error_code(ResponseError::TopicAuthorizationFailed.code())
                        })
                        .collect();
                    response.topics.push(
                        OffsetDeleteResponseTopic::default()
                            .with_name(t.name)
                            .with_partitions(partitions),
                    );
                }
                ResponseKind::OffsetDelete(response)
            }
        }
        RequestKind::ConsumerGroupHeartbeat(r) => ResponseKind::ConsumerGroupHeartbeat(
            consumer_group_heartbeat::handle(shard, r, client.client_id, client.host).await,
        ),
        RequestKind::ShareGroupHeartbeat(r) => {
            // The authorizer: READ on the group (checked above), DESCRIBE on every subscribed
            // topic, as Kafka checks a heartbeat's subscription.
            let denied: Vec<String> = r
                .subscribed_topic_names
                .iter()
                .flatten()
                .filter(|t| !authz::topic(shard, &client, authz::operation::DESCRIBE, t))
                .map(|t| t.0.to_string())
                .collect();
            if denied.is_empty() {
                ResponseKind::ShareGroupHeartbeat(
                    share_group_heartbeat::handle(shard, r, client.client_id, client.host).await,
                )
            } else {
                ResponseKind::ShareGroupHeartbeat(
                    kafka_protocol::messages::ShareGroupHeartbeatResponse::default()
                        .with_error_code(ResponseError::TopicAuthorizationFailed.code())
                        .with_error_message(Some(kafka_protocol::protocol::StrBytes::from_string(
                            format!("Unauthorized topics: {}", denied.join(", ")),
                        ))),
                )
            }
        }
        RequestKind::ShareGroupDescribe(mut r) => {
            // The authorizer: DESCRIBE on each group; the refused ones after the others.
            let (ok, refused): (Vec<_>, Vec<_>) = std::mem::take(&mut r.group_ids)
                .into_iter()
                .partition(|g| authz::group(shard, &client, authz::operation::DESCRIBE, g));
            r.group_ids = ok;
            let mut response = share_group_describe::handle(shard, r).await;
            for g in refused {
                response.groups.push(
                    kafka_protocol::messages::share_group_describe_response::DescribedGroup::default()
                        .with_group_id(g)
                        .with_error_code(ResponseError::GroupAuthorizationFailed.code()),
                );
            }
            ResponseKind::ShareGroupDescribe(response)
        }
        RequestKind::DescribeShareGroupOffsets(mut r) => {
            // The authorizer: DESCRIBE on each group (refused ones get the error), DESCRIBE on
            // each topic named (the others are left out, as Kafka answers).
            use kafka_protocol::messages::describe_share_group_offsets_response::DescribeShareGroupOffsetsResponseGroup;
            let (ok, refused): (Vec<_>, Vec<_>) =
                std::mem::take(&mut r.groups).into_iter().partition(|g| {
                    authz::group(shard, &client, authz::operation::DESCRIBE, &g.group_id)
                });
            r.groups = ok;
            for g in &mut r.groups {
                if let Some(topics) = &mut g.topics {
                    topics.retain(|t| {
                        authz::topic(shard, &client, authz::operation::DESCRIBE, &t.topic_name)
                    });
                }
            }
            let mut response = share_group_offsets::describe(shard, r).await;
            for g in refused {
                response.groups.push(
                    DescribeShareGroupOffsetsResponseGroup::default()
                        .with_group_id(g.group_id)
                        .with_error_code(ResponseError::GroupAuthorizationFailed.code()),
                );
            }
            ResponseKind::DescribeShareGroupOffsets(response)
        }
        RequestKind::AlterShareGroupOffsets(mut r) => {
            // The authorizer: READ on the group, else the whole request is refused; READ on
            // each topic.
            use kafka_protocol::messages::alter_share_group_offsets_response::*;
            if !authz::group(shard, &client, authz::operation::READ, &r.group_id) {
                ResponseKind::AlterShareGroupOffsets(
                    kafka_protocol::messages::AlterShareGroupOffsetsResponse::default()
                        .with_error_code(ResponseError::GroupAuthorizationFailed.code()),
                )
            } else {
                let (ok, refused): (Vec<_>, Vec<_>) =
                    std::mem::take(&mut r.topics).into_iter().partition(|t| {
                        authz::topic(shard, &client, authz::operation::READ, &t.topic_name)
                    });
                r.topics = ok;
                let mut response = share_group_offsets::alter(shard, r).await;
                for t in refused {
                    let partitions = t
                        .partitions
                        .iter()
                        .map(|p| {
                            AlterShareGroupOffsetsResponsePartition::default()
                                .with_partition_index(p.partition_index)
                                .with_error_code(ResponseError::TopicAuthorizationFailed.code())
                        })
                        .collect();
                    response.responses.push(
                        AlterShareGroupOffsetsResponseTopic::default()
                            .with_topic_name(t.topic_name)
                            .with_partitions(partitions),
                    );
                }
                ResponseKind::AlterShareGroupOffsets(response)
            }
        }
        RequestKind::DeleteShareGroupOffsets(mut r) => {
            // The authorizer: DELETE on the group, else the whole request is refused; READ on
            // each topic.
            use kafka_protocol::messages::delete_share_group_offsets_response::*;
            if !authz::group(shard, &client, authz::operation::DELETE, &r.group_id) {
                ResponseKind::DeleteShareGroupOffsets(
                    kafka_protocol::messages::DeleteShareGroupOffsetsResponse::default()
                        .with_error_code(ResponseError::GroupAuthorizationFailed.code()),
                )
            } else {
                let (ok, refused): (Vec<_>, Vec<_>) =
                    std::mem::take(&mut r.topics).into_iter().partition(|t| {
                        authz::topic(shard, &client, authz::operation::READ, &t.topic_name)
                    });
                r.topics = ok;
                let mut response = share_group_offsets::delete(shard, r).await;
                for t in refused {
                    response.responses.push(
                        DeleteShareGroupOffsetsResponseTopic::default()
                            .with_topic_name(t.topic_name)
                            .with_error_code(ResponseError::TopicAuthorizationFailed.code()),
                    );
                }
                ResponseKind::DeleteShareGroupOffsets(response)
            }
        }
        RequestKind::ShareFetch(r) => {
            ResponseKind::ShareFetch(share_fetch::handle(shard, &client, r).await)
        }
        RequestKind::ShareAcknowledge(r) => ResponseKind::ShareAcknowledge(
            share_acknowledge::handle(shard, &client, r, version).await,
        ),
        RequestKind::ConsumerGroupDescribe(mut r) => {
            // The authorizer: DESCRIBE on each group; the refused ones after the others.
            let (ok, refused): (Vec<_>, Vec<_>) = std::mem::take(&mut r.group_ids)
                .into_iter()
                .partition(|g| authz::group(shard, &client, authz::operation::DESCRIBE, g));
            r.group_ids = ok;
            let mut response = consumer_group_describe::handle(shard, r).await;
            for g in refused {
                response.groups.push(
                    kafka_protocol::messages::consumer_group_describe_response::DescribedGroup::default()
                        .with_group_id(g)
                        .with_error_code(ResponseError::GroupAuthorizationFailed.code()),
                );
            }
            ResponseKind::ConsumerGroupDescribe(response)
        }
        RequestKind::OffsetForLeaderEpoch(r) => ResponseKind::OffsetForLeaderEpoch(
            offset_for_leader_epoch::handle(shard, &client, r).await,
        ),
        RequestKind::DescribeTopicPartitions(r) => ResponseKind::DescribeTopicPartitions(
            describe_topic_partitions::handle(shard, &client, r),
        ),
        RequestKind::DescribeLogDirs(r) => {
            ResponseKind::DescribeLogDirs(describe_log_dirs::handle(shard, r).await)
        }
        RequestKind::AlterReplicaLogDirs(r) => {
            ResponseKind::AlterReplicaLogDirs(alter_replica_log_dirs::handle(shard, r).await)
        }
        RequestKind::ListConfigResources(r) => {
            ResponseKind::ListConfigResources(list_config_resources::handle(shard, r, version))
        }
        RequestKind::DescribeProducers(mut r) => {
            // The authorizer: READ on each topic.
            let (ok, refused): (Vec<_>, Vec<_>) = std::mem::take(&mut r.topics)
                .into_iter()
                .partition(|t| authz::topic(shard, &client, authz::operation::READ, &t.name));
            r.topics = ok;
            let mut response = describe_producers::handle(shard, r).await;
            use kafka_protocol::messages::describe_producers_response::*;
            for t in refused {
                let partitions = t
                    .partition_indexes
                    .iter()
                    .map(|&p| {
                        PartitionResponse::default()
                            .with_partition_index(p)
                            .with_error_code(ResponseError::TopicAuthorizationFailed.code())
                    })
                    .collect();
                response.topics.push(
                    TopicResponse::default()
                        .with_name(t.name)
                        .with_partitions(partitions),
                );
            }
            ResponseKind::DescribeProducers(response)
        }
        RequestKind::DescribeTransactions(mut r) => {
            // The authorizer: DESCRIBE on each transactional id.
            let (ok, refused): (Vec<_>, Vec<_>) = std::mem::take(&mut r.transactional_ids)
                .into_iter()
                .partition(|t| {
                    authz::transactional_id(shard, &client, authz::operation::DESCRIBE, t)
                });
            r.transactional_ids = ok;
            let mut response = describe_transactions::handle(shard, r).await;
            for t in refused {
                response.transaction_states.push(
                    kafka_protocol::messages::describe_transactions_response::TransactionState::default()
                        .with_transactional_id(t)
                        .with_error_code(ResponseError::TransactionalIdAuthorizationFailed.code()),
                );
            }
            ResponseKind::DescribeTransactions(response)
        }
        RequestKind::ListTransactions(r) => {
            // The authorizer: only the transactional ids the client may describe.
            let mut response = list_transactions::handle(shard, r, version).await;
            response.transaction_states.retain(|t| {
                authz::permitted(
                    shard,
                    &client,
                    authz::operation::DESCRIBE,
                    authz::resource_type::TRANSACTIONAL_ID,
                    &t.transactional_id,
                )
            });
            ResponseKind::ListTransactions(response)
        }
        RequestKind::WriteTxnMarkers(r) => {
            ResponseKind::WriteTxnMarkers(write_txn_markers::handle(shard, r).await)
        }
        RequestKind::ReadShareGroupState(r) => {
            ResponseKind::ReadShareGroupState(share_group_state::read(shard, r).await)
        }
        RequestKind::WriteShareGroupState(r) => {
            ResponseKind::WriteShareGroupState(share_group_state::write(shard, r).await)
        }
        RequestKind::InitializeShareGroupState(r) => {
            ResponseKind::InitializeShareGroupState(share_group_state::initialize(shard, r).await)
        }
        RequestKind::DeleteShareGroupState(r) => {
            ResponseKind::DeleteShareGroupState(share_group_state::delete(shard, r).await)
        }
        RequestKind::ReadShareGroupStateSummary(r) => {
            ResponseKind::ReadShareGroupStateSummary(share_group_state::summary(shard, r).await)
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
            ResponseKind::DescribeClientQuotas(describe_client_quotas::handle(r, &shard.image()))
        }
        RequestKind::AlterClientQuotas(r) => ResponseKind::AlterClientQuotas(
            alter_client_quotas::handle(shard, &client, r, version).await,
        ),
        RequestKind::DescribeUserScramCredentials(r) => ResponseKind::DescribeUserScramCredentials(
            describe_user_scram_credentials::handle(r, &shard.image()),
        ),
        RequestKind::AlterUserScramCredentials(r) => ResponseKind::AlterUserScramCredentials(
            crate::cluster::alter_user_scram_credentials(shard, r, version).await,
        ),
        other => anyhow::bail!("no handler for {:?}", api_name(&other)),
    };
    if let Some((worked, quota)) = request_quota.filter(|_| !follower_fetch) {
        let used = crate::quota::percentage(worked.so_far());
        let throttle = shard.shared.quotas.record_request_time(&quota, used);
        let ms = mute(shard, &throttled_until, &quota, throttle);
        if ms > 0 {
            raise_throttle_time(&mut response, ms);
        }
    }
    Ok(Some(Answer {
        response,
        version,
        splices,
    }))
}

/// APIs a request quota never throttles, as in Kafka: ApiVersions and SASL (served before or
/// around authentication), and what only brokers and controllers send.
fn request_time_exempt(key: ApiKey) -> bool {
    matches!(
        key,
        ApiKey::ApiVersions
            | ApiKey::SaslHandshake
            | ApiKey::SaslAuthenticate
            | ApiKey::WriteTxnMarkers
            | ApiKey::ReadShareGroupState
            | ApiKey::WriteShareGroupState
            | ApiKey::InitializeShareGroupState
            | ApiKey::DeleteShareGroupState
            | ApiKey::ReadShareGroupStateSummary
            | ApiKey::AlterPartition
            | ApiKey::BrokerHeartbeat
            | ApiKey::BrokerRegistration
            | ApiKey::Vote
            | ApiKey::BeginQuorumEpoch
            | ApiKey::EndQuorumEpoch
            | ApiKey::FetchSnapshot
            | ApiKey::AllocateProducerIds
            | ApiKey::AssignReplicasToDirs
    )
}

/// Raises the response's `throttle_time_ms` to `ms` (a request quota's throttle beside any
/// other), for the responses clients send most; the connection is muted for every one.
fn raise_throttle_time(response: &mut ResponseKind, ms: i32) {
    macro_rules! raise {
        ($($kind:ident),* $(,)?) => {
            match response {
                $(ResponseKind::$kind(r) => r.throttle_time_ms = r.throttle_time_ms.max(ms),)*
                _ => {}
            }
        };
    }
    raise!(
        Produce,
        Fetch,
        Metadata,
        ListOffsets,
        OffsetCommit,
        OffsetFetch,
        OffsetDelete,
        OffsetForLeaderEpoch,
        FindCoordinator,
        JoinGroup,
        SyncGroup,
        Heartbeat,
        LeaveGroup,
        ListGroups,
        DescribeGroups,
        DeleteGroups,
        ConsumerGroupHeartbeat,
        ConsumerGroupDescribe,
        InitProducerId,
        AddPartitionsToTxn,
        AddOffsetsToTxn,
        EndTxn,
        TxnOffsetCommit,
        DescribeProducers,
        DescribeTransactions,
        ListTransactions,
        CreateTopics,
        DeleteTopics,
        CreatePartitions,
        DeleteRecords,
        DescribeConfigs,
        AlterConfigs,
        IncrementalAlterConfigs,
        DescribeCluster,
        DescribeTopicPartitions,
        DescribeAcls,
        CreateAcls,
        DeleteAcls,
        DescribeLogDirs,
        DescribeClientQuotas,
        AlterClientQuotas,
        DescribeUserScramCredentials,
        AlterUserScramCredentials,
        ElectLeaders,
        AlterPartitionReassignments,
        ListPartitionReassignments,
        UpdateFeatures,
    );
}

fn api_name(r: &RequestKind) -> &'static str {
    match r {
        RequestKind::Produce(_) => "Produce",
        _ => "an unsupported API",
    }
}
