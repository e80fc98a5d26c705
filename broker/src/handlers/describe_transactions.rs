//! DescribeTransactions (KIP-664): the state of transactional ids, answered by their
//! coordinator. Each id goes to the shard that owns its `__transaction_state` partition on this
//! node; an id whose partition another broker leads gets NOT_COORDINATOR (the admin client then
//! asks FindCoordinator and tries there), one whose partition is still loading
//! COORDINATOR_LOAD_IN_PROGRESS, and one the coordinator does not know
//! TRANSACTIONAL_ID_NOT_FOUND.

use std::rc::Rc;

use kafka_protocol::messages::describe_transactions_response::{TopicData, TransactionState};
use kafka_protocol::messages::{
    DescribeTransactionsRequest, DescribeTransactionsResponse, TopicName,
};
use kafka_protocol::protocol::StrBytes;
use kafka_protocol::ResponseError;

use crate::shard::txn as txn_shard;
use crate::shard::Shard;
use crate::txn::TxnDescription;

async fn describe_one(
    shard: &Rc<Shard>,
    transactional_id: String,
) -> Result<TxnDescription, ResponseError> {
    let (owner, index) = txn_shard::owner_of(shard, &transactional_id)?;
    shard
        .invoke_on(owner, move |shard| async move {
            txn_shard::with_coordinator(&shard, index, |c| c.describe(&transactional_id))?
        })
        .await
}

pub async fn handle(
    shard: &Rc<Shard>,
    request: DescribeTransactionsRequest,
) -> DescribeTransactionsResponse {
    let mut response = DescribeTransactionsResponse::default();
    for id in request.transactional_ids {
        let state = TransactionState::default().with_transactional_id(id.clone());
        let state = match describe_one(shard, id.0.to_string()).await {
            Ok(d) => state
                .with_transaction_state(StrBytes::from_static_str(d.state))
                .with_transaction_timeout_ms(d.transaction_timeout_ms)
                .with_transaction_start_time_ms(d.transaction_start_time_ms)
                .with_producer_id(d.producer_id)
                .with_producer_epoch(d.producer_epoch)
                .with_topics(
                    d.topics
                        .into_iter()
                        .map(|(topic, partitions)| {
                            TopicData::default()
                                .with_topic(TopicName(StrBytes::from_string(topic)))
                                .with_partitions(partitions)
                        })
                        .collect(),
                ),
            // The other fields keep their defaults (0 and empty), as in Kafka's answer.
            Err(e) => state.with_error_code(e.code()),
        };
        response.transaction_states.push(state);
    }
    response
}
