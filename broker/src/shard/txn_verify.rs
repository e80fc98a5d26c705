//! The partition leaders' side of KIP-890: before a transaction's first batch is appended to a
//! partition, or its offsets to a group's `__consumer_offsets` partition, the leader asks the
//! transactional id's coordinator about the partition.
//!
//! - Part 1 (every transaction version): *verify* that the partition is in the producer's
//!   ongoing transaction. A batch that is not (a late retry of an ended transaction, a client
//!   that never sent AddPartitionsToTxn) is refused, so it cannot open a transaction that no
//!   marker will end and hold the last stable offset back forever.
//! - Part 2 (`transaction.version` 2, Produce v12, TxnOffsetCommit v5): *add* the partition to
//!   the transaction on the producer's behalf, durably, in place of the client's
//!   AddPartitionsToTxn or AddOffsetsToTxn.
//!
//! The coordinator is asked on this node when it is here (on the shard that leads its
//! `__transaction_state` partition), else with AddPartitionsToTxn v5 (the brokers' form) on a
//! connection to the broker that leads it, as Kafka's `AddPartitionsToTxnManager` does.

use std::rc::Rc;
use std::time::Duration;

use futures_channel::oneshot;
use kafka_protocol::messages::add_partitions_to_txn_request::{
    AddPartitionsToTxnTopic, AddPartitionsToTxnTransaction,
};
use kafka_protocol::messages::{
    AddPartitionsToTxnRequest, ApiKey, ProducerId, RequestKind, ResponseKind, TopicName,
    TransactionalId,
};
use kafka_protocol::protocol::StrBytes;
use kafka_protocol::ResponseError;

use super::txn::{self as txn_shard, code_error};
use super::Shard;
use crate::txn::{TopicPartition, TransactionVersion, TxnResponse, TRANSACTION_STATE_TOPIC};

/// How long the coordinator on another broker may take to answer (Kafka's
/// `request.timeout.ms` default).
const REMOTE_TIMEOUT: Duration = Duration::from_secs(30);
/// The AddPartitionsToTxn version brokers send each other.
const BROKER_VERSION: i16 = 5;

/// What the leader asks of the coordinator.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Operation {
    /// Only check that the partition is in the ongoing transaction (part 1).
    Verify,
    /// Add it to the transaction if it is not yet (part 2, transaction version 2).
    Add,
}

/// Asks the coordinator of `transactional_id` to verify or add `partition` for the producer.
/// `None` once the partition is in the transaction; else the coordinator's error as it answers
/// a partition leader (TRANSACTION_ABORTABLE: not in the transaction; PRODUCER_FENCED,
/// INVALID_PRODUCER_ID_MAPPING, CONCURRENT_TRANSACTIONS, ...), or why it could not be asked
/// (NOT_COORDINATOR, COORDINATOR_NOT_AVAILABLE, COORDINATOR_LOAD_IN_PROGRESS,
/// NETWORK_EXCEPTION). [`error_for_produce`] turns it into a Produce answer.
pub async fn verify_or_add(
    shard: &Rc<Shard>,
    transactional_id: String,
    producer_id: i64,
    producer_epoch: i16,
    partition: TopicPartition,
    operation: Operation,
) -> Option<ResponseError> {
    // A node that holds a replica of the id's `__transaction_state` partition has an owner
    // shard for it, but only its leader coordinates: a follower's coordinator answers
    // NOT_COORDINATOR, and the leader is asked over the network then.
    let local_answer = match txn_shard::owner_of(shard, &transactional_id) {
        Ok((owner, index)) => {
            let (transactional_id, partition) = (transactional_id.clone(), partition.clone());
            shard
                .invoke_on(owner, move |shard| async move {
                    local(
                        &shard,
                        index,
                        &transactional_id,
                        producer_id,
                        producer_epoch,
                        vec![partition],
                        operation,
                    )
                    .await
                    .pop()
                    .and_then(|(_, e)| e)
                })
                .await
        }
        Err(e) => Some(e),
    };
    match local_answer {
        Some(ResponseError::NotCoordinator) => {
            remote(
                shard,
                transactional_id,
                producer_id,
                producer_epoch,
                partition,
                operation,
            )
            .await
        }
        other => other,
    }
}

/// On the shard that leads the id's `__transaction_state` partition `index`: the outcome for
/// each of `partitions` (an added set is one record, so one outcome for all).
pub async fn local(
    shard: &Rc<Shard>,
    index: i32,
    transactional_id: &str,
    producer_id: i64,
    producer_epoch: i16,
    partitions: Vec<TopicPartition>,
    operation: Operation,
) -> Vec<(TopicPartition, Option<ResponseError>)> {
    let all = |partitions: Vec<TopicPartition>, e: Option<ResponseError>| {
        partitions.into_iter().map(|p| (p, e)).collect()
    };
    match operation {
        Operation::Verify => {
            let verified = txn_shard::with_coordinator(shard, index, |c| {
                c.verify_partitions(
                    transactional_id,
                    ProducerId(producer_id),
                    producer_epoch,
                    &partitions,
                )
            });
            match verified {
                Ok(results) => results,
                Err(e) => all(partitions, Some(e)),
            }
        }
        Operation::Add => {
            let error = add(
                shard,
                index,
                transactional_id,
                producer_id,
                producer_epoch,
                partitions.clone(),
            )
            .await;
            all(partitions, error)
        }
    }
}

/// An add waiting for the one in flight for its transactional id.
pub struct WaitingAdd {
    producer_id: i64,
    producer_epoch: i16,
    partitions: Vec<TopicPartition>,
    answer: oneshot::Sender<Option<ResponseError>>,
}

/// Adds `partitions` to the transaction. The leaders of a transaction's partitions ask at
/// about the same time (one Produce request spans many partitions), and the coordinator takes
/// one change per transactional id at a time: adds that arrive while one is in flight wait
/// and then go together in the next record, instead of being refused with
/// CONCURRENT_TRANSACTIONS one by one. The adds of an id are made by one detached task, so
/// that a caller going away (its connection closed) never leaves the others waiting.
async fn add(
    shard: &Rc<Shard>,
    index: i32,
    transactional_id: &str,
    producer_id: i64,
    producer_epoch: i16,
    partitions: Vec<TopicPartition>,
) -> Option<ResponseError> {
    let (answer, rx) = oneshot::channel();
    let start_driver = {
        let mut waiting = shard.txns.adds_waiting.borrow_mut();
        let queue = waiting.entry(transactional_id.to_string());
        let start = matches!(queue, std::collections::hash_map::Entry::Vacant(_));
        queue.or_default().push(WaitingAdd {
            producer_id,
            producer_epoch,
            partitions,
            answer,
        });
        start
    };
    if start_driver {
        glommio::spawn_local(drive_adds(
            shard.clone(),
            index,
            transactional_id.to_string(),
        ))
        .detach();
    }
    rx.await.unwrap_or(Some(ResponseError::NotCoordinator))
}

/// Makes the waiting adds of `transactional_id`, one record per producer id and epoch, until
/// none waits; then the id has no add in flight.
async fn drive_adds(shard: Rc<Shard>, index: i32, transactional_id: String) {
    loop {
        let mut queued = take_waiting(&shard, &transactional_id);
        if queued.is_empty() {
            shard
                .txns
                .adds_waiting
                .borrow_mut()
                .remove(&transactional_id);
            return;
        }
        while !queued.is_empty() {
            let (producer_id, producer_epoch) = (queued[0].producer_id, queued[0].producer_epoch);
            let (same, rest): (Vec<_>, Vec<_>) = queued
                .into_iter()
                .partition(|w| w.producer_id == producer_id && w.producer_epoch == producer_epoch);
            let mut partitions: Vec<TopicPartition> = Vec::new();
            for w in &same {
                for p in &w.partitions {
                    if !partitions.contains(p) {
                        partitions.push(p.clone());
                    }
                }
            }
            let error = add_now(
                &shard,
                index,
                &transactional_id,
                producer_id,
                producer_epoch,
                &partitions,
            )
            .await;
            for w in same {
                let _ = w.answer.send(error);
            }
            queued = rest;
        }
    }
}

fn take_waiting(shard: &Shard, transactional_id: &str) -> Vec<WaitingAdd> {
    shard
        .txns
        .adds_waiting
        .borrow_mut()
        .get_mut(transactional_id)
        .map(std::mem::take)
        .unwrap_or_default()
}

async fn add_now(
    shard: &Rc<Shard>,
    index: i32,
    transactional_id: &str,
    producer_id: i64,
    producer_epoch: i16,
    partitions: &[TopicPartition],
) -> Option<ResponseError> {
    let answer = txn_shard::run_request(shard, index, |c, _, now| {
        c.add_partitions(
            transactional_id,
            ProducerId(producer_id),
            producer_epoch,
            partitions,
            TransactionVersion::TV_2,
            now,
        )
    })
    .await;
    match answer {
        Ok(TxnResponse::AddPartitions { error }) => error,
        Err(e) => Some(e),
        Ok(other) => unreachable!("AddPartitionsToTxn answered {other:?}"),
    }
}

/// AddPartitionsToTxn v5 to the broker that leads the id's `__transaction_state` partition.
async fn remote(
    shard: &Rc<Shard>,
    transactional_id: String,
    producer_id: i64,
    producer_epoch: i16,
    partition: TopicPartition,
    operation: Operation,
) -> Option<ResponseError> {
    let index = crate::txn::partition_for(
        &transactional_id,
        shard.config().transaction_state_log_partitions,
    );
    let addr = shard
        .image()
        .leader_of(TRANSACTION_STATE_TOPIC, index)
        .and_then(|(info, broker)| {
            (info.leader >= 0)
                .then_some(broker)
                .flatten()
                .filter(|b| !b.fenced)
                .map(|b| b.address_on(shard.config().inter_broker_listener()))
        });
    let Some(addr) = addr else {
        return Some(ResponseError::CoordinatorNotAvailable);
    };
    let request = AddPartitionsToTxnRequest::default().with_transactions(vec![
        AddPartitionsToTxnTransaction::default()
            .with_transactional_id(TransactionalId(StrBytes::from_string(
                transactional_id.clone(),
            )))
            .with_producer_id(ProducerId(producer_id))
            .with_producer_epoch(producer_epoch)
            .with_verify_only(operation == Operation::Verify)
            .with_topics(vec![AddPartitionsToTxnTopic::default()
                .with_name(TopicName(StrBytes::from_string(partition.topic.clone())))
                .with_partitions(vec![partition.partition])]),
    ]);
    let frame = match crate::codec::encode_request(
        ApiKey::AddPartitionsToTxn,
        BROKER_VERSION,
        1,
        &RequestKind::AddPartitionsToTxn(request),
    ) {
        Ok(frame) => frame,
        Err(e) => {
            tracing::error!(error = %e, "could not encode AddPartitionsToTxn");
            return Some(ResponseError::UnknownServerError);
        }
    };
    let body = match crate::peer::call(
        crate::peer::Route::InterBroker,
        &addr,
        frame,
        REMOTE_TIMEOUT,
    )
    .await
    {
        Ok(body) => body,
        Err(e) => {
            tracing::debug!(%addr, error = %e, "AddPartitionsToTxn to the transaction coordinator failed");
            return Some(ResponseError::NetworkException);
        }
    };
    let response =
        match crate::codec::decode_response(ApiKey::AddPartitionsToTxn, BROKER_VERSION, body) {
            Ok(ResponseKind::AddPartitionsToTxn(r)) => r,
            _ => return Some(ResponseError::UnknownServerError),
        };
    if response.error_code != 0 {
        return Some(code_error(response.error_code));
    }
    let code = response
        .results_by_transaction
        .iter()
        .find(|t| t.transactional_id.0.as_str() == transactional_id)
        .and_then(|t| {
            t.topic_results
                .iter()
                .find(|r| r.name.0.as_str() == partition.topic)
        })
        .and_then(|r| {
            r.results_by_partition
                .iter()
                .find(|p| p.partition_index == partition.partition)
        })
        .map_or(ResponseError::UnknownServerError.code(), |p| {
            p.partition_error_code
        });
    (code != 0).then(|| code_error(code))
}

/// The first Produce version whose clients know TRANSACTION_ABORTABLE (KIP-890).
pub const PRODUCE_ABORTABLE_VERSION: i16 = 11;
/// The first Produce version a transaction version 2 client sends (KIP-890 part 2).
pub const PRODUCE_ADD_VERSION: i16 = 12;

/// The Produce answer for a failed verification, as Kafka's leaders give it: the coordinator's
/// passing troubles become NOT_ENOUGH_REPLICAS, which every producer retries without a
/// metadata refresh; a fenced producer gets INVALID_PRODUCER_EPOCH; "not in the transaction"
/// is TRANSACTION_ABORTABLE for clients that know it and INVALID_TXN_STATE before.
pub fn error_for_produce(error: ResponseError, client_knows_abortable: bool) -> ResponseError {
    use ResponseError::*;
    match error {
        ConcurrentTransactions
        | NetworkException
        | CoordinatorLoadInProgress
        | CoordinatorNotAvailable
        | NotCoordinator => NotEnoughReplicas,
        ProducerFenced => InvalidProducerEpoch,
        TransactionAbortable if !client_knows_abortable => InvalidTxnState,
        other => other,
    }
}
