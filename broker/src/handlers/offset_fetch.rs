//! OffsetFetch, for one group (v1-7) or several (v8+). Partitions without a commit answer -1.
//! From version 9 a consumer group's member names itself and its epoch (KIP-848), checked as
//! Kafka checks them.

use std::rc::Rc;

use kafka_protocol::messages::offset_fetch_response::{
    OffsetFetchResponseGroup, OffsetFetchResponsePartition, OffsetFetchResponsePartitions,
    OffsetFetchResponseTopic, OffsetFetchResponseTopics,
};
use kafka_protocol::messages::{GroupId, OffsetFetchRequest, OffsetFetchResponse, TopicName};
use kafka_protocol::protocol::StrBytes;
use kafka_protocol::ResponseError;

use crate::shard::groups::{coordinator_shard, no_coordinator};
use crate::shard::Shard;

/// (partition, offset, leader epoch, metadata, error code)
type PartitionOffset = (i32, i64, i32, String, i16);
/// (topic, its partitions' offsets), or an error code for the group.
type GroupOffsets = Result<Vec<(String, Vec<PartitionOffset>)>, i16>;

/// The offsets `wanted` (all, for `None`) of a group; `member` is version 9's member id and
/// epoch, checked for consumer groups.
/// [`fetch`] as the authorizer allows it: DESCRIBE on the group (else
/// GROUP_AUTHORIZATION_FAILED) and on each topic: a named topic the client may not describe is
/// TOPIC_AUTHORIZATION_FAILED, and when every topic is asked for such topics are left out.
async fn fetch_authorized(
    shard: &Rc<Shard>,
    client: &super::Client,
    group_id: String,
    wanted: Option<Vec<(String, Vec<i32>)>>,
    require_stable: bool,
    member: (Option<String>, i32),
) -> GroupOffsets {
    use super::authz::{self, operation, resource_type};
    if !authz::group(shard, client, operation::DESCRIBE, &group_id) {
        return Err(ResponseError::GroupAuthorizationFailed.code());
    }
    let named = wanted.is_some();
    let mut topics = fetch(shard, group_id, wanted, require_stable, member).await?;
    if shard.config().authorizer {
        let describable =
            |t: &str| authz::allowed(shard, client, operation::DESCRIBE, resource_type::TOPIC, t);
        if named {
            for (topic, partitions) in &mut topics {
                if !describable(topic) {
                    for p in partitions.iter_mut() {
                        *p = (
                            p.0,
                            -1,
                            -1,
                            String::new(),
                            ResponseError::TopicAuthorizationFailed.code(),
                        );
                    }
                }
            }
        } else {
            // Left out quietly, as Metadata leaves out what the client may not describe.
            topics.retain(|(topic, _)| {
                authz::permitted(
                    shard,
                    client,
                    operation::DESCRIBE,
                    resource_type::TOPIC,
                    topic,
                )
            });
        }
    }
    Ok(topics)
}

async fn fetch(
    shard: &Rc<Shard>,
    group_id: String,
    wanted: Option<Vec<(String, Vec<i32>)>>,
    require_stable: bool,
    member: (Option<String>, i32),
) -> GroupOffsets {
    let Some(owner) = coordinator_shard(shard, &group_id) else {
        return Err(no_coordinator(shard, &group_id));
    };
    shard
        .invoke_on(owner, move |s| async move {
            let check = s
                .groups
                .check_fetch(&group_id, member.0.as_deref(), member.1);
            if check != 0 {
                return Err(check);
            }
            let groups = s.groups.groups.borrow();
            let group = groups.get(&group_id);
            let committed = group.map(|g| &g.offsets);
            // KIP-447: a read-committed consumer asks for stable offsets; while an open
            // transaction has offsets for the partition it gets UNSTABLE_OFFSET_COMMIT and
            // retries, instead of starting from what the transaction is about to replace.
            let unstable = |topic: &str, p: i32| {
                require_stable && group.is_some_and(|g| g.has_pending_txn_offset(topic, p))
            };
            let lookup = |topic: &str, p: i32| {
                if unstable(topic, p) {
                    return (
                        p,
                        -1,
                        -1,
                        String::new(),
                        ResponseError::UnstableOffsetCommit.code(),
                    );
                }
                committed
                    .and_then(|o| o.get(&(topic.to_string(), p)))
                    .map(|c| (p, c.offset, c.leader_epoch, c.metadata.clone(), 0))
                    .unwrap_or((p, -1, -1, String::new(), 0))
            };
            Ok(match wanted {
                Some(topics) => topics
                    .into_iter()
                    .map(|(t, ps)| {
                        let parts = ps.iter().map(|&p| lookup(&t, p)).collect();
                        (t, parts)
                    })
                    .collect(),
                None => {
                    let mut by_topic: Vec<(String, Vec<PartitionOffset>)> = Vec::new();
                    if let Some(offsets) = committed {
                        for (t, p) in offsets.keys() {
                            let entry = lookup(t, *p);
                            match by_topic.iter_mut().find(|(n, _)| n == t) {
                                Some((_, v)) => v.push(entry),
                                None => by_topic.push((t.clone(), vec![entry])),
                            }
                        }
                    }
                    by_topic
                }
            })
        })
        .await
}

pub async fn handle(
    shard: &Rc<Shard>,
    client: &super::Client,
    request: OffsetFetchRequest,
    version: i16,
) -> OffsetFetchResponse {
    let mut response = OffsetFetchResponse::default();
    if version >= 8 {
        // Version 10 names topics by id: the ids this image knows become names, and the answer
        // names them by id again (`topic_ids`).
        let by_id = version >= 10;
        let image = shard.image();
        for mut g in request.groups {
            if by_id {
                for t in g.topics.iter_mut().flatten() {
                    crate::codec::topic_ids::resolve(&image, &mut t.name);
                }
            }
            let wanted = g.topics.map(|ts| {
                ts.into_iter()
                    .map(|t| (t.name.0.to_string(), t.partition_indexes))
                    .collect()
            });
            let mut group = OffsetFetchResponseGroup::default().with_group_id(g.group_id.clone());
            let member = (g.member_id.as_ref().map(|m| m.to_string()), g.member_epoch);
            match fetch_authorized(
                shard,
                client,
                g.group_id.0.to_string(),
                wanted,
                request.require_stable,
                member,
            )
            .await
            {
                Ok(topics) => {
                    group.topics = topics
                        .into_iter()
                        .map(|(t, parts)| {
                            OffsetFetchResponseTopics::default()
                                .with_name(TopicName(StrBytes::from_string(t)))
                                .with_partitions(
                                    parts
                                        .into_iter()
                                        .map(|(p, o, e, m, code)| {
                                            OffsetFetchResponsePartitions::default()
                                                .with_partition_index(p)
                                                .with_committed_offset(o)
                                                .with_committed_leader_epoch(e)
                                                .with_metadata(Some(StrBytes::from_string(m)))
                                                .with_error_code(code)
                                        })
                                        .collect(),
                                )
                        })
                        .collect()
                }
                Err(code) => group.error_code = code,
            }
            if by_id {
                for t in &mut group.topics {
                    if crate::codec::topic_ids::is_unknown_id(&t.name.0) {
                        for p in &mut t.partitions {
                            p.error_code = ResponseError::UnknownTopicId.code();
                        }
                    }
                    crate::codec::topic_ids::to_placeholder(&image, &mut t.name);
                }
            }
            response.groups.push(group);
        }
        return response;
    }
    let wanted = request.topics.map(|ts| {
        ts.into_iter()
            .map(|t| (t.name.0.to_string(), t.partition_indexes))
            .collect()
    });
    let GroupId(group_id) = request.group_id;
    match fetch_authorized(
        shard,
        client,
        group_id.to_string(),
        wanted,
        request.require_stable,
        (None, -1),
    )
    .await
    {
        Ok(topics) => {
            response.topics = topics
                .into_iter()
                .map(|(t, parts)| {
                    OffsetFetchResponseTopic::default()
                        .with_name(TopicName(StrBytes::from_string(t)))
                        .with_partitions(
                            parts
                                .into_iter()
                                .map(|(p, o, e, m, code)| {
                                    let mut r = OffsetFetchResponsePartition::default()
                                        .with_partition_index(p)
                                        .with_committed_offset(o)
                                        .with_metadata(Some(StrBytes::from_string(m)))
                                        .with_error_code(code);
                                    if version >= 5 {
                                        r.committed_leader_epoch = e;
                                    }
                                    r
                                })
                                .collect(),
                        )
                })
                .collect();
        }
        Err(code) => {
            if version >= 2 {
                response.error_code = code;
            }
        }
    }
    response
}
