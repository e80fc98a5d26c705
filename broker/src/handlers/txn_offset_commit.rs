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

use std::rc::Rc;

use kafka_protocol::messages::txn_offset_commit_response::{
    TxnOffsetCommitResponsePartition, TxnOffsetCommitResponseTopic,
};
use kafka_protocol::messages::{TxnOffsetCommitRequest, TxnOffsetCommitResponse};
use kafka_protocol::ResponseError;

use crate::group::{coordinator_shard, no_coordinator, Committed};
use crate::shard::Shard;

pub async fn handle(shard: &Rc<Shard>, request: TxnOffsetCommitRequest) -> TxnOffsetCommitResponse {
    let group_id = request.group_id.0.to_string();
    let image = shard.image();
    // A partition that does not exist is refused on its own, as in OffsetCommit.
    let known = |topic: &str, partition: i32| image.has_partition(topic, partition);
    let mut commits = Vec::new();
    for t in &request.topics {
        for p in &t.partitions {
            if !known(t.name.0.as_str(), p.partition_index) {
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
        None => no_coordinator(shard, &group_id),
        Some(owner) => {
            let member_id = request.member_id.to_string();
            let instance_id = request.group_instance_id.as_ref().map(|i| i.to_string());
            let generation = request.generation_id;
            let (producer_id, producer_epoch) = (request.producer_id.0, request.producer_epoch);
            shard
                .invoke_on(owner, move |s| async move {
                    let check = s.check_txn_commit(
                        &group_id,
                        &member_id,
                        instance_id.as_deref(),
                        generation,
                    );
                    if check != 0 {
                        return check;
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
                let code = if known(t.name.0.as_str(), p.partition_index) {
                    code
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
    response
}
