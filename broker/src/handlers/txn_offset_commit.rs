//! TxnOffsetCommit: the second half of a transactional producer's `sendOffsetsToTransaction`
//! (after AddOffsetsToTxn put the group's `__consumer_offsets` partition into the
//! transaction). The group coordinator appends the offsets as the producer's transactional
//! batch and keeps them pending: the transaction's commit marker applies them, its abort
//! marker drops them (`Shard::complete_txn_offsets`), so the consumed offsets and the
//! produced output become visible together or not at all.
//!
//! v3+ carries the consumer's group metadata (KIP-447): a producer whose consumer was fenced
//! from the group (an old generation, an unknown member, a replaced static member) is refused
//! as in OffsetCommit. v0-2 carry none and are checked against nothing.
//!
//! Before the offsets are kept pending, the transaction coordinator verifies that the group's
//! partition is in the transaction (KIP-890 part 1); v5 clients at transaction version 2 send
//! no AddOffsetsToTxn, and the coordinator adds the partition then (part 2).

use std::rc::Rc;

use kafka_protocol::messages::txn_offset_commit_response::{
    TxnOffsetCommitResponsePartition, TxnOffsetCommitResponseTopic,
};
use kafka_protocol::messages::{TxnOffsetCommitRequest, TxnOffsetCommitResponse};
use kafka_protocol::ResponseError;

use crate::group::{offsets_topic, Committed};
use crate::shard::groups::{coordinator_shard, no_coordinator};
use crate::shard::txn_verify as verify;
use crate::shard::Shard;
use crate::txn::TopicPartition;

/// The first version whose clients know TRANSACTION_ABORTABLE (KIP-890).
const ABORTABLE_VERSION: i16 = 4;
/// The first version of transaction version 2 clients, which send no AddOffsetsToTxn.
const ADD_VERSION: i16 = 5;

/// The answer for a failed verification of the group's partition, in the errors the
/// TxnOffsetCommit clients retry (the coordinator's troubles: find the coordinator again) or
/// know.
fn verification_error(error: ResponseError, version: i16) -> ResponseError {
    use ResponseError::*;
    match error {
        NetworkException
        | CoordinatorLoadInProgress
        | CoordinatorNotAvailable
        | NotCoordinator
        | NotEnoughReplicas => CoordinatorNotAvailable,
        ProducerFenced => InvalidProducerEpoch,
        TransactionAbortable if version < ABORTABLE_VERSION => InvalidTxnState,
        other => other,
    }
}

pub async fn handle(
    shard: &Rc<Shard>,
    client: &super::Client,
    mut request: TxnOffsetCommitRequest,
    version: i16,
) -> TxnOffsetCommitResponse {
    use super::authz::{self, operation};
    let group_id = request.group_id.0.to_string();
    let image = shard.image();
    // The authorizer, as for OffsetCommit: READ on the group and on each topic.
    let group_allowed = authz::group(shard, client, operation::READ, &group_id);
    // Named by id (OffsetCommit 10, TxnOffsetCommit 6): the ids this image knows become names.
    let by_id = version >= 6;
    if by_id {
        for t in &mut request.topics {
            crate::codec::topic_ids::resolve(&image, &mut t.name);
        }
    }
    // A partition that does not exist is refused on its own, as in OffsetCommit.
    let known = |topic: &str, partition: i32| image.has_partition(topic, partition);
    let topics_allowed = authz::topics_allowed(
        shard,
        client,
        operation::READ,
        request.topics.iter().map(|t| &t.name),
    );
    let allowed = |topic: &str| topics_allowed.contains(topic);
    let mut commits = Vec::new();
    for t in &request.topics {
        for p in &t.partitions {
            if !known(t.name.0.as_str(), p.partition_index) || !allowed(t.name.0.as_str()) {
                continue;
            }
            commits.push((
                (t.name.0.to_string(), p.partition_index),
                Committed {
                    offset: p.committed_offset,
                    leader_epoch: p.committed_leader_epoch,
                    metadata: p
                        .committed_metadata
                        .as_ref()
                        .map(|m| m.to_string())
                        .unwrap_or_default(),
                },
            ));
        }
    }
    let code = match coordinator_shard(shard, &group_id) {
        _ if !group_allowed => ResponseError::GroupAuthorizationFailed.code(),
        None => no_coordinator(shard, &group_id),
        Some(owner) => {
            let member_id = request.member_id.to_string();
            let instance_id = request.group_instance_id.as_ref().map(|i| i.to_string());
            let generation = request.generation_id;
            let (producer_id, producer_epoch) = (request.producer_id.0, request.producer_epoch);
            let transactional_id = request.transactional_id.0.to_string();
            shard
                .invoke_on(owner, move |s| async move {
                    let check = s.groups.check_txn_commit(
                        &group_id,
                        &member_id,
                        instance_id.as_deref(),
                        generation,
                    );
                    if check != 0 {
                        return check;
                    }
                    // KIP-890: the group's partition must be in the transaction (verified), or
                    // at transaction version 2 is added to it here, before offsets are pending
                    // on it.
                    let index = offsets_topic::partition_for(
                        &group_id,
                        s.config().offsets_topic_partitions,
                    );
                    let add = version >= ADD_VERSION && s.transaction_version() >= 2;
                    let verifying = add || s.config().transaction_partition_verification_enable;
                    let guard = match s.partition(offsets_topic::OFFSETS_TOPIC, index) {
                        Some(p)
                            if verifying
                                && !p.log.producer_in_transaction(producer_id, producer_epoch)
                                && !p.txn_verified(producer_id, producer_epoch) =>
                        {
                            let operation = if add {
                                verify::Operation::Add
                            } else {
                                verify::Operation::Verify
                            };
                            let guard = p.start_txn_verification(producer_id, producer_epoch);
                            let tp = TopicPartition::new(offsets_topic::OFFSETS_TOPIC, index);
                            if let Some(e) = verify::verify_or_add(
                                &s,
                                transactional_id,
                                producer_id,
                                producer_epoch,
                                tp,
                                operation,
                            )
                            .await
                            {
                                return verification_error(e, version).code();
                            }
                            Some((p, guard))
                        }
                        _ => None,
                    };
                    // With no await before the offsets are appended: a marker since the
                    // verification started ended the transaction.
                    if let Some((p, guard)) = guard {
                        if let Err(e) = p.finish_txn_verification(producer_id, guard) {
                            return e.code();
                        }
                    }
                    match s
                        .store_txn_offsets(&group_id, producer_id, producer_epoch, commits)
                        .await
                    {
                        Ok(()) => 0,
                        Err(code) => code,
                    }
                })
                .await
        }
    };
    if code != 0 {
        tracing::debug!(group = %request.group_id.0, producer_id = request.producer_id.0, code, "transactional offset commit refused");
    }
    let mut response = TxnOffsetCommitResponse::default();
    for t in request.topics {
        let partitions = t
            .partitions
            .iter()
            .map(|p| {
                let code = if !group_allowed {
                    code
                } else if !allowed(t.name.0.as_str()) {
                    ResponseError::TopicAuthorizationFailed.code()
                } else if known(t.name.0.as_str(), p.partition_index) {
                    code
                } else if by_id && crate::codec::topic_ids::is_unknown_id(&t.name.0) {
                    ResponseError::UnknownTopicId.code()
                } else {
                    ResponseError::UnknownTopicOrPartition.code()
                };
                TxnOffsetCommitResponsePartition::default()
                    .with_partition_index(p.partition_index)
                    .with_error_code(code)
            })
            .collect();
        response.topics.push(
            TxnOffsetCommitResponseTopic::default()
                .with_name(t.name)
                .with_partitions(partitions),
        );
    }
    if by_id {
        for t in &mut response.topics {
            crate::codec::topic_ids::to_placeholder(&image, &mut t.name);
        }
    }
    response
}
