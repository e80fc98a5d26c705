//! InitProducerId. Without a transactional id (an idempotent producer): a fresh producer id
//! from this broker's block of ids (the controller hands blocks out), or, for a producer that
//! re-initialises (KIP-360), the same id with the next epoch. With one: the transaction
//! coordinator of the id (`crate::txn`) gives the producer id and a new epoch, fencing earlier
//! producers with that id and aborting their open transaction.

use std::rc::Rc;

use kafka_protocol::messages::{InitProducerIdRequest, InitProducerIdResponse, ProducerId};
use kafka_protocol::ResponseError;

use crate::shard::txn as txn_shard;
use crate::shard::Shard;
use crate::txn::{error_for_client, expected_producer, TxnResponse};

/// The first version whose clients know PRODUCER_FENCED (KIP-588).
const PRODUCER_FENCED_VERSION: i16 = 4;

fn error(code: ResponseError) -> InitProducerIdResponse {
    InitProducerIdResponse::default()
        .with_error_code(code.code())
        .with_producer_id(ProducerId(-1))
        .with_producer_epoch(-1)
}

pub async fn handle(
    shard: &Rc<Shard>,
    request: InitProducerIdRequest,
    version: i16,
) -> InitProducerIdResponse {
    if let Some(id) = request
        .transactional_id
        .as_ref()
        .map(|t| t.0.to_string())
        .filter(|t| !t.is_empty())
    {
        return transactional(shard, request, id, version).await;
    }
    let mut response = InitProducerIdResponse::default();
    if request.producer_id.0 >= 0
        && request.producer_epoch >= 0
        && request.producer_epoch < i16::MAX - 1
    {
        response.producer_id = request.producer_id;
        response.producer_epoch = request.producer_epoch + 1;
        return response;
    }
    let allocated = shard
        .next_producer_id()
        .await
        .ok_or_else(|| "no producer-id block from the controller".to_string());
    match allocated {
        Ok(id) => {
            response.producer_id = ProducerId(id);
            response.producer_epoch = 0;
        }
        Err(e) => {
            tracing::error!(error = %e, "could not allocate a producer id");
            return error(ResponseError::CoordinatorNotAvailable);
        }
    }
    response
}

async fn transactional(
    shard: &Rc<Shard>,
    request: InitProducerIdRequest,
    transactional_id: String,
    version: i16,
) -> InitProducerIdResponse {
    let expected = match expected_producer(request.producer_id, request.producer_epoch) {
        Ok(expected) => expected,
        Err(e) => return error(e),
    };
    let (owner, index) = match txn_shard::owner_of(shard, &transactional_id) {
        Ok(found) => found,
        Err(e) => return error(e),
    };
    let timeout_ms = request.transaction_timeout_ms;
    let answer = shard
        .invoke_on(owner, move |shard| async move {
            txn_shard::run_request(&shard, index, |c, ids, now| {
                c.init_producer_id(&transactional_id, timeout_ms, expected, ids, now)
            })
            .await
        })
        .await;
    match answer {
        Ok(TxnResponse::InitProducerId {
            error: None,
            producer_id,
            producer_epoch,
        }) => InitProducerIdResponse::default()
            .with_producer_id(producer_id)
            .with_producer_epoch(producer_epoch),
        Ok(TxnResponse::InitProducerId { error: Some(e), .. }) | Err(e) => {
            let e = error_for_client(Some(e), version >= PRODUCER_FENCED_VERSION).unwrap_or(e);
            error(e)
        }
        Ok(other) => unreachable!("InitProducerId answered {other:?}"),
    }
}
