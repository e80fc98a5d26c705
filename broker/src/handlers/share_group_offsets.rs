//! DescribeShareGroupOffsets, AlterShareGroupOffsets and DeleteShareGroupOffsets (KIP-932):
//! a share group's start offset and lag per partition, moved or forgotten by an operator
//! (`kafka-share-groups --describe`, `--reset-offsets`, `--delete-offsets`).
//!
//! Asked of the group's coordinator. The share partitions live on the partitions' leaders;
//! until their state is persisted through the share coordinator (`__share_group_state`) only
//! the partitions this broker leads can be answered: the others get NOT_LEADER_OR_FOLLOWER with
//! a message saying so.

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
use kafka_protocol::messages::{
    AlterShareGroupOffsetsRequest, AlterShareGroupOffsetsResponse, DeleteShareGroupOffsetsRequest,
    DeleteShareGroupOffsetsResponse, DescribeShareGroupOffsetsRequest,
    DescribeShareGroupOffsetsResponse,
};
use kafka_protocol::protocol::StrBytes;
use kafka_protocol::ResponseError;

use crate::shard::groups::{coordinator_shard, no_coordinator};
use crate::shard::share::ShareOffsets;
use crate::shard::Shard;

const LED_ELSEWHERE: &str =
    "The partition is led by another broker; its share state is not reachable from here yet.";

/// Whether share group `group_id` exists and has members, asked of its coordinator; `Err` with
/// the error code when there is no coordinator or no such share group.
async fn share_group(shard: &Rc<Shard>, group_id: &str) -> Result<bool, i16> {
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
                .map(|g| !g.members.is_empty())
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

/// Whether this broker leads `topic`-`partition` (it has an owner shard for it here).
fn led_here(shard: &Shard, topic: &str, partition: i32) -> Option<bool> {
    let image = shard.image();
    let meta = image.topics.get(topic)?;
    let owner = *meta.shards.get(usize::try_from(partition).ok()?)?;
    Some(owner != crate::metadata::NOT_HOSTED)
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
        if let Err(code) = share_group(shard, &group_id).await {
            out.error_code = code;
            if code == ResponseError::GroupIdNotFound.code() {
                out.error_message = Some(StrBytes::from_string(format!(
                    "Group {group_id} not found."
                )));
            }
            response.groups.push(out);
            continue;
        }
        let state = local_state(shard, &group_id).await;
        // Named partitions, or every partition the group has read.
        let wanted: Vec<(String, Vec<i32>)> = match g.topics {
            Some(topics) => topics
                .into_iter()
                .map(|t| (t.topic_name.0.to_string(), t.partitions))
                .collect(),
            None => {
                let mut by_topic: BTreeMap<String, Vec<i32>> = BTreeMap::new();
                for (t, p) in state.keys() {
                    by_topic.entry(t.to_string()).or_default().push(*p);
                }
                by_topic.into_iter().collect()
            }
        };
        for (topic, partitions) in wanted {
            let topic_id = image.topics.get(&topic).map(|m| m.id).unwrap_or_default();
            let partitions = partitions
                .into_iter()
                .map(|p| {
                    let mut out = DescribeShareGroupOffsetsResponsePartition::default()
                        .with_partition_index(p)
                        .with_start_offset(-1)
                        .with_leader_epoch(-1);
                    let mut lag = -1i64;
                    match (
                        led_here(shard, &topic, p),
                        state.get(&(Arc::from(topic.as_str()), p)),
                    ) {
                        (None, _) => {
                            out.error_code = ResponseError::UnknownTopicOrPartition.code();
                            out.error_message = Some(StrBytes::from_static_str(
                                "This server does not host this topic-partition.",
                            ));
                        }
                        (Some(_), Some(st)) => {
                            out.start_offset = st.start_offset;
                            out.leader_epoch = st.leader_epoch;
                            lag = st.lag();
                        }
                        // Not read by the group yet: no start offset, as Kafka answers.
                        (Some(true), None) => {}
                        (Some(false), None) => {
                            out.error_code = ResponseError::NotLeaderOrFollower.code();
                            out.error_message = Some(StrBytes::from_static_str(LED_ELSEWHERE));
                        }
                    }
                    // Version 1's lag, for the encoder (`codec::versions`).
                    out.unknown_tagged_fields.insert(
                        crate::codec::versions::NEWER_FIELDS_TAG,
                        bytes::Bytes::copy_from_slice(&lag.to_be_bytes()),
                    );
                    out
                })
                .collect();
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
            let code = match owner {
                None => ResponseError::UnknownTopicOrPartition.code(),
                Some(crate::metadata::NOT_HOSTED) => ResponseError::NotLeaderOrFollower.code(),
                Some(_) if p.start_offset < 0 => ResponseError::InvalidRequest.code(),
                Some(owner) => {
                    let (g, t, index, offset) = (
                        group_id.clone(),
                        Arc::<str>::from(topic.as_str()),
                        p.partition_index,
                        p.start_offset,
                    );
                    shard
                        .invoke_on(owner as usize % shard.shared.shards, move |s| async move {
                            s.share_reset(&g, t, index, offset)
                        })
                        .await
                }
            };
            if code == 0 {
                tracing::info!(group = %group_id, topic = %topic, partition = p.partition_index, start_offset = p.start_offset, "share group start offset altered");
            }
            partitions.push(
                AlterShareGroupOffsetsResponsePartition::default()
                    .with_partition_index(p.partition_index)
                    .with_error_code(code)
                    .with_error_message(
                        (code == ResponseError::NotLeaderOrFollower.code())
                            .then(|| StrBytes::from_static_str(LED_ELSEWHERE)),
                    ),
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
            let (g, name) = (group_id.clone(), topic.clone());
            shard
                .invoke_on_all(move |s| {
                    let (g, name) = (g.clone(), name.clone());
                    async move { s.share_delete_topic(&g, &name) }
                })
                .await;
            tracing::info!(group = %group_id, topic = %topic, "share group offsets deleted");
            0
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
