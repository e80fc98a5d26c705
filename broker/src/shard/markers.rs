//! Transaction markers as a partition's leader writes them: for WriteTxnMarkers from another
//! broker's coordinator, and for this broker's own coordinator (`txn.rs`).

use std::rc::Rc;
use std::time::Duration;

use bytes::BytesMut;
use kafka_protocol::ResponseError;
use sluice_engine::Timestamp;

use super::Shard;
use crate::errors::log_error_code;

/// How long a marker waits for the in-sync replicas, as Kafka's `request.timeout.ms` default.
const MARKER_TIMEOUT: Duration = Duration::from_secs(30);

/// What one partition's leader must write.
#[derive(Clone, Copy, Debug)]
pub struct Marker {
    pub producer_id: i64,
    pub producer_epoch: i16,
    pub commit: bool,
    pub coordinator_epoch: i32,
}

/// Appends `marker` to `topic`-`partition` on its owner shard, which must lead it, and waits
/// until every in-sync replica has it. Returns the error code (0: written).
pub async fn write_marker(shard: &Rc<Shard>, topic: String, partition: i32, marker: Marker) -> i16 {
    let image = shard.image();
    let Some(owner) = image.owner(&topic, partition, shard.shared.shards) else {
        return image.missing_partition_error(shard.config().node_id, &topic, partition);
    };
    shard
        .invoke_on(owner, move |shard| async move {
            let Some(p) = shard.partition(&topic, partition) else {
                return ResponseError::UnknownTopicOrPartition.code();
            };
            let leader_epoch = match p.check_leader(-1) {
                Ok(epoch) => epoch,
                Err(code) => return code,
            };
            let batch = sluice_engine::batch::control_batch(
                marker.producer_id,
                marker.producer_epoch,
                marker.commit,
                marker.coordinator_epoch,
                // Wall-clock time, as Kafka stamps markers: DescribeProducers reports it as the
                // producer's last timestamp, and `kafka-transactions find-hanging` ages
                // transactions by it.
                Timestamp(super::wall_ms()),
            );
            // A transactional batch verified against the transaction this marker ends must not
            // land after it (KIP-890's verification guard).
            p.clear_txn_verification(marker.producer_id);
            match p.log.append(BytesMut::from(&batch[..]), leader_epoch).await {
                Ok(info) => {
                    // Read-committed fetches waiting here may read further now.
                    shard.notify_appended();
                    let code = p.wait_acks_all(leader_epoch, info.last_offset.next(), MARKER_TIMEOUT).await;
                    if code != 0 {
                        tracing::warn!(%topic, partition, code, producer_id = marker.producer_id, "transaction marker not acknowledged by the in-sync replicas");
                    } else {
                        if topic == crate::group::offsets_topic::OFFSETS_TOPIC {
                            // The transaction's offsets (TxnOffsetCommit) apply or go.
                            shard.complete_txn_offsets(partition, marker.producer_id, marker.commit);
                        }
                        tracing::debug!(%topic, partition, producer_id = marker.producer_id, commit = marker.commit, offset = info.base_offset.0, "transaction marker written");
                    }
                    code
                }
                Err(e) => {
                    tracing::warn!(%topic, partition, producer_id = marker.producer_id, error = %e, "transaction marker refused");
                    log_error_code(&e)
                }
            }
        })
        .await
}
