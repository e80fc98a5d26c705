//! OffsetForLeaderEpoch (KIP-101, KIP-320): the end offset of a leader epoch, which consumers
//! compare with their position to detect that the log was truncated under them. Answered by the
//! partition's owner shard from the log's leader epoch cache.
//!
//! Answered by the partition's leader only. The cache holds the epochs the log's batches carry
//! (each leader stamps its own into what it appends, and followers keep them), and the current
//! epoch starts at the log end when no batch carries it yet (Kafka writes that entry when a
//! replica becomes leader).

use std::rc::Rc;

use kafka_protocol::messages::offset_for_leader_epoch_response::{
    EpochEndOffset, OffsetForLeaderTopicResult,
};
use kafka_protocol::messages::{OffsetForLeaderEpochRequest, OffsetForLeaderEpochResponse};
use kafka_protocol::ResponseError;
use sluice_engine::{LeaderEpoch, Offset};

use crate::shard::partition::LEADER_EPOCH;
use crate::shard::Shard;

const UNDEFINED_OFFSET: i64 = -1;

/// Kafka's `LeaderEpochFileCache.endOffsetFor`: (epoch, end offset) for `requested`, over
/// `epochs` (epoch, start offset; ascending) whose latest epoch ends at `log_end_offset`.
/// - the latest epoch ends at the log end;
/// - an epoch above the latest, or no epoch (-1), is unknown: (-1, -1);
/// - an epoch below the earliest ends where the earliest starts, reported as asked;
/// - otherwise the largest epoch at or below it, ending where the next one starts.
pub fn end_offset_for(
    epochs: &[(LeaderEpoch, Offset)],
    log_end_offset: Offset,
    requested: LeaderEpoch,
) -> (i32, i64) {
    let Some(&(latest, _)) = epochs.last() else {
        return (-1, UNDEFINED_OFFSET);
    };
    if requested.0 < 0 {
        return (-1, UNDEFINED_OFFSET);
    }
    if requested == latest {
        return (latest.0, log_end_offset.0);
    }
    let higher = epochs.partition_point(|&(e, _)| e <= requested);
    let Some(&(_, next_start)) = epochs.get(higher) else {
        return (-1, UNDEFINED_OFFSET);
    };
    match higher.checked_sub(1).map(|i| epochs[i]) {
        Some((floor, _)) => (floor.0, next_start.0),
        None => (requested.0, next_start.0),
    }
}

/// The fencing check of KIP-320: a client that knows another epoch than the leader's (-1: it
/// knows none) has stale or future metadata and must refresh it before it can trust an answer.
fn fencing_error(current: i32, leader_epoch: i32) -> Option<ResponseError> {
    if current == LeaderEpoch::NONE.0 {
        return None;
    }
    match current.cmp(&leader_epoch) {
        std::cmp::Ordering::Less => Some(ResponseError::FencedLeaderEpoch),
        std::cmp::Ordering::Greater => Some(ResponseError::UnknownLeaderEpoch),
        std::cmp::Ordering::Equal => None,
    }
}

/// (error code, leader epoch, end offset) for one partition.
async fn lookup(
    shard: &Rc<Shard>,
    topic: String,
    partition: i32,
    current: i32,
    requested: i32,
) -> (i16, i32, i64) {
    let unknown = (
        ResponseError::UnknownTopicOrPartition.code(),
        -1,
        UNDEFINED_OFFSET,
    );
    let image = shard.image();
    let Some(owner) = image.owner(&topic, partition, shard.shared.shards) else {
        let code = image.missing_partition_error(shard.config().node_id, &topic, partition);
        return (code, -1, UNDEFINED_OFFSET);
    };
    // The controller's leader epoch is the partition's current one, which its leader stamps
    // into the batches it appends.
    let leader_epoch = image
        .leader_of(&topic, partition)
        .map_or(LEADER_EPOCH, |(p, _)| LeaderEpoch(p.leader_epoch));
    if let Some(error) = fencing_error(current, leader_epoch.0) {
        return (error.code(), -1, UNDEFINED_OFFSET);
    }
    shard
        .invoke_on(owner, move |shard| async move {
            let Some(p) = shard.partition(&topic, partition) else {
                return unknown;
            };
            if let Err(code) = p.check_leader(-1) {
                return (code, -1, UNDEFINED_OFFSET);
            }
            let log_end_offset = p.log.log_end_offset();
            let mut epochs = p.log.leader_epochs();
            if epochs.last().is_none_or(|&(e, _)| e < leader_epoch) {
                epochs.push((leader_epoch, log_end_offset));
            }
            let (epoch, end) = end_offset_for(&epochs, log_end_offset, LeaderEpoch(requested));
            (0, epoch, end)
        })
        .await
}

pub async fn handle(
    shard: &Rc<Shard>,
    client: &super::Client,
    request: OffsetForLeaderEpochRequest,
) -> OffsetForLeaderEpochResponse {
    use super::authz::{self, operation};
    // The authorizer: a follower (replica id 0 or more) needs CLUSTER_ACTION, a consumer
    // DESCRIBE on each topic.
    let follower = request.replica_id.0 >= 0;
    let cluster_ok = !follower || authz::cluster(shard, client, operation::CLUSTER_ACTION);
    let mut response = OffsetForLeaderEpochResponse::default();
    for topic in request.topics {
        let mut t = OffsetForLeaderTopicResult::default().with_topic(topic.topic.clone());
        let allowed = cluster_ok
            && (follower || authz::topic(shard, client, operation::DESCRIBE, &topic.topic));
        for p in topic.partitions {
            let (code, epoch, end) = if !allowed {
                let code = if cluster_ok {
                    ResponseError::TopicAuthorizationFailed
                } else {
                    ResponseError::ClusterAuthorizationFailed
                };
                (code.code(), -1, -1)
            } else {
                lookup(
                    shard,
                    topic.topic.0.to_string(),
                    p.partition,
                    p.current_leader_epoch,
                    p.leader_epoch,
                )
                .await
            };
            t.partitions.push(
                EpochEndOffset::default()
                    .with_partition(p.partition)
                    .with_error_code(code)
                    .with_leader_epoch(epoch)
                    .with_end_offset(end),
            );
        }
        response.topics.push(t);
    }
    response
}

#[cfg(test)]
mod tests {
    use super::*;

    fn e(epoch: i32, start: i64) -> (LeaderEpoch, Offset) {
        (LeaderEpoch(epoch), Offset(start))
    }

    #[test]
    fn epoch_end_offsets_follow_kafkas_leader_epoch_cache() {
        let epochs = [e(0, 0), e(2, 10), e(5, 30)];
        let leo = Offset(42);
        let at = |epoch| end_offset_for(&epochs, leo, LeaderEpoch(epoch));
        assert_eq!(at(5), (5, 42), "the latest epoch ends at the log end");
        assert_eq!(at(0), (0, 10), "an epoch ends where the next starts");
        assert_eq!(
            at(1),
            (0, 10),
            "an epoch never led answers the one below it"
        );
        assert_eq!(at(3), (2, 30));
        assert_eq!(at(6), (-1, -1), "an epoch above the latest is unknown");
        assert_eq!(at(-1), (-1, -1), "no epoch");
        let later = [e(3, 100), e(4, 120)];
        assert_eq!(
            end_offset_for(&later, leo, LeaderEpoch(1)),
            (1, 100),
            "an epoch below the earliest ends where the earliest starts"
        );
        assert_eq!(end_offset_for(&[], leo, LeaderEpoch(0)), (-1, -1));
    }
}
