//! Produce: each partition's batch goes to the shard that owns the partition; the response
//! waits until every append is as durable as its topic's `flush.mode` says. With one replica,
//! acks=1 and acks=all both mean that; acks=0 gets no response at all.

use std::rc::Rc;

use bytes::{Bytes, BytesMut};
use kafka_protocol::messages::produce_response::{PartitionProduceResponse, TopicProduceResponse};
use kafka_protocol::messages::{ProduceRequest, ProduceResponse};
use kafka_protocol::protocol::StrBytes;
use kafka_protocol::ResponseError;
use sluice_engine::LeaderEpoch;

use super::errors::log_error_code;
use crate::shard::Shard;

struct Outcome {
    error_code: i16,
    error_message: Option<String>,
    base_offset: i64,
    log_append_time_ms: i64,
    log_start_offset: i64,
}

impl Outcome {
    fn error(code: i16, message: Option<String>) -> Outcome {
        Outcome {
            error_code: code,
            error_message: message,
            base_offset: -1,
            log_append_time_ms: -1,
            log_start_offset: -1,
        }
    }
}

async fn append_on_owner(
    shard: &Rc<Shard>,
    topic: String,
    partition: i32,
    records: Option<Bytes>,
) -> Outcome {
    let Some(owner) = shard.image().owner(&topic, partition, shard.shared.shards) else {
        return Outcome::error(ResponseError::UnknownTopicOrPartition.code(), None);
    };
    let Some(records) = records else {
        return Outcome::error(
            ResponseError::InvalidRecord.code(),
            Some("no records".into()),
        );
    };
    shard
        .invoke_on(owner, move |shard| async move {
            let Some(p) = shard.partition(&topic, partition) else {
                return Outcome::error(ResponseError::UnknownTopicOrPartition.code(), None);
            };
            // One copy: the log stamps offsets into its own buffer, the request frame is shared.
            match p
                .log
                .append(BytesMut::from(&records[..]), LeaderEpoch(0))
                .await
            {
                Ok(info) => {
                    shard.notify_appended();
                    Outcome {
                        error_code: 0,
                        error_message: None,
                        base_offset: info.base_offset.0,
                        log_append_time_ms: info.log_append_time.0,
                        log_start_offset: info.log_start_offset.0,
                    }
                }
                Err(e) => {
                    tracing::warn!(topic = %topic, partition, error = %e, "produce refused");
                    Outcome::error(log_error_code(&e), Some(e.to_string()))
                }
            }
        })
        .await
}

/// Returns `None` for acks=0: Kafka sends no response then.
pub async fn handle(
    shard: &Rc<Shard>,
    request: ProduceRequest,
    version: i16,
) -> Option<ProduceResponse> {
    let acks = request.acks;
    let mut tasks = Vec::new();
    for topic in request.topic_data {
        let name = topic.name.0.to_string();
        for p in topic.partition_data {
            let shard = shard.clone();
            let name = name.clone();
            let index = p.index;
            let task = if !matches!(acks, -1..=1) {
                None
            } else {
                Some(glommio::spawn_local(async move {
                    append_on_owner(&shard, name, index, p.records).await
                }))
            };
            tasks.push((topic.name.clone(), index, task));
        }
    }
    let mut response = ProduceResponse::default();
    for (name, index, task) in tasks {
        let outcome = match task {
            Some(t) => t.await,
            None => Outcome::error(
                ResponseError::InvalidRequiredAcks.code(),
                Some(format!("acks={acks} is not -1, 0 or 1")),
            ),
        };
        let mut pr = PartitionProduceResponse::default()
            .with_index(index)
            .with_error_code(outcome.error_code)
            .with_base_offset(outcome.base_offset)
            .with_log_append_time_ms(outcome.log_append_time_ms);
        if version >= 5 {
            pr.log_start_offset = outcome.log_start_offset;
        }
        if version >= 8 {
            pr.error_message = outcome.error_message.map(StrBytes::from_string);
        }
        match response.responses.iter_mut().find(|t| t.name == name) {
            Some(t) => t.partition_responses.push(pr),
            None => response.responses.push(
                TopicProduceResponse::default()
                    .with_name(name)
                    .with_partition_responses(vec![pr]),
            ),
        }
    }
    if acks == 0 {
        None
    } else {
        Some(response)
    }
}
