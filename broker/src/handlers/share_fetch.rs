//! ShareFetch (KIP-932): a share consumer's fetch from this broker's share partitions, with
//! its acknowledgements piggy-backed; the records it gets are acquired for it under a lock.
//!
//! The share session (`shard/share.rs`) says which partitions the member fetches: epoch 0
//! opens it with the request's partitions, later epochs add partitions and forget others, and
//! -1 closes it (acknowledgements only; what the member still holds is released). Acknowledging
//! and reading happen on each partition's owner shard; a fetch that acquires nothing waits for
//! appends there until `max_wait_ms`.

use std::collections::BTreeMap;
use std::rc::Rc;
use std::sync::Arc;
use std::time::{Duration, Instant};

use kafka_protocol::messages::share_fetch_response::{
    AcquiredRecords, LeaderIdAndEpoch, PartitionData, ShareFetchableTopicResponse,
};
use kafka_protocol::messages::{ShareFetchRequest, ShareFetchResponse};
use kafka_protocol::protocol::StrBytes;
use kafka_protocol::ResponseError;

use super::authz;
use crate::group::configs::ShareGroupConfig;
use crate::shard::share::{AckBatch, ShareRead, ShareResult, ShareSession};
use crate::shard::Shard;

/// The longest a share fetch waits for records (as Fetch's bound).
const SHARE_FETCH_WAIT_MS_MAX: i32 = 30_000;

/// A share session's key: (group, member).
pub type SessionKey = (String, String);

/// What a request does to its member's share session, or the error that ends it.
pub enum SessionStep {
    /// Continue with these partitions (every partition of the session).
    Fetch(Vec<(uuid::Uuid, i32)>),
    /// The session was closed (epoch -1).
    Closed,
}

/// Applies a request's epoch to the member's share session on this shard. `added` are the
/// request's partitions, `forgotten` those it drops.
pub fn session_step(
    shard: &Shard,
    client: &super::Client,
    key: &SessionKey,
    epoch: i32,
    added: &[(uuid::Uuid, i32)],
    forgotten: &[(uuid::Uuid, i32)],
    opens: bool,
) -> Result<SessionStep, i16> {
    let sessions = &shard.share_sessions;
    let now = Instant::now();
    match epoch {
        -1 => {
            sessions.map.borrow_mut().remove(key);
            Ok(SessionStep::Closed)
        }
        0 => {
            if !opens {
                return Err(ResponseError::InvalidShareSessionEpoch.code());
            }
            sessions.map.borrow_mut().remove(key);
            sessions.evict_if_full();
            let partitions: indexmap::IndexSet<_> = added.iter().copied().collect();
            let list = partitions.iter().copied().collect();
            sessions.map.borrow_mut().insert(
                key.clone(),
                ShareSession {
                    next_epoch: 1,
                    partitions,
                    last_used: now,
                    connection: client.share_sessions.token(),
                },
            );
            let mut opened = client.share_sessions.opened.borrow_mut();
            if !opened.contains(key) {
                opened.push(key.clone());
            }
            Ok(SessionStep::Fetch(list))
        }
        e if e > 0 => {
            let mut map = sessions.map.borrow_mut();
            let Some(session) = map.get_mut(key) else {
                return Err(ResponseError::ShareSessionNotFound.code());
            };
            if session.next_epoch != e {
                return Err(ResponseError::InvalidShareSessionEpoch.code());
            }
            session.next_epoch = if e == i32::MAX { 1 } else { e + 1 };
            session.last_used = now;
            for tp in added {
                session.partitions.insert(*tp);
            }
            for tp in forgotten {
                session.partitions.shift_remove(tp);
            }
            Ok(SessionStep::Fetch(
                session.partitions.iter().copied().collect(),
            ))
        }
        _ => Err(ResponseError::InvalidShareSessionEpoch.code()),
    }
}

/// One partition of a request, resolved: its topic name, and the acknowledgements it carries.
pub struct Wanted {
    pub topic_id: uuid::Uuid,
    pub partition: i32,
    pub topic: Option<Arc<str>>,
    pub acks: Vec<AckBatch>,
    pub fetch: bool,
    pub record_limit: bool,
}

/// Runs each partition's turn on its owner shard, all owners at once; results in `wanted`'s
/// order. Partitions of unknown topics, or led by another broker, get their error here.
pub async fn run_on_owners(
    shard: &Rc<Shard>,
    group_id: &str,
    member_id: &str,
    wanted: &[Wanted],
    max_records: u32,
    max_bytes: usize,
) -> Vec<ShareResult> {
    let image = shard.image();
    let shards = shard.shared.shards;
    let mut by_owner: Vec<Vec<usize>> = vec![Vec::new(); shards];
    let mut results: Vec<Option<ShareResult>> = Vec::with_capacity(wanted.len());
    for (i, w) in wanted.iter().enumerate() {
        let owner = w
            .topic
            .as_ref()
            .and_then(|t| image.topics.get(&**t))
            .and_then(|m| m.shards.get(usize::try_from(w.partition).ok()?).copied());
        match owner {
            Some(crate::metadata::NOT_HOSTED) => results.push(Some(ShareResult {
                error_code: ResponseError::NotLeaderOrFollower.code(),
                ..Default::default()
            })),
            Some(owner) => {
                by_owner[owner as usize % shards].push(i);
                results.push(None);
            }
            None => results.push(Some(ShareResult {
                error_code: if w.topic.is_some() {
                    ResponseError::UnknownTopicOrPartition.code()
                } else {
                    ResponseError::UnknownTopicId.code()
                },
                ..Default::default()
            })),
        }
    }
    let jobs: Vec<_> = by_owner
        .into_iter()
        .enumerate()
        .filter(|(_, indexes)| !indexes.is_empty())
        .map(|(owner, indexes)| {
            let reads: Vec<ShareRead> = indexes
                .iter()
                .map(|&i| ShareRead {
                    topic: wanted[i].topic.clone().expect("an owner means a topic"),
                    partition: wanted[i].partition,
                    acks: wanted[i].acks.clone(),
                    fetch: wanted[i].fetch,
                    record_limit: wanted[i].record_limit,
                })
                .collect();
            let shard = shard.clone();
            let (group, member) = (group_id.to_string(), member_id.to_string());
            let task = glommio::spawn_local(async move {
                shard
                    .invoke_on(owner, move |s| async move {
                        let member: Rc<str> = Rc::from(member.as_str());
                        s.share_local(&group, member, reads, max_records, max_bytes)
                            .await
                    })
                    .await
            });
            (indexes, task)
        })
        .collect();
    for (indexes, task) in jobs {
        let found = task.await;
        assert_eq!(
            found.len(),
            indexes.len(),
            "a shard answered a different number of partitions"
        );
        for (i, r) in indexes.into_iter().zip(found) {
            results[i] = Some(r);
        }
    }
    results
        .into_iter()
        .map(|r| r.expect("every partition is answered"))
        .collect()
}

/// The wire's acknowledgement batches, as the shard takes them.
pub fn ack_batches<'a>(batches: impl Iterator<Item = (i64, i64, &'a Vec<i8>)>) -> Vec<AckBatch> {
    batches
        .map(|(first_offset, last_offset, types)| AckBatch {
            first_offset,
            last_offset,
            types: types.clone(),
        })
        .collect()
}

pub async fn handle(
    shard: &Rc<Shard>,
    client: &super::Client,
    mut request: ShareFetchRequest,
) -> ShareFetchResponse {
    let mut response = ShareFetchResponse::default();
    // Version 2's acquire mode (1: record-limit, at most `max_records` even if that splits a
    // batch) and renew flag (a fetch carrying RENEWs only renews: it acquires nothing).
    let (record_limit, renewing) = request
        .unknown_tagged_fields
        .remove(&crate::codec::versions::NEWER_FIELDS_TAG)
        .map_or((false, false), |b| {
            (b.first() == Some(&1), b.get(1) == Some(&1))
        });
    let (Some(group_id), Some(member_id)) = (request.group_id.as_ref(), request.member_id.as_ref())
    else {
        response.error_code = ResponseError::InvalidRequest.code();
        response.error_message = Some(StrBytes::from_static_str(
            "ShareFetch needs a group id and a member id.",
        ));
        return response;
    };
    let group_id = group_id.0.to_string();
    let member_id = member_id.to_string();
    if member_id.is_empty() {
        response.error_code = ResponseError::InvalidRequest.code();
        return response;
    }
    // The authorizer: READ on the group, else the whole request is refused; READ on each
    // topic.
    if !authz::group(shard, client, authz::operation::READ, &group_id) {
        response.error_code = ResponseError::GroupAuthorizationFailed.code();
        return response;
    }
    let image = shard.image();
    let own = image
        .cluster
        .as_ref()
        .and_then(|c| c.group_configs.get(&group_id));
    let group_config = ShareGroupConfig::resolve(shard.config(), own);
    response.acquisition_lock_timeout_ms =
        i32::try_from(group_config.record_lock_duration_ms).unwrap_or(i32::MAX);
    let added: Vec<(uuid::Uuid, i32)> = request
        .topics
        .iter()
        .flat_map(|t| {
            t.partitions
                .iter()
                .map(move |p| (t.topic_id, p.partition_index))
        })
        .collect();
    let forgotten: Vec<(uuid::Uuid, i32)> = request
        .forgotten_topics_data
        .iter()
        .flat_map(|t| t.partitions.iter().map(move |&p| (t.topic_id, p)))
        .collect();
    tracing::debug!(target: "sluice::share", group = %group_id, member = %member_id, epoch = request.share_session_epoch, partitions = added.len(), acks = request.topics.iter().flat_map(|t| &t.partitions).map(|p| p.acknowledgement_batches.len()).sum::<usize>(), "ShareFetch");
    let key = (group_id.clone(), member_id.clone());
    let step = match session_step(
        shard,
        client,
        &key,
        request.share_session_epoch,
        &added,
        &forgotten,
        true,
    ) {
        Ok(step) => step,
        Err(code) => {
            response.error_code = code;
            return response;
        }
    };
    let mut acks: BTreeMap<(uuid::Uuid, i32), Vec<AckBatch>> = BTreeMap::new();
    for t in &request.topics {
        for p in &t.partitions {
            if !p.acknowledgement_batches.is_empty() {
                acks.insert(
                    (t.topic_id, p.partition_index),
                    ack_batches(
                        p.acknowledgement_batches
                            .iter()
                            .map(|b| (b.first_offset, b.last_offset, &b.acknowledge_types)),
                    ),
                );
            }
        }
    }
    let (mut partitions, closing) = match step {
        SessionStep::Fetch(list) => (list, false),
        SessionStep::Closed => (acks.keys().copied().collect(), true),
    };
    // Acknowledgements for a partition the request also forgets are applied all the same (no
    // fetch from it).
    let fetched = partitions.len();
    let extra: Vec<(uuid::Uuid, i32)> = acks
        .keys()
        .filter(|tp| !partitions.contains(tp))
        .copied()
        .collect();
    partitions.extend(extra);
    let name_of = |id: uuid::Uuid| {
        image
            .topic_by_id(id)
            .map(|t| Arc::<str>::from(t.name.as_str()))
    };
    let mut denied = Vec::new();
    let mut wanted: Vec<Wanted> = Vec::with_capacity(partitions.len());
    for (i, (topic_id, partition)) in partitions.into_iter().enumerate() {
        let topic = name_of(topic_id);
        if let Some(t) = &topic {
            if !authz::allowed(
                shard,
                client,
                authz::operation::READ,
                authz::resource_type::TOPIC,
                t,
            ) {
                denied.push((topic_id, partition));
                continue;
            }
        }
        wanted.push(Wanted {
            topic_id,
            partition,
            topic,
            acks: acks.remove(&(topic_id, partition)).unwrap_or_default(),
            fetch: !closing && !renewing && i < fetched,
            record_limit,
        });
    }
    let max_wait =
        Duration::from_millis(request.max_wait_ms.clamp(0, SHARE_FETCH_WAIT_MS_MAX) as u64);
    let deadline = Instant::now() + max_wait;
    let max_records = u32::try_from(request.max_records).unwrap_or(0).max(1);
    let max_bytes = usize::try_from(request.max_bytes).unwrap_or(0).max(1);
    let owners: Vec<usize> = {
        let mut o: Vec<usize> = wanted
            .iter()
            .filter_map(|w| {
                let t = image.topics.get(&**w.topic.as_ref()?)?;
                t.shards
                    .get(usize::try_from(w.partition).ok()?)
                    .copied()
                    .filter(|&s| s != crate::metadata::NOT_HOSTED)
                    .map(|s| s as usize % shard.shared.shards)
            })
            .collect();
        o.sort_unstable();
        o.dedup();
        o
    };
    let mut results = run_on_owners(
        shard,
        &group_id,
        &member_id,
        &wanted,
        max_records,
        max_bytes,
    )
    .await;
    // Nothing acquired: wait for appends on the partitions' shards, then try again (the
    // acknowledgements went with the first pass).
    while !closing
        && !renewing
        && results.iter().all(|r| r.acquired.is_empty())
        && Instant::now() < deadline
        && !wanted.is_empty()
    {
        for w in &mut wanted {
            w.acks.clear();
        }
        let listeners: Vec<_> = owners
            .iter()
            .map(|&o| Box::pin(shard.shared.appended[o].listen()))
            .collect();
        let again = run_on_owners(
            shard,
            &group_id,
            &member_id,
            &wanted,
            max_records,
            max_bytes,
        )
        .await;
        let got = again.iter().any(|r| !r.acquired.is_empty());
        // Keep the first pass's acknowledgement outcomes.
        for (r, a) in results.iter_mut().zip(again) {
            let (ack, message) = (r.ack_error_code, r.ack_error_message.take());
            *r = a;
            r.ack_error_code = ack;
            r.ack_error_message = message;
        }
        if got {
            break;
        }
        let now = Instant::now();
        if now >= deadline {
            break;
        }
        let wait = (deadline - now).min(Duration::from_millis(100));
        super::fetch::wait_any(listeners, wait).await;
    }
    if closing {
        shard.release_share_member(&group_id, &member_id);
    }
    let node_id = shard.config().node_id;
    let mut by_topic: BTreeMap<uuid::Uuid, Vec<PartitionData>> = BTreeMap::new();
    for (w, r) in wanted.iter().zip(results) {
        let had_acks = !acks_were_empty(w, &request);
        if r.error_code == 0
            && r.ack_error_code == 0
            && r.acquired.is_empty()
            && !had_acks
            && request.share_session_epoch != 0
        {
            continue;
        }
        by_topic.entry(w.topic_id).or_default().push(
            PartitionData::default()
                .with_partition_index(w.partition)
                .with_error_code(r.error_code)
                .with_acknowledge_error_code(r.ack_error_code)
                .with_acknowledge_error_message(r.ack_error_message.map(StrBytes::from_string))
                .with_current_leader(
                    LeaderIdAndEpoch::default()
                        .with_leader_id(if r.error_code == 0 { node_id } else { -1 })
                        .with_leader_epoch(r.leader_epoch),
                )
                // Not nullable from version 1: no records are empty ones.
                .with_records(Some(r.records.unwrap_or_default()))
                .with_acquired_records(
                    r.acquired
                        .iter()
                        .map(|a| {
                            AcquiredRecords::default()
                                .with_first_offset(a.first_offset)
                                .with_last_offset(a.last_offset)
                                .with_delivery_count(
                                    i16::try_from(a.delivery_count).unwrap_or(i16::MAX),
                                )
                        })
                        .collect(),
                ),
        );
    }
    for (topic_id, partition) in denied {
        by_topic.entry(topic_id).or_default().push(
            PartitionData::default()
                .with_partition_index(partition)
                .with_error_code(ResponseError::TopicAuthorizationFailed.code())
                .with_records(Some(Default::default()))
                .with_current_leader(
                    LeaderIdAndEpoch::default()
                        .with_leader_id(-1)
                        .with_leader_epoch(-1),
                ),
        );
    }
    response.responses = by_topic
        .into_iter()
        .map(|(topic_id, partitions)| {
            ShareFetchableTopicResponse::default()
                .with_topic_id(topic_id)
                .with_partitions(partitions)
        })
        .collect();
    response
}

/// Whether the request carried no acknowledgements for `w`'s partition.
fn acks_were_empty(w: &Wanted, request: &ShareFetchRequest) -> bool {
    !request.topics.iter().any(|t| {
        t.topic_id == w.topic_id
            && t.partitions
                .iter()
                .any(|p| p.partition_index == w.partition && !p.acknowledgement_batches.is_empty())
    })
}
