//! AddPartitionsToTxn from a transactional producer (versions 0 to 3: one transaction per
//! request): the coordinator of the transactional id (`crate::txn`) adds the partitions to the
//! ongoing transaction, durably, before the producer sends records to them. Partitions of
//! unknown topics are refused with UNKNOWN_TOPIC_OR_PARTITION and the others of the request are
//! not attempted (OPERATION_NOT_ATTEMPTED), as in Kafka.

use std::rc::Rc;

use kafka_protocol::messages::add_partitions_to_txn_response::{
    AddPartitionsToTxnPartitionResult, AddPartitionsToTxnTopicResult,
};
use kafka_protocol::messages::{AddPartitionsToTxnRequest, AddPartitionsToTxnResponse};
use kafka_protocol::ResponseError;

use crate::shard::Shard;
use crate::txn::{
    error_for_client, shard as txn_shard, TopicPartition, TransactionVersion, TxnResponse,
};

/// The first version whose clients know PRODUCER_FENCED (KIP-588).
const PRODUCER_FENCED_VERSION: i16 = 2;

pub async fn handle(
    shard: &Rc<Shard>,
    request: AddPartitionsToTxnRequest,
    version: i16,
) -> AddPartitionsToTxnResponse {
    let transactional_id = request.v3_and_below_transactional_id.0.to_string();
    let partitions: Vec<TopicPartition> = request
        .v3_and_below_topics
        .iter()
        .flat_map(|t| {
            t.partitions
                .iter()
                .map(|&p| TopicPartition::new(&t.name.0, p))
        })
        .collect();
    let image = shard.image();
    let unknown = |tp: &TopicPartition| {
        image
            .topics
            .get(&tp.topic)
            .is_none_or(|t| usize::try_from(tp.partition).map_or(true, |p| p >= t.shards.len()))
    };
    let codes: Vec<(TopicPartition, i16)> = if partitions.iter().any(unknown) {
        partitions
            .iter()
            .map(|tp| {
                let code = if unknown(tp) {
                    ResponseError::UnknownTopicOrPartition
                } else {
                    ResponseError::OperationNotAttempted
                };
                (tp.clone(), code.code())
            })
            .collect()
    } else {
        let error = match txn_shard::owner_of(shard, &transactional_id) {
            Err(e) => Some(e),
            Ok((owner, index)) => {
                let (producer_id, producer_epoch) = (
                    request.v3_and_below_producer_id,
                    request.v3_and_below_producer_epoch,
                );
                let asked = partitions.clone();
                let answer = shard
                    .invoke_on(owner, move |shard| async move {
                        txn_shard::run_request(&shard, index, |c, _, now| {
                            c.add_partitions(
                                &transactional_id,
                                producer_id,
                                producer_epoch,
                                &asked,
                                TransactionVersion::TV_0,
                                now,
                            )
                        })
                        .await
                    })
                    .await;
                match answer {
                    Ok(TxnResponse::AddPartitions { error }) => error,
                    Err(e) => Some(e),
                    Ok(other) => unreachable!("AddPartitionsToTxn answered {other:?}"),
                }
            }
        };
        let code =
            error_for_client(error, version >= PRODUCER_FENCED_VERSION).map_or(0, |e| e.code());
        partitions.iter().map(|tp| (tp.clone(), code)).collect()
    };
    let mut response = AddPartitionsToTxnResponse::default();
    for t in request.v3_and_below_topics {
        let results = t
            .partitions
            .iter()
            .map(|&p| {
                let code = codes
                    .iter()
                    .find(|(tp, _)| tp.topic == t.name.0.as_str() && tp.partition == p)
                    .map_or(0, |(_, c)| *c);
                AddPartitionsToTxnPartitionResult::default()
                    .with_partition_index(p)
                    .with_partition_error_code(code)
            })
            .collect();
        response.results_by_topic_v3_and_below.push(
            AddPartitionsToTxnTopicResult::default()
                .with_name(t.name)
                .with_results_by_partition(results),
        );
    }
    response
}
