//! EndTxn: a transactional producer commits or aborts its transaction. The coordinator of the
//! transactional id (`crate::txn`) makes PrepareCommit/PrepareAbort durable, answers, and then
//! has the markers written to every partition of the transaction before completing it. With
//! v5 (transaction version 2) the end bumps the producer epoch, and the markers carry the new
//! epoch, so a zombie of the ended transaction can no longer write.

use std::rc::Rc;

use kafka_protocol::messages::{EndTxnRequest, EndTxnResponse, ProducerId};
use kafka_protocol::ResponseError;

use crate::shard::txn as txn_shard;
use crate::shard::Shard;
use crate::txn::{error_for_client, TransactionVersion, TxnResponse, TxnResult};

/// The first version whose clients know PRODUCER_FENCED (KIP-588).
const PRODUCER_FENCED_VERSION: i16 = 2;
/// The first version of transaction version 2 clients (KIP-890 part 2).
const TV2_VERSION: i16 = 5;

fn error(code: ResponseError, version: i16) -> EndTxnResponse {
    let code = error_for_client(Some(code), version >= PRODUCER_FENCED_VERSION).unwrap_or(code);
    EndTxnResponse::default()
        .with_error_code(code.code())
        .with_producer_id(ProducerId(-1))
        .with_producer_epoch(-1)
}

pub async fn handle(shard: &Rc<Shard>, request: EndTxnRequest, version: i16) -> EndTxnResponse {
    let transactional_id = request.transactional_id.0.to_string();
    let (owner, index) = match txn_shard::owner_of(shard, &transactional_id) {
        Ok(found) => found,
        Err(e) => return error(e, version),
    };
    let result = if request.committed {
        TxnResult::Commit
    } else {
        TxnResult::Abort
    };
    let (producer_id, producer_epoch) = (request.producer_id, request.producer_epoch);
    // Version 5 is a transaction version 2 client's (KIP-890): every end bumps the epoch and
    // the response carries the producer id and epoch to go on with. Older versions get -1.
    let client_transaction_version = if version >= TV2_VERSION {
        TransactionVersion::TV_2
    } else {
        TransactionVersion::TV_0
    };
    let answer = shard
        .invoke_on(owner, move |shard| async move {
            txn_shard::run_request(&shard, index, |c, ids, now| {
                c.end_txn(
                    &transactional_id,
                    producer_id,
                    producer_epoch,
                    result,
                    client_transaction_version,
                    ids,
                    now,
                )
            })
            .await
        })
        .await;
    match answer {
        Ok(TxnResponse::EndTxn {
            error: None,
            producer_id,
            producer_epoch,
        }) => EndTxnResponse::default()
            .with_producer_id(producer_id)
            .with_producer_epoch(producer_epoch),
        Ok(TxnResponse::EndTxn { error: Some(e), .. }) | Err(e) => error(e, version),
        Ok(other) => unreachable!("EndTxn answered {other:?}"),
    }
}
