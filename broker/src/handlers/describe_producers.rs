//! DescribeProducers (KIP-664): the idempotent producers each partition remembers, answered by
//! the partition's owner shard from the log's producer state.
//!
//! A producer's open transaction in the partition shows as the offset it started at (-1: none),
//! with the coordinator epoch of the producer's last marker (-1: unknown, see the engine's
//! `ProducerEntry::coordinator_epoch`), which `kafka-transactions abort` sends back in its
//! WriteTxnMarkers.

use std::rc::Rc;

use kafka_protocol::messages::describe_producers_response::{
    PartitionResponse, ProducerState, TopicResponse,
};
use kafka_protocol::messages::{DescribeProducersRequest, DescribeProducersResponse, ProducerId};
use kafka_protocol::protocol::StrBytes;
use kafka_protocol::ResponseError;
use sluice_engine::producer_state::ActiveProducer;

use crate::shard::Shard;

/// What Kafka says when the topic is unknown (an unknown partition of a known topic gets the
/// same code with no message).
const NOT_HOSTED: &str = "This server does not host this topic-partition.";

async fn producers(shard: &Rc<Shard>, topic: &str, partition: i32) -> Option<Vec<ActiveProducer>> {
    let owner = shard.image().owner(topic, partition, shard.shared.shards)?;
    let topic = topic.to_string();
    shard
        .invoke_on(owner, move |shard| async move {
            Some(shard.partition(&topic, partition)?.log.active_producers())
        })
        .await
}

pub async fn handle(
    shard: &Rc<Shard>,
    request: DescribeProducersRequest,
) -> DescribeProducersResponse {
    let mut response = DescribeProducersResponse::default();
    for topic in request.topics {
        let name = topic.name.0.to_string();
        let known_topic = shard.image().topics.contains_key(&name);
        let mut t = TopicResponse::default().with_name(topic.name.clone());
        for p in topic.partition_indexes {
            let mut result = PartitionResponse::default().with_partition_index(p);
            match producers(shard, &name, p).await {
                Some(active) => {
                    result.active_producers = active
                        .into_iter()
                        .map(|a| {
                            ProducerState::default()
                                .with_producer_id(ProducerId(a.producer_id))
                                .with_producer_epoch(a.producer_epoch as i32)
                                .with_last_sequence(a.last_sequence)
                                .with_last_timestamp(a.last_timestamp.0)
                                .with_coordinator_epoch(a.coordinator_epoch)
                                .with_current_txn_start_offset(a.current_txn_start_offset)
                        })
                        .collect();
                }
                None => {
                    result.error_code = ResponseError::UnknownTopicOrPartition.code();
                    if !known_topic {
                        result.error_message = Some(StrBytes::from_static_str(NOT_HOSTED));
                    }
                }
            }
            t.partitions.push(result);
        }
        response.topics.push(t);
    }
    response
}
