//! DescribeTopicPartitions (KIP-966): topics and their partitions, paged. Topics are answered in
//! name order; `response_partition_limit` bounds the partitions in one response, and
//! `next_cursor` names the first partition left out, where the next request starts.
//!
//! Paging follows Kafka 4: the cursor's topic must be among the topics asked for (else every
//! topic answers INVALID_REQUEST); a limit below 1 counts as 1; when the limit runs out exactly
//! at the end of a topic, the cursor points at partition 0 of the next topic asked for, known or
//! not.

use std::rc::Rc;

use kafka_protocol::messages::describe_topic_partitions_response::{
    Cursor, DescribeTopicPartitionsResponsePartition, DescribeTopicPartitionsResponseTopic,
};
use kafka_protocol::messages::{
    BrokerId, DescribeTopicPartitionsRequest, DescribeTopicPartitionsResponse, TopicName,
};
use kafka_protocol::protocol::StrBytes;
use kafka_protocol::ResponseError;

use crate::metadata::validate_topic_name;
use crate::shard::partition::LEADER_EPOCH;
use crate::shard::Shard;

/// Kafka's `max.request.partition.size.limit` default: no response lists more partitions.
pub const RESPONSE_PARTITION_LIMIT_MAX: i32 = 2000;

/// Every topic operation (READ, WRITE, CREATE, DELETE, ALTER, DESCRIBE, DESCRIBE_CONFIGS,
/// ALTER_CONFIGS as bits 3..=8, 10, 11): without an authorizer everyone may do everything, and
/// Kafka reports exactly this bitfield then.
pub const TOPIC_OPERATIONS_ALL: i32 =
    (1 << 3) | (1 << 4) | (1 << 5) | (1 << 6) | (1 << 7) | (1 << 8) | (1 << 10) | (1 << 11);
const _: () = assert!(TOPIC_OPERATIONS_ALL == 3576);

/// Kafka's "authorized operations not computed" value.
const OPERATIONS_UNKNOWN: i32 = i32::MIN;

fn topic_name(name: &str) -> TopicName {
    TopicName(StrBytes::from_string(name.to_string()))
}

pub fn handle(
    shard: &Rc<Shard>,
    client: &super::Client,
    request: DescribeTopicPartitionsRequest,
) -> DescribeTopicPartitionsResponse {
    use super::authz::{self, operation, resource_type};
    let image = shard.image();
    let node = BrokerId(shard.config().node_id);
    let every_topic = request.topics.is_empty();
    // The authorizer, as for Metadata: every topic lists those the client may describe; a
    // named one it may not is TOPIC_AUTHORIZATION_FAILED.
    let describable = |name: &str| {
        authz::permitted(
            shard,
            client,
            operation::DESCRIBE,
            resource_type::TOPIC,
            name,
        )
    };
    let mut names: Vec<String> = if every_topic {
        image
            .topics
            .keys()
            .filter(|n| describable(n))
            .cloned()
            .collect()
    } else {
        request
            .topics
            .iter()
            .map(|t| t.name.0.to_string())
            .collect()
    };
    names.sort();
    names.dedup();
    let mut response = DescribeTopicPartitionsResponse::default();
    let cursor = request
        .cursor
        .map(|c| (c.topic_name.0.to_string(), c.partition_index.max(0)));
    if let Some((cursor_topic, _)) = &cursor {
        if !every_topic && names.binary_search(cursor_topic).is_err() {
            response.topics = names
                .iter()
                .map(|n| {
                    DescribeTopicPartitionsResponseTopic::default()
                        .with_name(Some(topic_name(n)))
                        .with_error_code(ResponseError::InvalidRequest.code())
                        .with_topic_authorized_operations(OPERATIONS_UNKNOWN)
                })
                .collect();
            return response;
        }
    }
    let mut remaining = request
        .response_partition_limit
        .clamp(1, RESPONSE_PARTITION_LIMIT_MAX);
    let start_topic = cursor.as_ref().map(|(t, _)| t.as_str()).unwrap_or("");
    for name in names.iter().filter(|n| n.as_str() >= start_topic) {
        if remaining == 0 {
            response.next_cursor = Some(
                Cursor::default()
                    .with_topic_name(topic_name(name))
                    .with_partition_index(0),
            );
            break;
        }
        let mut topic = DescribeTopicPartitionsResponseTopic::default()
            .with_name(Some(topic_name(name)))
            .with_topic_authorized_operations(TOPIC_OPERATIONS_ALL);
        if !every_topic
            && !authz::allowed(
                shard,
                client,
                operation::DESCRIBE,
                resource_type::TOPIC,
                name,
            )
        {
            response.topics.push(
                topic
                    .with_error_code(ResponseError::TopicAuthorizationFailed.code())
                    .with_topic_authorized_operations(OPERATIONS_UNKNOWN),
            );
            continue;
        }
        if validate_topic_name(name).is_err() {
            response
                .topics
                .push(topic.with_error_code(ResponseError::InvalidTopicException.code()));
            continue;
        }
        let Some(meta) = image.topics.get(name) else {
            response
                .topics
                .push(topic.with_error_code(ResponseError::UnknownTopicOrPartition.code()));
            continue;
        };
        topic.topic_id = meta.id;
        topic.is_internal = meta.name == crate::group::offsets_topic::OFFSETS_TOPIC;
        let count = meta.shards.len() as i32;
        let first = match &cursor {
            Some((t, p)) if t == name => *p,
            _ => 0,
        };
        for index in first..count {
            if remaining == 0 {
                response.next_cursor = Some(
                    Cursor::default()
                        .with_topic_name(topic_name(name))
                        .with_partition_index(index),
                );
                break;
            }
            remaining -= 1;
            if let Some(p) = image
                .cluster
                .as_ref()
                .and_then(|c| c.partition(name, index))
            {
                let ids = |v: &[i32]| v.iter().map(|&b| BrokerId(b)).collect::<Vec<_>>();
                let cluster = image.cluster.as_ref().expect("checked above");
                topic.partitions.push(
                    DescribeTopicPartitionsResponsePartition::default()
                        .with_partition_index(index)
                        .with_leader_id(BrokerId(p.leader))
                        .with_leader_epoch(p.leader_epoch)
                        .with_replica_nodes(ids(&p.replicas))
                        .with_isr_nodes(ids(&p.isr))
                        .with_offline_replicas(
                            p.replicas
                                .iter()
                                .filter(|&&r| cluster.broker(r).is_none_or(|b| b.fenced))
                                .map(|&r| BrokerId(r))
                                .collect(),
                        )
                        .with_eligible_leader_replicas(Some(ids(&p.eligible_leader_replicas)))
                        .with_last_known_elr(Some(vec![])),
                );
                continue;
            }
            topic.partitions.push(
                DescribeTopicPartitionsResponsePartition::default()
                    .with_partition_index(index)
                    .with_leader_id(node)
                    .with_leader_epoch(LEADER_EPOCH.0)
                    .with_replica_nodes(vec![node])
                    .with_isr_nodes(vec![node])
                    // One replica, always in sync: no eligible leader replicas beyond the ISR.
                    .with_eligible_leader_replicas(Some(vec![]))
                    .with_last_known_elr(Some(vec![])),
            );
        }
        response.topics.push(topic);
        if response.next_cursor.is_some() {
            break;
        }
    }
    response
}
