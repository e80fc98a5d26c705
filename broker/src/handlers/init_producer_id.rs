//! InitProducerId for idempotent producers: a fresh producer id from this broker's block of
//! ids (the controller hands blocks out), or, for a producer that re-initialises (KIP-360), the same id with the next epoch.
//! Transactional ids are not supported yet and are refused.

use std::rc::Rc;

use kafka_protocol::messages::{InitProducerIdRequest, InitProducerIdResponse, ProducerId};
use kafka_protocol::ResponseError;

use crate::shard::Shard;

pub async fn handle(shard: &Rc<Shard>, request: InitProducerIdRequest) -> InitProducerIdResponse {
    let mut response = InitProducerIdResponse::default();
    if request
        .transactional_id
        .as_ref()
        .is_some_and(|t| !t.0.is_empty())
    {
        tracing::info!(
            "InitProducerId with a transactional id refused: transactions are not implemented"
        );
        response.error_code = ResponseError::TransactionalIdAuthorizationFailed.code();
        response.producer_id = ProducerId(-1);
        response.producer_epoch = -1;
        return response;
    }
    if request.producer_id.0 >= 0
        && request.producer_epoch >= 0
        && request.producer_epoch < i16::MAX - 1
    {
        response.producer_id = request.producer_id;
        response.producer_epoch = request.producer_epoch + 1;
        return response;
    }
    let allocated = crate::cluster::next_producer_id(shard)
        .await
        .ok_or_else(|| "no producer-id block from the controller".to_string());
    match allocated {
        Ok(id) => {
            response.producer_id = ProducerId(id);
            response.producer_epoch = 0;
        }
        Err(e) => {
            tracing::error!(error = %e, "could not allocate a producer id");
            response.error_code = ResponseError::CoordinatorNotAvailable.code();
            response.producer_id = ProducerId(-1);
            response.producer_epoch = -1;
        }
    }
    response
}
