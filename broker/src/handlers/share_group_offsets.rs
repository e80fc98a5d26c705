//! DescribeShareGroupOffsets, AlterShareGroupOffsets and DeleteShareGroupOffsets (KIP-932):
//! a share group's start offset and lag per partition, moved or forgotten by an operator
//! (`kafka-share-groups --describe`, `--reset-offsets`, `--delete-offsets`).
//!
//! Asked of the group's coordinator. A share partition this broker leads answers from memory
//! (with its lag); the others from their share coordinator's persisted state: the start
//! offset, and the lag from the partition's high watermark (asked of its leader with
//! ListOffsets when that is another broker; -1 when it does not answer). Altering writes a new state epoch at the share coordinator, which fences
//! what a leader holds (this broker's own leaders forget it at once, another broker's at its
//! next write); deleting deletes the persisted state.

use std::collections::BTreeMap;
use std::rc::Rc;
use std::sync::Arc;

use kafka_protocol::messages::alter_share_group_offsets_response::{
    AlterShareGroupOffsetsResponsePartition, AlterShareGroupOffsetsResponseTopic,
};
use kafka_protocol::messages::delete_share_group_offsets_response::DeleteShareGroupOffsetsResponseTopic;
use kafka_protocol::messages::describe_share_group_offsets_response::{
    DescribeShareGroupOffsetsResponseGroup, DescribeShareGroupOffsetsResponsePartition,
    DescribeShareGroupOffsetsResponseTopic,
};
use kafka_protocol::messages::list_offsets_request::{ListOffsetsPartition, ListOffsetsTopic};
use kafka_protocol::messages::{
    AlterShareGroupOffsetsRequest, AlterShareGroupOffsetsResponse, DeleteShareGroupOffsetsRequest,
    DeleteShareGroupOffsetsResponse, DescribeShareGroupOffsetsRequest,
    DescribeShareGroupOffsetsResponse,
};
use kafka_protocol::messages::{
    ApiKey, BrokerId, ListOffsetsRequest, RequestKind, ResponseKind, TopicName,
};
use kafka_protocol::protocol::StrBytes;
use kafka_protocol::ResponseError;

use crate::shard::groups::{coordinator_shard, no_coordinator};
use crate::shard::share::ShareOffsets;
use crate::shard::share_state::{persist, StateOp};
use crate::shard::Shard;
use crate::share::coordinator::{SharePartitionKey, ShareState};
use crate::share::partition::RecordState;

/// Whether share group `group_id` exists and has members, asked of its coordinator; `Err` with
/// the error code when there is no coordinator or no such share group.
async fn share_group(shard: &Rc<Shard>, group_id: &str) -> Result<bool, i16> {
    share_group_topics(shard, group_id)
        .await
        .map(|(active, _)| active)
}

/// [`share_group`], and every topic the group's members subscribed to.
async fn share_group_topics(shard: &Rc<Shard>, group_id: &str) -> Result<(bool, Vec<String>), i16> {
    let Some(owner) = coordinator_shard(shard, group_id) else {
        return Err(no_coordinator(shard, group_id));
    };
    let id = group_id.to_string();
    shard
        .invoke_on(owner, move |s| async move {
            s.groups
                .share_groups
                .borrow()
                .get(&id)
                .map(|g| (!g.members.is_empty(), g.topics.iter().cloned().collect()))
        })
        .await
        .ok_or(ResponseError::GroupIdNotFound.code())
}

/// Every share partition of `group_id` on this broker.
async fn local_state(shard: &Rc<Shard>, group_id: &str) -> BTreeMap<(Arc<str>, i32), ShareOffsets> {
    let id = group_id.to_string();
    shard
        .invoke_on_all(move |s| {
            let id = id.clone();
            async move { s.share_state(&id) }
        })
        .await
        .into_iter()
        .flatten()
        .map(|st| ((st.topic.clone(), st.partition), st))
        .collect()
}

/// The high watermark of `topic`-`partition`: from its owner shard when this broker leads it,
/// else asked of its leader with ListOffsets (latest); `None` when there is no answer.
async fn high_watermark_of(shard: &Rc<Shard>, topic: &str, partition: i32) -> Option<i64> {
    let (owner, leader) = {
        let image = shard.image();
        let (info, broker) = image.leader_of(topic, partition)?;
        if info.leader == shard.config().node_id {
            (image.owner(topic, partition, shard.shared.shards), None)
        } else {
            let addr = broker?.address_on(shard.config().inter_broker_listener());
            (None, Some(addr))
        }
    };
    if let Some(owner) = owner {
        let topic = topic.to_string();
        return shard
            .invoke_on(owner, move |s| async move {
                let p = s.partition(&topic, partition)?;
                p.check_leader(-1).ok()?;
                Some(p.high_watermark().0)
            })
            .await;
    }
    let addr = leader?;
    const VERSION: i16 = 7;
    let request = ListOffsetsRequest::default()
        .with_replica_id(BrokerId(-1))
        .with_isolation_level(0)
        .with_topics(vec![ListOffsetsTopic::default()
            .with_name(TopicName(StrBytes::from_string(topic.to_string())))
            .with_partitions(vec![ListOffsetsPartition::default()
                .with_partition_index(partition)
                .with_current_leader_epoch(-1)
                .with_timestamp(-1)])]);
    let frame = crate::codec::encode_request(
        ApiKey::ListOffsets,
        VERSION,
        1,
        &RequestKind::ListOffsets(request),
    )
    .ok()?;
    let answer = crate::peer::call(
        crate::peer::Route::InterBroker,
        &addr,
        frame,
        std::time::Duration::from_secs(10),
    )
    .await
    .map_err(|e| tracing::debug!(addr, topic, partition, error = %e, "ListOffsets to the leader for a share group's lag failed"))
    .ok()?;
    let ResponseKind::ListOffsets(answer) =
        crate::codec::decode_response(ApiKey::ListOffsets, VERSION, answer).ok()?
    else {
        return None;
    };
    answer
        .topics
        .iter()
        .flat_map(|t| &t.partitions)
        .find(|p| p.partition_index == partition && p.error_code == 0)
        .map(|p| p.offset)
}

/// Kafka's share-partition lag from the persisted state: the records from its start offset up
/// to the high watermark not yet acknowledged or archived.
fn persisted_lag(state: &ShareState, high_watermark: i64) -> i64 {
    let done: i64 = state
        .batches
        .iter()
        .filter(|b| matches!(b.state, RecordState::Acknowledged | RecordState::Archived))
        .map(|b| {
            (b.last_offset.min(high_watermark - 1) - b.first_offset.max(state.start_offset) + 1)
                .max(0)
        })
        .sum();
    (high_watermark - state.start_offset - done).max(0)
}

pub async fn describe(
    shard: &Rc<Shard>,
    request: DescribeShareGroupOffsetsRequest,
) -> DescribeShareGroupOffsetsResponse {
    let image = shard.image();
    let mut response = DescribeShareGroupOffsetsResponse::default();
    for g in request.groups {
        let group_id = g.group_id.0.to_string();
        let mut out = DescribeShareGroupOffsetsResponseGroup::default().with_group_id(g.group_id);
        let topics = match share_group_topics(shard, &group_id).await {
            Ok((_, topics)) => topics,
            Err(code) => {
                out.error_code = code;
                if code == ResponseError::GroupIdNotFound.code() {
                    out.error_message = Some(StrBytes::from_string(format!(
                        "Group {group_id} not found."
                    )));
                }
                response.groups.push(out);
                continue;
            }
        };
        let state = local_state(shard, &group_id).await;
        // Named partitions, or every partition of the topics the group subscribed to that
        // has a start offset.
        let named = g.topics.is_some();
        let wanted: Vec<(String, Vec<i32>)> = match g.topics {
            Some(topics) => topics
                .into_iter()
                .map(|t| (t.topic_name.0.to_string(), t.partitions))
                .collect(),
            None => topics
                .into_iter()
                .filter_map(|t| {
                    let count = image.topics.get(&t)?.shards.len() as i32;
                    Some((t, (0..count).collect()))
                })
                .collect(),
        };
        for (topic, partitions) in wanted {
            let meta = image.topics.get(&topic);
            let topic_id = meta.map(|m| m.id).unwrap_or_default();
            let mut out_partitions = Vec::with_capacity(partitions.len());
            for p in partitions {
                let mut part = DescribeShareGroupOffsetsResponsePartition::default()
                    .with_partition_index(p)
                    .with_start_offset(-1)
                    .with_leader_epoch(-1);
                let mut lag = -1i64;
                let exists = meta.is_some_and(|m| (0..m.shards.len() as i32).contains(&p));
                if !exists {
                    part.error_code = ResponseError::UnknownTopicOrPartition.code();
                    part.error_message = Some(StrBytes::from_static_str(
                        "This server does not host this topic-partition.",
                    ));
                } else if let Some(st) = state.get(&(Arc::from(topic.as_str()), p)) {
                    // Led here: the share partition's own view, with its lag.
                    part.start_offset = st.start_offset;
                    part.leader_epoch = st.leader_epoch;
                    lag = st.lag();
                } else {
                    let key = SharePartitionKey {
                        group_id: group_id.clone(),
                        topic_id,
                        partition: p,
                    };
                    match persist(shard, key, StateOp::Summary).await {
                        Ok(Some(st)) => {
                            part.start_offset = st.start_offset;
                            if let Some(hw) = high_watermark_of(shard, &topic, p).await {
                                lag = persisted_lag(&st, hw);
                            }
                        }
                        // Not read by the group yet: no start offset, as Kafka answers.
                        Ok(None) if named => {}
                        Ok(None) => continue,
                        Err(code) => part.error_code = code,
                    }
                }
                // Version 1's lag, for the encoder (`codec::versions`).
                part.unknown_tagged_fields.insert(
                    crate::codec::versions::NEWER_FIELDS_TAG,
                    bytes::Bytes::copy_from_slice(&lag.to_be_bytes()),
                );
                out_partitions.push(part);
            }
            if out_partitions.is_empty() && !named {
                continue;
            }
            let partitions = out_partitions;
            out.topics.push(
                DescribeShareGroupOffsetsResponseTopic::default()
                    .with_topic_name(kafka_protocol::messages::TopicName(StrBytes::from_string(
                        topic,
                    )))
                    .with_topic_id(topic_id)
                    .with_partitions(partitions),
            );
        }
        response.groups.push(out);
    }
    response
}

pub async fn alter(
    shard: &Rc<Shard>,
    request: AlterShareGroupOffsetsRequest,
) -> AlterShareGroupOffsetsResponse {
    let group_id = request.group_id.0.to_string();
    let mut response = AlterShareGroupOffsetsResponse::default();
    match share_group(shard, &group_id).await {
        Ok(false) => {}
        Ok(true) => {
            response.error_code = ResponseError::NonEmptyGroup.code();
            response.error_message = Some(StrBytes::from_static_str(
                "The group has active members: its offsets can only be altered while it is empty.",
            ));
            return response;
        }
        Err(code) => {
            response.error_code = code;
            return response;
        }
    }
    let image = shard.image();
    for t in request.topics {
        let topic = t.topic_name.0.to_string();
        let meta = image.topics.get(&topic);
        let mut partitions = Vec::with_capacity(t.partitions.len());
        for p in t.partitions {
            let owner = meta.and_then(|m| {
                m.shards
                    .get(usize::try_from(p.partition_index).ok()?)
                    .copied()
            });
            let code = match (meta, owner) {
                (Some(meta), Some(owner)) if p.start_offset >= 0 => {
                    // A new state epoch at the share coordinator fences the state a leader
                    // holds; this broker's own leader forgets it at once.
                    let key = SharePartitionKey {
                        group_id: group_id.clone(),
                        topic_id: meta.id,
                        partition: p.partition_index,
                    };
                    let reset = StateOp::Initialize {
                        state_epoch: None,
                        start_offset: p.start_offset,
                    };
                    match persist(shard, key, reset).await {
                        Ok(_) => {
                            if owner != crate::metadata::NOT_HOSTED {
                                let (g, t, index) =
                                    (group_id.clone(), topic.clone(), p.partition_index);
                                let held = shard
                                    .invoke_on(
                                        owner as usize % shard.shared.shards,
                                        move |s| async move { s.share_forget(&g, &t, index) },
                                    )
                                    .await;
                                tracing::debug!(group = %group_id, topic = %topic, partition = p.partition_index, held, "share partition forgotten after its reset");
                            }
                            0
                        }
                        Err(code) => code,
                    }
                }
                (Some(_), Some(_)) => ResponseError::InvalidRequest.code(),
                _ => ResponseError::UnknownTopicOrPartition.code(),
            };
            if code == 0 {
                tracing::info!(group = %group_id, topic = %topic, partition = p.partition_index, start_offset = p.start_offset, "share group start offset altered");
            }
            partitions.push(
                AlterShareGroupOffsetsResponsePartition::default()
                    .with_partition_index(p.partition_index)
                    .with_error_code(code),
            );
        }
        response.responses.push(
            AlterShareGroupOffsetsResponseTopic::default()
                .with_topic_name(t.topic_name)
                .with_topic_id(meta.map(|m| m.id).unwrap_or_default())
                .with_partitions(partitions),
        );
    }
    response
}

pub async fn delete(
    shard: &Rc<Shard>,
    request: DeleteShareGroupOffsetsRequest,
) -> DeleteShareGroupOffsetsResponse {
    let group_id = request.group_id.0.to_string();
    let mut response = DeleteShareGroupOffsetsResponse::default();
    match share_group(shard, &group_id).await {
        Ok(false) => {}
        Ok(true) => {
            response.error_code = ResponseError::NonEmptyGroup.code();
            return response;
        }
        Err(code) => {
            response.error_code = code;
            return response;
        }
    }
    let image = shard.image();
    for t in request.topics {
        let topic = t.topic_name.0.to_string();
        let meta = image.topics.get(&topic);
        let code = if meta.is_none() {
            ResponseError::UnknownTopicOrPartition.code()
        } else {
            match crate::shard::share_state::delete_topic_state(shard, &group_id, &topic).await {
                Ok(deleted) => {
                    tracing::info!(group = %group_id, topic = %topic, partitions = deleted, "share group offsets deleted");
                    0
                }
                Err(code) => code,
            }
        };
        response.responses.push(
            DeleteShareGroupOffsetsResponseTopic::default()
                .with_topic_name(t.topic_name)
                .with_topic_id(meta.map(|m| m.id).unwrap_or_default())
                .with_error_code(code),
        );
    }
    response
}
