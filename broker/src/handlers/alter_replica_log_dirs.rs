//! AlterReplicaLogDirs: moving a replica to another log directory. This broker has one log
//! directory, so the only destination is the one every replica is already in.
//!
//! As Kafka answers: a destination that is not a log directory of the broker (compared as given,
//! made absolute; a trailing slash does not match) gives LOG_DIR_NOT_FOUND for all of its
//! partitions; for the one log directory, an existing partition succeeds (nothing to move) and
//! any other gives UNKNOWN_TOPIC_OR_PARTITION.

use std::collections::HashMap;
use std::rc::Rc;

use kafka_protocol::messages::alter_replica_log_dirs_response::{
    AlterReplicaLogDirPartitionResult, AlterReplicaLogDirTopicResult,
};
use kafka_protocol::messages::{AlterReplicaLogDirsRequest, AlterReplicaLogDirsResponse};
use kafka_protocol::ResponseError;

use super::describe_log_dirs::log_dir;
use crate::shard::Shard;

pub fn handle(
    shard: &Rc<Shard>,
    request: AlterReplicaLogDirsRequest,
) -> AlterReplicaLogDirsResponse {
    let image = shard.image();
    let ours = log_dir(shard);
    let mut response = AlterReplicaLogDirsResponse::default();
    let mut topic_index: HashMap<String, usize> = HashMap::new();
    for dir in request.dirs {
        let path = dir.path.as_str();
        let is_ours = std::path::absolute(path)
            .map(|p| p.to_string_lossy() == ours.as_str())
            .unwrap_or(false);
        for topic in dir.topics {
            let name = topic.name.0.to_string();
            let i = *topic_index.entry(name.clone()).or_insert_with(|| {
                response.results.push(
                    AlterReplicaLogDirTopicResult::default().with_topic_name(topic.name.clone()),
                );
                response.results.len() - 1
            });
            for p in topic.partitions {
                let code = if !is_ours {
                    ResponseError::LogDirNotFound.code()
                } else if image.owner(&name, p, shard.shared.shards).is_none() {
                    ResponseError::UnknownTopicOrPartition.code()
                } else {
                    0
                };
                response.results[i].partitions.push(
                    AlterReplicaLogDirPartitionResult::default()
                        .with_partition_index(p)
                        .with_error_code(code),
                );
            }
        }
    }
    response
}
