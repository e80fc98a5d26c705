//! AddOffsetsToTxn: a transactional producer about to send a group's offsets with its
//! transaction (`sendOffsetsToTransaction`) has the coordinator add the group's
//! `__consumer_offsets` partition to the transaction, so that the transaction's markers reach
//! it. The second half is TxnOffsetCommit to the group coordinator (`txn_offset_commit.rs`).

use std::rc::Rc;

use kafka_protocol::messages::{AddOffsetsToTxnRequest, AddOffsetsToTxnResponse};
use kafka_protocol::ResponseError;

use crate::shard::txn as txn_shard;
use crate::shard::Shard;
use crate::txn::{error_for_client, TxnResponse};

/// The first version whose clients know PRODUCER_FENCED (KIP-588).
const PRODUCER_FENCED_VERSION: i16 = 2;

fn error(code: ResponseError, version: i16) -> AddOffsetsToTxnResponse {
    let code = error_for_client(Some(code), version >= PRODUCER_FENCED_VERSION).unwrap_or(code);
    AddOffsetsToTxnResponse::default().with_error_code(code.code())
}

pub async fn handle(
    shard: &Rc<Shard>,
    request: AddOffsetsToTxnRequest,
    version: i16,
) -> AddOffsetsToTxnResponse {
    let transactional_id = request.transactional_id.0.to_string();
    let (owner, index) = match txn_shard::owner_of(shard, &transactional_id) {
        Ok(found) => found,
        Err(e) => return error(e, version),
    };
    // The group's offsets partition, placed as the group coordinator places the group.
    let offsets_partition = crate::group::offsets_topic::partition_for(
        &request.group_id.0,
        shard.config().offsets_topic_partitions,
    );
    let (producer_id, producer_epoch) = (request.producer_id, request.producer_epoch);
    let answer = shard
        .invoke_on(owner, move |shard| async move {
            txn_shard::run_request(&shard, index, |c, _, now| {
                c.add_offsets(
                    &transactional_id,
                    producer_id,
                    producer_epoch,
                    offsets_partition,
                    now,
                )
            })
            .await
        })
        .await;
    match answer {
        Ok(TxnResponse::AddOffsets { error: None }) => AddOffsetsToTxnResponse::default(),
        Ok(TxnResponse::AddOffsets { error: Some(e) }) | Err(e) => error(e, version),
        Ok(other) => unreachable!("AddOffsetsToTxn answered {other:?}"),
    }
}
