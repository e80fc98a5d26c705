//! DeleteRecords: move a partition's log start offset (the low watermark) forward; offset -1
//! means the high watermark.

use std::rc::Rc;

use kafka_protocol::messages::delete_records_response::{
    DeleteRecordsPartitionResult, DeleteRecordsTopicResult,
};
use kafka_protocol::messages::{DeleteRecordsRequest, DeleteRecordsResponse};
use kafka_protocol::ResponseError;
use sluice_engine::Offset;

use crate::errors::log_error_code;
use crate::shard::Shard;

pub async fn handle(shard: &Rc<Shard>, request: DeleteRecordsRequest) -> DeleteRecordsResponse {
    let mut response = DeleteRecordsResponse::default();
    for topic in request.topics {
        let name = topic.name.0.to_string();
        let mut t = DeleteRecordsTopicResult::default().with_name(topic.name.clone());
        for p in topic.partitions {
            let image = shard.image();
            let (code, low_watermark) = match image.owner(
                &name,
                p.partition_index,
                shard.shared.shards,
            ) {
                None => (
                    image.missing_partition_error(shard.config().node_id, &name, p.partition_index),
                    -1,
                ),
                Some(owner) => {
                    let (topic_name, partition, offset) =
                        (name.clone(), p.partition_index, p.offset);
                    shard
                        .invoke_on(owner, move |shard| async move {
                            let Some(part) = shard.partition(&topic_name, partition) else {
                                return (ResponseError::UnknownTopicOrPartition.code(), -1);
                            };
                            if let Err(code) = part.check_leader(-1) {
                                return (code, -1);
                            }
                            let hw = part.high_watermark();
                            let target = if offset == -1 { hw } else { Offset(offset) };
                            if target > hw || target.0 < 0 {
                                return (ResponseError::OffsetOutOfRange.code(), -1);
                            }
                            match part.log.delete_records(target).await {
                                Ok(start) => {
                                    tracing::info!(topic = %topic_name, partition, log_start_offset = start.0, "records deleted");
                                    (0, start.0)
                                }
                                Err(e) => (log_error_code(&e), -1),
                            }
                        })
                        .await
                }
            };
            t.partitions.push(
                DeleteRecordsPartitionResult::default()
                    .with_partition_index(p.partition_index)
                    .with_low_watermark(low_watermark)
                    .with_error_code(code),
            );
        }
        response.topics.push(t);
    }
    response
}
