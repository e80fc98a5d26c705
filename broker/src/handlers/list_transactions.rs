//! ListTransactions (KIP-664): the transactions whose coordinators this broker hosts, asked of
//! every shard (each hosts the coordinators of the `__transaction_state` partitions it leads).
//! Filters: states by Kafka's names (unknown names are echoed back in
//! `unknown_state_filters`), producer ids, from v1 a minimum duration (KIP-994) and from v2 a
//! regular expression the whole transactional id must match (KIP-1152). The admin client asks
//! every broker and merges the answers.

use std::rc::Rc;

use kafka_protocol::messages::list_transactions_response::TransactionState;
use kafka_protocol::messages::{
    ListTransactionsRequest, ListTransactionsResponse, ProducerId, TransactionalId,
};
use kafka_protocol::protocol::StrBytes;
use kafka_protocol::ResponseError;

use crate::shard::txn::list_local;
use crate::shard::wall_ms;
use crate::shard::Shard;
use crate::txn::TxnState;

/// The `regex` crate's syntax is RE2's, which is what Kafka compiles the pattern with (RE2/J);
/// Kafka matches the whole id (`Matcher.matches`), hence the anchors.
fn compile_pattern(pattern: &str) -> Result<regex::Regex, ResponseError> {
    regex::Regex::new(&format!("^(?:{pattern})$"))
        .map_err(|_| ResponseError::InvalidRegularExpression)
}

pub async fn handle(
    shard: &Rc<Shard>,
    request: ListTransactionsRequest,
    version: i16,
) -> ListTransactionsResponse {
    let mut response = ListTransactionsResponse::default();
    let state_filters: Vec<String> = request
        .state_filters
        .iter()
        .map(|s| s.as_str().to_string())
        .collect();
    response.unknown_state_filters = request
        .state_filters
        .iter()
        .filter(|s| TxnState::from_name(s.as_str()).is_none())
        .cloned()
        .collect();
    let duration_filter_ms = if version >= 1 {
        request.duration_filter
    } else {
        -1
    };
    let pattern = match request
        .transactional_id_pattern
        .as_ref()
        .filter(|p| version >= 2 && !p.is_empty())
        .map(|p| compile_pattern(p.as_str()))
        .transpose()
    {
        Ok(p) => p,
        Err(e) => return response.with_error_code(e.code()),
    };
    let producer_id_filters = request.producer_id_filters;
    let now_ms = wall_ms();
    let per_shard = shard
        .invoke_on_all(move |s| {
            let producer_id_filters = producer_id_filters.clone();
            let state_filters = state_filters.clone();
            async move {
                list_local(
                    &s,
                    &producer_id_filters,
                    &state_filters,
                    duration_filter_ms,
                    now_ms,
                )
            }
        })
        .await;
    let mut listings = Vec::new();
    for answer in per_shard {
        match answer {
            Ok(l) => listings.extend(l),
            Err(e) => return response.with_error_code(e.code()),
        }
    }
    listings.sort_by(|a, b| a.transactional_id.cmp(&b.transactional_id));
    response.transaction_states = listings
        .into_iter()
        .filter(|l| {
            pattern
                .as_ref()
                .is_none_or(|p| p.is_match(&l.transactional_id))
        })
        .map(|l| {
            TransactionState::default()
                .with_transactional_id(TransactionalId(StrBytes::from_string(l.transactional_id)))
                .with_producer_id(ProducerId(l.producer_id.0))
                .with_transaction_state(StrBytes::from_static_str(l.state))
        })
        .collect();
    response
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_pattern_matches_whole_ids() {
        let p = compile_pattern("pay-.*").unwrap();
        assert!(p.is_match("pay-1"));
        assert!(!p.is_match("x-pay-1"));
        let p = compile_pattern("a|b").unwrap();
        assert!(p.is_match("a") && p.is_match("b") && !p.is_match("ab"));
        assert_eq!(
            compile_pattern("(").unwrap_err(),
            ResponseError::InvalidRegularExpression
        );
    }
}
