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
//!
//! Version 2 adds each marker's transaction version (KIP-890), past the codec's versions: the
//! request is read as version 1's without it (`v2_as_v1`), its answer is version 1's. A marker
//! is checked the same at every transaction version here: the epoch it carries is the one its
//! coordinator wrote the transaction's end at.

use std::rc::Rc;

use kafka_protocol::messages::write_txn_markers_response::{
    WritableTxnMarkerPartitionResult, WritableTxnMarkerResult, WritableTxnMarkerTopicResult,
};
use kafka_protocol::messages::{WriteTxnMarkersRequest, WriteTxnMarkersResponse};

use crate::shard::markers::{write_marker, Marker};
use crate::shard::Shard;

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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::codec::versions::v2_as_v1;
    use bytes::{BufMut, BytesMut};
    use kafka_protocol::messages::write_txn_markers_request::{
        WritableTxnMarker, WritableTxnMarkerTopic,
    };
    use kafka_protocol::messages::{ProducerId, TopicName};
    use kafka_protocol::protocol::{Decodable, Encodable, StrBytes};

    #[test]
    fn version_2_reads_as_version_1_without_the_transaction_version() {
        let marker = |epoch: i32| {
            WritableTxnMarker::default()
                .with_producer_id(ProducerId(7))
                .with_producer_epoch(3)
                .with_transaction_result(true)
                .with_topics(vec![WritableTxnMarkerTopic::default()
                    .with_name(TopicName(StrBytes::from_static_str("t")))
                    .with_partition_indexes(vec![0, 2])])
                .with_coordinator_epoch(epoch)
        };
        let v1 = WriteTxnMarkersRequest::default().with_markers(vec![marker(5), marker(6)]);
        let mut encoded = BytesMut::new();
        v1.encode(&mut encoded, 1).unwrap();
        // Version 2's bytes: after each coordinator epoch (5, then 6), a transaction version.
        let mut v2 = BytesMut::new();
        let mut at = 0;
        for epoch in [5i32, 6] {
            let end = at
                + encoded[at..]
                    .windows(4)
                    .position(|w| w == epoch.to_be_bytes())
                    .expect("the coordinator epoch")
                + 4;
            v2.put_slice(&encoded[at..end]);
            v2.put_u8(2);
            at = end;
        }
        v2.put_slice(&encoded[at..]);
        let whole = v2.freeze();
        let mut read = v2_as_v1(&mut whole.clone()).unwrap();
        assert_eq!(WriteTxnMarkersRequest::decode(&mut read, 1).unwrap(), v1);
        for cut in 0..whole.len() {
            assert!(v2_as_v1(&mut whole.slice(..cut)).is_err(), "{cut}");
        }
    }
}
