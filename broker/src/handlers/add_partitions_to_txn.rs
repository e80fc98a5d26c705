//! AddPartitionsToTxn from a transactional producer (versions 0 to 3: one transaction per
//! request): the coordinator of the transactional id (`crate::txn`) adds the partitions to the
//! ongoing transaction, durably, before the producer sends records to them. Partitions of
//! unknown topics are refused with UNKNOWN_TOPIC_OR_PARTITION and the others of the request are
//! not attempted (OPERATION_NOT_ATTEMPTED), as in Kafka.
//!
//! Versions 4 and 5 are the partition leaders' (KIP-890, `crate::txn::verify`): several
//! transactions per request, each either verified (`verify_only`: is every partition already in
//! the ongoing transaction?) or added on the producer's behalf (transaction version 2), with a
//! result per transaction and partition.

use std::rc::Rc;

use kafka_protocol::messages::add_partitions_to_txn_response::{
    AddPartitionsToTxnPartitionResult, AddPartitionsToTxnResult, AddPartitionsToTxnTopicResult,
};
use kafka_protocol::messages::{AddPartitionsToTxnRequest, AddPartitionsToTxnResponse};
use kafka_protocol::ResponseError;

use crate::shard::txn as txn_shard;
use crate::shard::txn_verify as verify;
use crate::shard::Shard;
use crate::txn::{error_for_client, TopicPartition, TransactionVersion, TxnResponse};

/// The first version whose clients know PRODUCER_FENCED (KIP-588).
const PRODUCER_FENCED_VERSION: i16 = 2;

/// The first version of the leaders' batched form.
const BROKER_VERSION: i16 = 4;

pub async fn handle(
    shard: &Rc<Shard>,
    client: &super::Client,
    request: AddPartitionsToTxnRequest,
    version: i16,
) -> AddPartitionsToTxnResponse {
    use super::authz::{self, operation};
    if version >= BROKER_VERSION {
        // Sent by brokers (KIP-890): CLUSTER_ACTION.
        if !authz::cluster(shard, client, operation::CLUSTER_ACTION) {
            return AddPartitionsToTxnResponse::default()
                .with_error_code(ResponseError::ClusterAuthorizationFailed.code());
        }
        return handle_batched(shard, request).await;
    }
    // The authorizer: WRITE on the transactional id, then on each topic; if a topic is
    // refused, the others are not attempted, as in Kafka.
    let txn_allowed = authz::transactional_id(
        shard,
        client,
        operation::WRITE,
        request.v3_and_below_transactional_id.0.as_str(),
    );
    let refused_topics: Vec<String> = request
        .v3_and_below_topics
        .iter()
        .filter(|t| txn_allowed && !authz::topic(shard, client, operation::WRITE, &t.name))
        .map(|t| t.name.0.to_string())
        .collect();
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
    let codes: Vec<(TopicPartition, i16)> = if !txn_allowed {
        let code = ResponseError::TransactionalIdAuthorizationFailed.code();
        partitions.iter().map(|tp| (tp.clone(), code)).collect()
    } else if !refused_topics.is_empty() {
        partitions
            .iter()
            .map(|tp| {
                let code = if refused_topics.contains(&tp.topic) {
                    ResponseError::TopicAuthorizationFailed
                } else {
                    ResponseError::OperationNotAttempted
                };
                (tp.clone(), code.code())
            })
            .collect()
    } else if partitions.iter().any(unknown) {
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

/// Versions 4+: each transaction on its own (concurrently), every partition of a transaction
/// answered with the transaction's outcome.
async fn handle_batched(
    shard: &Rc<Shard>,
    request: AddPartitionsToTxnRequest,
) -> AddPartitionsToTxnResponse {
    let mut tasks = Vec::new();
    for t in &request.transactions {
        let shard = shard.clone();
        let transactional_id = t.transactional_id.0.to_string();
        let (producer_id, producer_epoch) = (t.producer_id.0, t.producer_epoch);
        let operation = if t.verify_only {
            verify::Operation::Verify
        } else {
            verify::Operation::Add
        };
        let partitions: Vec<TopicPartition> = t
            .topics
            .iter()
            .flat_map(|topic| {
                topic
                    .partitions
                    .iter()
                    .map(|&p| TopicPartition::new(&topic.name.0, p))
            })
            .collect();
        tasks.push(glommio::spawn_local(async move {
            let owner = txn_shard::owner_of(&shard, &transactional_id);
            let (owner, index) = match owner {
                Ok(found) => found,
                Err(e) => return partitions.into_iter().map(|p| (p, Some(e))).collect(),
            };
            shard
                .invoke_on(owner, move |shard| async move {
                    verify::local(
                        &shard,
                        index,
                        &transactional_id,
                        producer_id,
                        producer_epoch,
                        partitions,
                        operation,
                    )
                    .await
                })
                .await
        }));
    }
    let mut response = AddPartitionsToTxnResponse::default();
    for (t, task) in request.transactions.into_iter().zip(tasks) {
        let results: Vec<(TopicPartition, Option<ResponseError>)> = task.await;
        let mut topic_results: Vec<AddPartitionsToTxnTopicResult> = Vec::new();
        for topic in t.topics {
            let by_partition = topic
                .partitions
                .iter()
                .map(|&index| {
                    let code = results
                        .iter()
                        .find(|(tp, _)| tp.topic == topic.name.0.as_str() && tp.partition == index)
                        .and_then(|(_, e)| e.map(|e| e.code()))
                        .unwrap_or(0);
                    AddPartitionsToTxnPartitionResult::default()
                        .with_partition_index(index)
                        .with_partition_error_code(code)
                })
                .collect();
            topic_results.push(
                AddPartitionsToTxnTopicResult::default()
                    .with_name(topic.name)
                    .with_results_by_partition(by_partition),
            );
        }
        response.results_by_transaction.push(
            AddPartitionsToTxnResult::default()
                .with_transactional_id(t.transactional_id)
                .with_topic_results(topic_results),
        );
    }
    response
}
