//! AlterReplicaLogDirs: moving replicas to another log directory. The move runs on the
//! replica's owner shard (`shard/replica_move.rs`); the answer comes once it has started, as
//! Kafka answers once the future replica exists. DescribeLogDirs shows the copy as a future
//! replica until the swap.
//!
//! As Kafka answers: a destination that is not a log directory of the broker (compared as given,
//! made absolute; a trailing slash does not match) gives LOG_DIR_NOT_FOUND for all of its
//! partitions, and one that is offline (a storage error) KAFKA_STORAGE_ERROR; a partition this
//! broker has no replica of gives UNKNOWN_TOPIC_OR_PARTITION, one
//! not opened yet REPLICA_NOT_AVAILABLE; one already in the destination succeeds with nothing
//! to move.

use std::collections::HashMap;
use std::rc::Rc;

use kafka_protocol::messages::alter_replica_log_dirs_response::{
    AlterReplicaLogDirPartitionResult, AlterReplicaLogDirTopicResult,
};
use kafka_protocol::messages::{AlterReplicaLogDirsRequest, AlterReplicaLogDirsResponse};
use kafka_protocol::ResponseError;

use crate::shard::Shard;

pub async fn handle(
    shard: &Rc<Shard>,
    request: AlterReplicaLogDirsRequest,
) -> AlterReplicaLogDirsResponse {
    let image = shard.image();
    let mut response = AlterReplicaLogDirsResponse::default();
    let mut topic_index: HashMap<String, usize> = HashMap::new();
    for dir in request.dirs {
        // Compared as text, as Kafka does: a trailing slash names no log directory.
        let dest = std::path::absolute(dir.path.as_str()).ok().and_then(|p| {
            let p = p.to_string_lossy().into_owned();
            shard
                .shared
                .log_dirs
                .dirs()
                .iter()
                .position(|d| d.path.to_string_lossy() == p)
        });
        for topic in dir.topics {
            let name = topic.name.0.to_string();
            let i = *topic_index.entry(name.clone()).or_insert_with(|| {
                response.results.push(
                    AlterReplicaLogDirTopicResult::default().with_topic_name(topic.name.clone()),
                );
                response.results.len() - 1
            });
            for p in topic.partitions {
                let offline = |d: usize| shard.shared.log_dirs.dirs()[d].is_offline();
                let code = match (dest, image.owner(&name, p, shard.shared.shards)) {
                    (None, _) => ResponseError::LogDirNotFound.code(),
                    // As Kafka answers a move to a directory that failed.
                    (Some(d), _) if offline(d) => ResponseError::KafkaStorageError.code(),
                    (Some(_), None) => ResponseError::UnknownTopicOrPartition.code(),
                    (Some(dest), Some(owner)) => {
                        let topic = name.clone();
                        shard
                            .invoke_on(owner, move |s| async move {
                                s.start_replica_move(&topic, p, dest)
                            })
                            .await
                            .err()
                            .unwrap_or(0)
                    }
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
