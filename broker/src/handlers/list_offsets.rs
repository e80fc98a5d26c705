//! ListOffsets: earliest, latest, max-timestamp and by-timestamp lookups, answered by the
//! partition's owner shard. "Latest" is what a consumer can read: the high watermark, or for
//! `isolation_level=read_committed` the last stable offset, which also bounds what the other
//! lookups may answer, as in Kafka.

use std::rc::Rc;

use kafka_protocol::messages::list_offsets_response::{
    ListOffsetsPartitionResponse, ListOffsetsTopicResponse,
};
use kafka_protocol::messages::{ListOffsetsRequest, ListOffsetsResponse};
use kafka_protocol::ResponseError;
use sluice_engine::Timestamp;

use crate::errors::log_error_code;
use crate::shard::Shard;

pub const LATEST: i64 = -1;
pub const EARLIEST: i64 = -2;
pub const MAX_TIMESTAMP: i64 = -3;
pub const EARLIEST_LOCAL: i64 = -4;
pub const LATEST_TIERED: i64 = -5;
/// KIP-1023: the first offset not yet uploaded to remote storage (ListOffsets v11).
pub const EARLIEST_PENDING_UPLOAD: i64 = -6;

/// (error code, timestamp, offset, leader epoch of the offset)
pub async fn lookup(
    shard: &Rc<Shard>,
    topic: String,
    partition: i32,
    timestamp: i64,
    read_committed: bool,
) -> (i16, i64, i64, i32) {
    let image = shard.image();
    let Some(owner) = image.owner(&topic, partition, shard.shared.shards) else {
        let code = image.missing_partition_error(shard.config().node_id, &topic, partition);
        return (code, -1, -1, -1);
    };
    shard
        .invoke_on(owner, move |shard| async move {
            let Some(p) = shard.partition(&topic, partition) else {
                return (ResponseError::UnknownTopicOrPartition.code(), -1, -1, -1);
            };
            if let Err(code) = p.check_leader(-1) {
                return (code, -1, -1, -1);
            }
            let log = &p.log;
            let hw = p.high_watermark();
            let hw = if read_committed {
                log.first_unstable_offset(hw)
                    .map_or(hw, |first| first.min(hw))
            } else {
                hw
            }
            .0;
            let found = match timestamp {
                LATEST => Ok(Some((hw, -1))),
                // Nothing is tiered: there is no tiered offset and nothing waits for an upload,
                // as Kafka answers for a topic without remote storage.
                LATEST_TIERED | EARLIEST_PENDING_UPLOAD => return (0, -1, -1, -1),
                EARLIEST | EARLIEST_LOCAL => Ok(Some((log.log_start_offset().0, -1))),
                MAX_TIMESTAMP => log
                    .max_timestamp_offset()
                    .await
                    .map(|o| o.map(|(o, t)| (o.0, t.0))),
                t if t >= 0 => log
                    .offset_for_timestamp(Timestamp(t))
                    .await
                    .map(|o| o.map(|(o, t)| (o.0, t.0))),
                _ => return (ResponseError::InvalidRequest.code(), -1, -1, -1),
            };
            match found {
                Ok(Some((offset, ts))) if offset <= hw => (0, ts, offset, epoch_of(log, offset)),
                Ok(_) => (0, -1, -1, -1),
                Err(e) => (log_error_code(&e), -1, -1, -1),
            }
        })
        .await
}

/// The leader epoch of the batch holding `offset` (for the log end, of the last batch), as Kafka
/// answers it, so a consumer that checks its position by OffsetForLeaderEpoch finds it inside
/// that epoch. The current epoch when the log holds no epoch yet.
fn epoch_of(log: &sluice_engine::Log<sluice_engine::DmaStorage>, offset: i64) -> i32 {
    let epochs = log.leader_epochs();
    let i = epochs.partition_point(|&(_, start)| start.0 <= offset);
    if i == 0 {
        return epochs.first().map_or(0, |(e, _)| e.0);
    }
    epochs[i - 1].0 .0
}

/// The first version that may ask for `timestamp`; an older request asking for it is answered
/// UNSUPPORTED_VERSION for that partition, as Kafka does.
fn first_version(timestamp: i64) -> i16 {
    match timestamp {
        MAX_TIMESTAMP => 7,
        EARLIEST_LOCAL => 8,
        LATEST_TIERED => 9,
        EARLIEST_PENDING_UPLOAD => 11,
        _ => 0,
    }
}

pub async fn handle(
    shard: &Rc<Shard>,
    client: &super::Client,
    request: ListOffsetsRequest,
    version: i16,
) -> ListOffsetsResponse {
    use super::authz::{self, operation};
    let mut response = ListOffsetsResponse::default();
    for topic in request.topics {
        let mut t = ListOffsetsTopicResponse::default().with_name(topic.name.clone());
        // The authorizer: DESCRIBE on the topic.
        let allowed = authz::topic(shard, client, operation::DESCRIBE, &topic.name);
        for p in topic.partitions {
            let (code, ts, offset, epoch) = if !allowed {
                (ResponseError::TopicAuthorizationFailed.code(), -1, -1, -1)
            } else if version < first_version(p.timestamp) {
                (ResponseError::UnsupportedVersion.code(), -1, -1, -1)
            } else {
                lookup(
                    shard,
                    topic.name.0.to_string(),
                    p.partition_index,
                    p.timestamp,
                    request.isolation_level == 1,
                )
                .await
            };
            let mut pr = ListOffsetsPartitionResponse::default()
                .with_partition_index(p.partition_index)
                .with_error_code(code)
                .with_timestamp(ts)
                .with_offset(offset);
            if version >= 4 {
                // The epoch of the offset found; none when there is no offset.
                pr.leader_epoch = if code == 0 && offset >= 0 { epoch } else { -1 };
            }
            t.partitions.push(pr);
        }
        response.topics.push(t);
    }
    response
}
