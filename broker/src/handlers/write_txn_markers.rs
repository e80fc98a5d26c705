//! WriteTxnMarkers: a transaction coordinator has each partition leader of a transaction write
//! the transaction's end, a commit or abort marker (a control batch, see
//! `sluice_engine::batch::control_batch`). The marker is appended like an acks=all produce and
//! answered once the high watermark passed it, as Kafka appends markers with `requiredAcks=-1`.
//!
//! On a `__consumer_offsets` partition the marker also applies (commit) or drops (abort) the
//! offsets the transaction sent with TxnOffsetCommit, once the in-sync replicas have it.
//!
//! Appending the marker ends the producer's open transaction in that partition's producer state:
//! the last stable offset moves past it, and an abort is remembered so that read-committed
//! fetches list it. A marker from an older producer epoch than the partition knows is refused
//! (INVALID_PRODUCER_EPOCH): it comes from a coordinator that has since been fenced.

use std::rc::Rc;
use std::time::Duration;

use bytes::BytesMut;
use kafka_protocol::messages::write_txn_markers_response::{
    WritableTxnMarkerPartitionResult, WritableTxnMarkerResult, WritableTxnMarkerTopicResult,
};
use kafka_protocol::messages::{WriteTxnMarkersRequest, WriteTxnMarkersResponse};
use kafka_protocol::ResponseError;
use sluice_engine::Timestamp;

use super::errors::log_error_code;
use crate::shard::Shard;

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
                Timestamp(crate::txn::shard::wall_ms()),
            );
            // A transactional batch verified against the transaction this marker ends must not
            // land after it (KIP-890's verification guard).
            p.clear_txn_verification(marker.producer_id);
            match p.log.append(BytesMut::from(&batch[..]), leader_epoch).await {
                Ok(info) => {
                    // Read-committed fetches waiting here may read further now.
                    shard.notify_appended();
                    let code = p.wait_acks_all(info.last_offset.next(), MARKER_TIMEOUT).await;
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

pub async fn handle(shard: &Rc<Shard>, request: WriteTxnMarkersRequest) -> WriteTxnMarkersResponse {
    let mut response = WriteTxnMarkersResponse::default();
    for m in request.markers {
        let marker = Marker {
            producer_id: m.producer_id.0,
            producer_epoch: m.producer_epoch,
            commit: m.transaction_result,
            coordinator_epoch: m.coordinator_epoch,
        };
        // Every partition of the marker at once: they are on different shards and replicas.
        let mut writes = Vec::new();
        for t in &m.topics {
            for &p in &t.partition_indexes {
                let shard = shard.clone();
                let topic = t.name.0.to_string();
                writes.push(glommio::spawn_local(async move {
                    write_marker(&shard, topic, p, marker).await
                }));
            }
        }
        let mut codes = Vec::with_capacity(writes.len());
        for w in writes {
            codes.push(w.await);
        }
        let mut codes = codes.into_iter();
        let mut result = WritableTxnMarkerResult::default().with_producer_id(m.producer_id);
        for t in m.topics {
            let partitions = t
                .partition_indexes
                .iter()
                .map(|&p| {
                    WritableTxnMarkerPartitionResult::default()
                        .with_partition_index(p)
                        .with_error_code(codes.next().expect("one code per partition"))
                })
                .collect();
            result.topics.push(
                WritableTxnMarkerTopicResult::default()
                    .with_name(t.name)
                    .with_partitions(partitions),
            );
        }
        response.markers.push(result);
    }
    response
}
