//! CreateTopics, and topic creation for auto-creation: validated here, applied by shard 0
//! (which owns the metadata image), then every shard opens the partitions it owns.

use std::collections::BTreeMap;
use std::rc::Rc;

use kafka_protocol::messages::create_topics_response::CreatableTopicResult;
use kafka_protocol::messages::{CreateTopicsRequest, CreateTopicsResponse};
use kafka_protocol::protocol::StrBytes;
use kafka_protocol::ResponseError;

use crate::metadata::{log_config, validate_topic_name, TopicMeta};
use crate::shard::Shard;

/// Most partitions one topic may have on this broker.
pub const PARTITIONS_PER_TOPIC_MAX: i32 = 10_000;

#[derive(Debug)]
pub enum CreateError {
    Exists,
    InvalidName(String),
    InvalidPartitions(String),
    InvalidReplicationFactor(String),
    InvalidConfig(String),
    InvalidReplicaAssignment(String),
    InvalidRequest(String),
    Storage(String),
}

/// Checks a manual replica assignment (CreateTopics, CreatePartitions) as Kafka does: every
/// partition names at least one broker, none twice, all of them registered (here: this node),
/// and every partition the same number of replicas (`replication_factor` when given).
pub fn check_replica_assignment(
    node_id: i32,
    assignments: &[Vec<i32>],
    replication_factor: Option<usize>,
) -> Result<(), String> {
    let factor = replication_factor.or(assignments.first().map(Vec::len));
    for (i, brokers) in assignments.iter().enumerate() {
        if brokers.is_empty() {
            return Err(format!(
                "the manual assignment of partition {i} names no broker"
            ));
        }
        let mut seen = brokers.clone();
        seen.sort_unstable();
        seen.dedup();
        if seen.len() != brokers.len() {
            return Err(format!(
                "the manual assignment of partition {i} names a broker twice: {brokers:?}"
            ));
        }
        if let Some(unknown) = brokers.iter().find(|&&b| b != node_id) {
            return Err(format!(
                "the manual assignment of partition {i} includes broker {unknown}, but no such broker is registered"
            ));
        }
        if Some(brokers.len()) != factor {
            return Err(format!(
                "the manual assignment of partition {i} has {} replicas, the others {}",
                brokers.len(),
                factor.unwrap_or(0)
            ));
        }
    }
    Ok(())
}

impl CreateError {
    fn code_and_message(&self) -> (i16, String) {
        match self {
            CreateError::Exists => (
                ResponseError::TopicAlreadyExists.code(),
                "topic already exists".into(),
            ),
            CreateError::InvalidName(m) => (ResponseError::InvalidTopicException.code(), m.clone()),
            CreateError::InvalidPartitions(m) => {
                (ResponseError::InvalidPartitions.code(), m.clone())
            }
            CreateError::InvalidReplicationFactor(m) => {
                (ResponseError::InvalidReplicationFactor.code(), m.clone())
            }
            CreateError::InvalidConfig(m) => (ResponseError::InvalidConfig.code(), m.clone()),
            CreateError::InvalidReplicaAssignment(m) => {
                (ResponseError::InvalidReplicaAssignment.code(), m.clone())
            }
            CreateError::InvalidRequest(m) => (ResponseError::InvalidRequest.code(), m.clone()),
            CreateError::Storage(m) => (ResponseError::KafkaStorageError.code(), m.clone()),
        }
    }
}

/// Creates a topic (or only validates it), returning once every owner shard has opened its
/// partitions and every shard has the new metadata image.
pub async fn create_topic(
    shard: &Rc<Shard>,
    name: &str,
    partitions: i32,
    configs: BTreeMap<String, String>,
    validate_only: bool,
) -> Result<(), CreateError> {
    if shard.config().is_cluster() {
        return crate::cluster::create_topic(shard, name, partitions, configs, validate_only).await;
    }
    validate_topic_name(name).map_err(CreateError::InvalidName)?;
    if !(1..=PARTITIONS_PER_TOPIC_MAX).contains(&partitions) {
        return Err(CreateError::InvalidPartitions(format!(
            "{partitions} partitions requested; allowed are 1 to {PARTITIONS_PER_TOPIC_MAX}"
        )));
    }
    log_config(&configs).map_err(CreateError::InvalidConfig)?;
    if shard.image().topics.contains_key(name) {
        return Err(CreateError::Exists);
    }
    if validate_only {
        return Ok(());
    }
    let name = name.to_string();
    let created = name.clone();
    shard
        .update_metadata(move |image| {
            if image.topics.contains_key(&name) {
                return Err(TOPIC_EXISTS.to_string());
            }
            let shards = image_shards(image);
            let owners: Vec<u16> = (0..partitions as u64)
                .map(|p| ((image.next_shard + p) % shards) as u16)
                .collect();
            image.next_shard = (image.next_shard + partitions as u64) % shards;
            image.topics.insert(
                name.clone(),
                TopicMeta {
                    name,
                    id: uuid::Uuid::new_v4(),
                    shards: owners,
                    configs,
                },
            );
            Ok(())
        })
        .await
        .map_err(|e| {
            if e == TOPIC_EXISTS {
                CreateError::Exists
            } else {
                CreateError::Storage(e)
            }
        })?;
    tracing::info!(topic = %created, partitions, "created topic");
    Ok(())
}

const TOPIC_EXISTS: &str = "topic already exists";

/// Placement spreads over the shards the broker runs; the image records the count in use
/// when it was written.
fn image_shards(image: &crate::metadata::MetadataImage) -> u64 {
    image.shards.max(1) as u64
}

pub async fn handle(
    shard: &Rc<Shard>,
    request: CreateTopicsRequest,
    version: i16,
) -> CreateTopicsResponse {
    let mut response = CreateTopicsResponse::default();
    for topic in request.topics {
        let name = topic.name.0.to_string();
        let manual = !topic.assignments.is_empty();
        let partitions = if manual {
            topic.assignments.len() as i32
        } else if topic.num_partitions == -1 {
            shard.config().num_partitions
        } else {
            topic.num_partitions
        };
        let mut result = CreatableTopicResult::default().with_name(topic.name.clone());
        // A manual assignment lists partitions 0, 1, 2, ... with their brokers.
        let mut assignments: Vec<(i32, Vec<i32>)> = topic
            .assignments
            .iter()
            .map(|a| {
                (
                    a.partition_index,
                    a.broker_ids.iter().map(|b| b.0).collect(),
                )
            })
            .collect();
        assignments.sort_by_key(|(p, _)| *p);
        let outcome = if manual && (topic.num_partitions != -1 || topic.replication_factor != -1) {
            Err(CreateError::InvalidRequest(
                "both a partition count or replication factor and a manual assignment were given; use one".into(),
            ))
        } else if manual
            && assignments
                .iter()
                .enumerate()
                .any(|(i, (p, _))| *p != i as i32)
        {
            Err(CreateError::InvalidReplicaAssignment(
                "the manual assignment must list partitions 0, 1, 2, ... each once".into(),
            ))
        } else if let Err(e) = check_replica_assignment(
            shard.config().node_id,
            &assignments
                .iter()
                .map(|(_, b)| b.clone())
                .collect::<Vec<_>>(),
            None,
        ) {
            Err(CreateError::InvalidReplicaAssignment(e))
        } else if topic.replication_factor != -1 && topic.replication_factor != 1 {
            Err(CreateError::InvalidReplicationFactor(format!(
                "replication factor {} is larger than the 1 available broker",
                topic.replication_factor
            )))
        } else {
            let configs: BTreeMap<String, String> = topic
                .configs
                .iter()
                .filter_map(|c| {
                    c.value
                        .as_ref()
                        .map(|v| (c.name.to_string(), v.to_string()))
                })
                .collect();
            create_topic(shard, &name, partitions, configs, request.validate_only).await
        };
        match outcome {
            Ok(()) => {
                if version >= 5 {
                    result.num_partitions = partitions;
                    result.replication_factor = 1;
                }
                if version >= 7 {
                    if let Some(meta) = shard.image().topics.get(&name) {
                        result.topic_id = meta.id;
                    }
                }
            }
            Err(e) => {
                let (code, message) = e.code_and_message();
                tracing::info!(topic = %name, error = %message, "CreateTopics refused");
                result.error_code = code;
                result.error_message = Some(StrBytes::from_string(message));
            }
        }
        response.topics.push(result);
    }
    response
}
