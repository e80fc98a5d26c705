//! CreatePartitions: grow a topic's partition count; new partitions are placed round-robin over
//! the shards and opened by their owners.

use std::rc::Rc;

use kafka_protocol::messages::create_partitions_response::CreatePartitionsTopicResult;
use kafka_protocol::messages::{CreatePartitionsRequest, CreatePartitionsResponse};
use kafka_protocol::protocol::StrBytes;
use kafka_protocol::ResponseError;

use super::create_topics::{check_replica_assignment, PARTITIONS_PER_TOPIC_MAX};
use crate::shard::Shard;

pub async fn handle(
    shard: &Rc<Shard>,
    request: CreatePartitionsRequest,
) -> CreatePartitionsResponse {
    let mut response = CreatePartitionsResponse::default();
    for topic in request.topics {
        let name = topic.name.0.to_string();
        let count = topic.count;
        let mut result = CreatePartitionsTopicResult::default().with_name(topic.name.clone());
        let current = shard
            .image()
            .topics
            .get(&name)
            .map(|t| t.shards.len() as i32);
        let refused = match current {
            None => Some((
                ResponseError::UnknownTopicOrPartition,
                format!("topic {name} does not exist"),
            )),
            Some(c) if count <= c => Some((
                ResponseError::InvalidPartitions,
                format!(
                    "topic {name} has {c} partitions; the new count must be larger, {count} is not"
                ),
            )),
            Some(_) if count > PARTITIONS_PER_TOPIC_MAX => Some((
                ResponseError::InvalidPartitions,
                format!("at most {PARTITIONS_PER_TOPIC_MAX} partitions per topic"),
            )),
            Some(c) => topic.assignments.as_ref().and_then(|assignments| {
                let brokers: Vec<Vec<i32>> = assignments
                    .iter()
                    .map(|a| a.broker_ids.iter().map(|b| b.0).collect())
                    .collect();
                if brokers.len() as i32 != count - c {
                    return Some((
                        ResponseError::InvalidReplicaAssignment,
                        format!(
                            "increasing the partition count from {c} to {count} needs {} assignments, {} given",
                            count - c,
                            brokers.len()
                        ),
                    ));
                }
                // One broker: every existing partition has one replica.
                check_replica_assignment(shard.config().node_id, &brokers, Some(1))
                    .err()
                    .map(|e| (ResponseError::InvalidReplicaAssignment, e))
            }),
        };
        if let Some((error, message)) = refused {
            result.error_code = error.code();
            result.error_message = Some(StrBytes::from_string(message));
        } else if !request.validate_only {
            let target = name.clone();
            let outcome = shard
                .update_metadata(move |image| {
                    let shards = image.shards.max(1) as u64;
                    let mut cursor = image.next_shard;
                    let t = image
                        .topics
                        .get_mut(&target)
                        .ok_or_else(|| "topic is gone".to_string())?;
                    while (t.shards.len() as i32) < count {
                        t.shards.push((cursor % shards) as u16);
                        cursor += 1;
                    }
                    image.next_shard = cursor % shards;
                    Ok(())
                })
                .await;
            match outcome {
                Ok(()) => tracing::info!(topic = %name, count, "partitions added"),
                Err(e) => {
                    result.error_code = ResponseError::KafkaStorageError.code();
                    result.error_message = Some(StrBytes::from_string(e));
                }
            }
        }
        response.results.push(result);
    }
    response
}
